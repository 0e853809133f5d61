"""Detection tables of matrix v1 beside matrix v2, from audit JSONs scored against v2.

    python3 -m benchmarks.conform_tables AUDIT.json [AUDIT.json ...]

Each JSON must hold `cell_results` (the default of `requant audit --json`) and have been
scored against matrix v2. The check outcomes of a cell do not depend on the matrix (each
check is a pure function of the two runs), so v1's scorecard and detection table are
recomputed exactly by rescoring the same cell outcomes, C8 dropped, against the pinned v1
matrix (audit.catalogue.scoring.Scorer). Same counting rules in both: observable cells only in the
denominators; "detected" = some applicable per-layer check of the matrix fired.
Prints Markdown: per file, the scorecards and one table with v1 and v2 side by side.
"""

from __future__ import annotations

import json
import sys

from requant.audit.catalogue.faults import VARIANT_BY_ID
from requant.audit.catalogue.matrix import MATRIX_PATH, MATRIX_V2_PATH, load_matrix
from requant.audit.catalogue.scoring import CellResult, Scorer
from requant.io.markdown import table as markdown_table
from requant.regime import REGIMES

SEVERITIES = ("one", "1pct", "all")


def rescore(doc: dict, path) -> dict:
    m = load_matrix(path)
    scorer = Scorer(m)
    variants = {v for _, v, _ in m.cells}
    for r in doc["cell_results"]:
        if r["variant"] not in variants:  # v1 has no baseline row for the fused-scale order
            continue
        v = VARIANT_BY_ID.get(r["variant"])
        fam, sev = (v.family, v.severity) if v else ("B", "none")
        outcomes = {c: o for c, o in r["outcomes"].items() if c in m.checks}
        scorer.add(
            CellResult(
                r["layer"],
                r["regime"],
                r["variant"],
                fam,
                sev,
                r["observable"],
                r["mismatches"],
                r["max_ulp"],
                outcomes,
                [],
            )
        )
    return scorer.summary()


def table(v1: dict, v2: dict) -> list[str]:
    d1 = {(d["fault"], d["severity"], d["regime"]): d for d in v1["detection"]}
    d2 = {(d["fault"], d["severity"], d["regime"]): d for d in v2["detection"]}
    cols = [(s, r) for s in SEVERITIES for r in REGIMES]
    rows = [
        [
            fam,
            name,
            *(
                "" if (fam, s, r) not in d else f"{d[(fam, s, r)]['detected']}/{d[(fam, s, r)]['observable']}"
                for s, r in cols
            ),
        ]
        for fam in sorted({k[0] for k in d2})
        for name, d in (("v1", d1), ("v2", d2))
    ]
    return markdown_table(["fault", "matrix", *(f"{s} {r}" for s, r in cols)], rows)


def main(paths: list[str]) -> int:
    for p in paths:
        doc = json.load(open(p))
        v1, v2 = rescore(doc, MATRIX_PATH), rescore(doc, MATRIX_V2_PATH)
        print(f"## {p}: {doc['checkpoint']} with {','.join(doc['backends'])} on {doc['device']}\n")
        print(f"per layer: {doc['per_layer_summary']['line']}; cells: {doc['cells']}\n")
        for name, s in (("v1", v1), ("v2", v2)):
            c = s["scorecard"]
            print(
                f"- matrix {name} ({'pinned' if c['matrix_pinned'] else 'NOT PINNED'}): FP {c['false_positives']}, "
                f"FN {c['false_negatives']}, applicability mismatches {c['applicability_mismatches']}"
            )
        base = ", ".join(
            f"{b['variant']} {b['regime']}: C8 fired {b['outcomes']['C8']['fire']}/{b['cells']}" for b in v2["baseline"]
        )
        print(f"- baseline rows (v2): {base}\n")
        print("\n".join(table(v1, v2)) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
