"""Audit outputs: the JSON (the record), a Markdown summary (for people), and two PNG plots
(detection heat map, ULP histograms per fault family), drawn with matplotlib's Agg backend
so they render on a headless machine.
"""

from __future__ import annotations

import math
from pathlib import Path

from requant.audit.checks import CHECK_TITLES, LAYER_CHECK_IDS
from requant.audit.faults import FAMILY_TITLES, VARIANTS
from requant.audit.matrix import PINNED_SHA256, PINS, REGIMES
from requant.audit.report_phases import decode_markdown, injection_markdown, plot_injection
from requant.audit.scoring import HIST_BINS, bin_label
from requant.evidence.identity import markdown_lines as identity_lines
from requant.io.output import json_bytes, write_files_atomic, write_json_atomic
from requant.models.tokenizer import summary as tokenizer_summary


def matrix_warning(result: dict) -> str | None:
    card = result["scorecard"]
    if card.get("matrix_pinned"):
        return None
    pin = PINS.get(card.get("matrix_version"), PINNED_SHA256)
    return (
        f"WARNING: the prediction matrix digest {card['matrix_sha256']} is NOT the pinned {pin}; "
        "this run was scored against an unpinned matrix."
    )


def scope_note(result: dict) -> str:
    """What the scorecard is evidence of, and what it is not (said in every report)."""
    pair = " and ".join(f"`{b}`" for b in result["backends"])
    return (
        "**What the scorecard proves.** The faults are injected into emulations of the W8A8 pipeline (the exact "
        "reference with one step changed), not into CUTLASS or Triton; the real pair (" + pair + ") is compared per "
        "layer and end to end. C1 to C4 cannot fire on a real kernel run: C1 and C2 hash the very operands the suite "
        "hands to both sides, C3 reads a declared accumulator descriptor, and C4 needs an accumulator the kernel "
        "exposes (the real backends expose none). So 0 false positives and 0 false negatives mean that the checks "
        "behave as the prediction matrix says on the emulated faults; they are not a claim about CUTLASS or Triton "
        "themselves."
    )


def pow2_native_note(result: dict) -> str | None:
    """What power-of-two native scales mean for the reading (None when no layer has them)."""
    n, layers = result.get("native_scales_all_pow2_layers") or 0, result.get("layers") or 0
    if not n:
        return None
    why = (
        "C5 (power-of-two identity) then applies under native, where the matrix predicts not_applicable: "
        "each such native cell counts as an applicability mismatch, a fact about the checkpoint, "
        "neither a false positive nor a false negative"
    )
    if n == layers:
        return f"native scales are already powers of two: native = pow2 (the native rows repeat pow2). {why}."
    return f"{n}/{layers} layers already have power-of-two native scales. {why}."


def write_json(result: dict, path: Path) -> Path:
    return write_json_atomic(path, result)


def _table(header: list[str], rows: list[list]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return out


def markdown(result: dict, command: str | None = None) -> str:
    card = result["scorecard"]
    lines = ["# requant audit", ""]
    warn = matrix_warning(result)
    if warn:
        lines += [f"**{warn}**", ""]
    if command:
        lines += ["```bash", command, "```", ""]
    lines += [
        f"- checkpoint: `{result['checkpoint']}`",
        f"- backends: `{result['backends'][0]}` vs `{result['backends'][1]}` on `{result['device']}`",
        *[
            f"- `{n}` (MODULE:FUNCTION) declares `{c['order']}` ({c['source']}{': ' + c['verdict'] if c.get('verdict') else ''})"
            for n, c in (result.get("custom_kernels") or {}).items()
        ],
        f"- prompts: {result['prompts']} ({result['tokens']} tokens); tokenizer: {tokenizer_summary(result['tokenizer'])}",
        f"- quantized Linears: {result['layers']}; cells: {result['cells']} ({result['variants']} variants x {len(result['regimes'])} regimes)",
        f"- prediction matrix sha256: `{card['matrix_sha256']}` ({'pinned' if card['matrix_pinned'] else 'NOT PINNED'}, version {card['matrix_version']})",
        *identity_lines(result),
        f"- wall time: {result['wall_seconds']} s",
        "",
    ]
    conv = result.get("converted")
    if conv:
        lines += [
            f"**Converted checkpoint, arm `{conv['arm']}`**{'' if conv.get('servable', True) else ' (NOT servable: an ablation)'}: "
            f"{conv['regimes']}."
            + (
                ""
                if conv.get("scales_all_power_of_two", True)
                else " **Warning: some stored scales are not powers of two, although the provenance names a converted arm.**"
            ),
            "",
        ]
    lines += [
        "## Per-layer comparison of the pair",
        "",
        f"**{result['per_layer_summary']['line']}**",
        "",
    ]
    s = result["per_layer_summary"]
    lines += _table(
        ["regime", "layers bitwise equal", "mismatching elements", "elements", "max ULP"],
        [
            [r, f"{s[r]['bitwise_equal']}/{s[r]['layers']}", s[r]["mismatches"], s[r]["elements"], s[r]["max_ulp"]]
            for r in REGIMES
        ],
    )
    note = pow2_native_note(result)
    if note:
        lines += ["", f"Note: {note}"]
    differing = [r for r in result["per_layer"] if not r["bitwise_equal"]]
    if differing:
        lines += ["", "Layers that differ:", ""]
        lines += _table(
            ["layer", "regime", "mismatches", "max ULP"],
            [[r["name"], r["regime"], r["mismatches"], r["max_ulp"]] for r in differing],
        )
    lines += [
        "",
        "## Scorecard against the prediction matrix",
        "",
        f"- false positives: **{card['false_positives']}**",
        f"- false negatives: **{card['false_negatives']}**",
        f"- applicability mismatches: {card['applicability_mismatches']}",
        "",
        scope_note(result),
        "",
    ]
    if card["contradictions"]:
        lines += ["Contradictions:", ""]
        lines += _table(
            ["kind", "check", "variant", "regime", "expected", "got", "cells", "example layers"],
            [
                [
                    c["kind"],
                    c["check"],
                    c["variant"],
                    c["regime"],
                    c["expected"],
                    c["got"],
                    c["count"],
                    ", ".join(c["example_layers"]),
                ]
                for c in card["contradictions"]
            ],
        )
        lines += [""]
    lines += ["## Detection (observable cells; detected = some applicable check fired)", ""]
    rows = []
    for d in result["detection"]:
        by = ", ".join(f"{c}:{n}" for c, n in d["by_check"].items() if n)
        rows.append(
            [
                d["variant"],
                d["regime"],
                d["cells"],
                d["observable"],
                d["detected"],
                by or "-",
                d["max_ulp"],
                "yes" if d["predicted_detected"] else "no",
            ]
        )
    lines += _table(
        ["variant", "regime", "cells", "observable", "detected", "by check", "max ULP", "predicted detected"], rows
    )
    lines += ["", "## Baseline rows (each backend of the pair as the kernel under test, no fault)", ""]
    brows = []
    for b in result["baseline"]:
        fired = ", ".join(f"{c}:{o['fire']}" for c, o in b["outcomes"].items() if o["fire"]) or "none"
        na = ", ".join(c for c, o in b["outcomes"].items() if o["not_applicable"]) or "-"
        brows.append([b["variant"], b["regime"], b["cells"], b["differing_cells"], b["max_ulp"], fired, na])
    lines += _table(
        ["row", "regime", "layers", "layers differing from reference", "max ULP", "checks fired", "not applicable"],
        brows,
    )
    lines += ["", "## Largest distance per fault family (bf16 spacings)", ""]
    lines += _table(
        ["fault", "what", "max ULP"], [[f, FAMILY_TITLES[f], u] for f, u in result["max_ulp_by_fault"].items()]
    )
    lines += ["", "## End to end (C7: tokens whose top-1 margin is below the largest logit deviation)", ""]
    lines += _table(
        [
            "regime",
            "tokens",
            "flagged",
            "top-1 disagreements",
            "logits bitwise equal",
            "max deviation",
            "outcome",
            "expected",
        ],
        [
            [
                r,
                e["tokens"],
                e["flagged"],
                e["top1_disagreements"],
                e["bitwise_equal"],
                e["max_deviation"],
                e["outcome"],
                e["expected"] or "no claim",
            ]
            for r, e in result["end_to_end"].items()
        ],
    )
    lines += [""] + decode_markdown(result) + injection_markdown(result)
    lines += ["Checks: " + "; ".join(f"{c} {t}" for c, t in CHECK_TITLES.items()), ""]
    return "\n".join(lines)


def plot_heatmap(result: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    det = {(d["variant"], d["regime"]): d for d in result["detection"]}
    checks = list(result["detection"][0]["by_check"]) if result["detection"] else list(LAYER_CHECK_IDS)
    cols = [(r, c) for r in REGIMES for c in checks]
    data = np.full((len(VARIANTS), len(cols)), np.nan)
    for i, v in enumerate(VARIANTS):
        for j, (r, c) in enumerate(cols):
            d = det.get((v.id, r))
            if d and d["observable"]:
                data[i, j] = d["by_check"][c] / d["observable"]
    fig, ax = plt.subplots(figsize=(10, 9))
    cmap = matplotlib.colormaps["viridis"].with_extremes(bad="#dddddd")
    im = ax.imshow(np.ma.masked_invalid(data), cmap=cmap, vmin=0, vmax=1, aspect="auto")
    ax.set_xticks(range(len(cols)), [f"{c}\n{r}" for r, c in cols], fontsize=8)
    ax.set_yticks(range(len(VARIANTS)), [v.id for v in VARIANTS], fontsize=8)
    for i in range(data.shape[0]):
        for j in range(data.shape[1]):
            if not math.isnan(data[i, j]):
                ax.text(
                    j,
                    i,
                    f"{data[i, j]:.2f}",
                    ha="center",
                    va="center",
                    fontsize=6,
                    color="w" if data[i, j] < 0.5 else "k",
                )
    ax.axvline(len(checks) - 0.5, color="k", lw=1)
    ax.set_title("fraction of observable cells in which each check fired (grey: no observable cell)")
    fig.colorbar(im, ax=ax, shrink=0.6)
    fig.tight_layout()
    fig.savefig(path, dpi=110, format="png")
    plt.close(fig)
    return path


def plot_histograms(result: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fams = list(FAMILY_TITLES)
    labels = [bin_label(b) for b in range(HIST_BINS)]
    fig, axes = plt.subplots(3, 3, figsize=(13, 10))
    for ax, fam in zip(axes.flat, fams):
        h = result["ulp_histograms"].get(fam, {})
        last = max([labels.index(k) for r in REGIMES for k in h.get(r, {})] + [0])
        x = np.arange(last + 1)
        for off, r in ((-0.2, "native"), (0.2, "pow2")):
            ys = [h.get(r, {}).get(labels[b], 0) for b in x]
            ax.bar(x + off, ys, width=0.4, label=r)
        ax.set_xlim(-0.6, max(last, 4) + 0.6)
        ax.set_yscale("symlog")
        ax.set_xticks(x, labels[: last + 1], rotation=60, fontsize=6)
        ax.set_title(f"{fam}: {FAMILY_TITLES[fam]}", fontsize=8)
        ax.legend(fontsize=6)
    fig.suptitle("changed output elements by distance from the reference (bf16 spacings)")
    fig.tight_layout()
    fig.savefig(path, dpi=100, format="png")
    plt.close(fig)
    return path


REPORT_FILES = ("audit.json", "audit.md", "detection_heatmap.png", "ulp_histograms.png", "injection.png")


def report_items(result: dict, directory: Path, command: str | None = None) -> list:
    """The (destination, render) pairs of --report DIR, for write_files_atomic: audit.json,
    audit.md, detection_heatmap.png, ulp_histograms.png, and injection.png when the faults were
    injected into the generating model."""
    d = Path(directory)
    data = json_bytes(result, indent=1)
    md = markdown(result, command)
    files = [
        (d / "audit.json", lambda tmp: tmp.write_bytes(data)),
        (d / "audit.md", lambda tmp: tmp.write_text(md, encoding="utf-8")),
        (d / "detection_heatmap.png", lambda tmp: plot_heatmap(result, tmp)),
        (d / "ulp_histograms.png", lambda tmp: plot_histograms(result, tmp)),
    ]
    if result.get("injection"):
        files.append((d / "injection.png", lambda tmp: plot_injection(result, tmp)))
    return files


def write_report(result: dict, directory: Path, command: str | None = None) -> list[Path]:
    """The report files (report_items) under `directory`, all or nothing."""
    return write_files_atomic(report_items(result, directory, command))
