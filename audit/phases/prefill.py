"""The prefill phase: each regime's audit prompts prefilled by both backends of the pair (C7 end
to end on their logits), the first backend's operands captured, and every quantized Linear's
cells (audit/cells.py) run on them. Owns the prefill keys of the JSON (PrefillPhase.result),
the report's prefill sections (prefill_markdown) and its plots (plot_heatmap, plot_histograms).
Docs: docs/audit.md.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from requant.audit.capture import Capture, run_prompts
from requant.audit.catalogue.checks import LAYER_CHECK_IDS, c7_token_risk, token_risk
from requant.audit.catalogue.faults import FAMILY_TITLES, VARIANTS
from requant.audit.catalogue.matrix import Matrix
from requant.audit.catalogue.scoring import HIST_BINS, Scorer, bin_label
from requant.audit.cells import LinearQueue, backend_kernel
from requant.audit.compare import summarize_layers
from requant.audit.moe_combine import E2E_NOTE, combine_rows, e2e_claimed
from requant.audit.records import Run, Weights
from requant.io.markdown import table
from requant.kernels.bf16 import is_power_of_two
from requant.regime import REGIMES

__all__ = [
    "PrefillPhase",
    "kernel_faults_markdown",
    "plot_heatmap",
    "plot_histograms",
    "pow2_native_note",
    "prefill_markdown",
    "scope_note",
]


class PrefillPhase:
    """The prefill phase's scorer, per-layer rows and end-to-end verdicts, filled regime by regime
    (capture, then cells)."""

    def __init__(self, matrix: Matrix, backends: tuple[str, str]):
        self.scorer = Scorer(matrix)
        self.backends = backends
        self.rows: list = []
        self.e2e: dict = {}
        self.native_pow2_layers = 0
        # Qwen3-MoE: the experts the router sent no calibration token, per regime (never audited,
        # never counted as equal), and how many Linears were audited (native: for native_is_pow2).
        self.unrouted: dict[str, list[str]] = {}
        self.audited: dict[str, int] = {}
        self.routes: dict = {}  # this regime's routes per sparse block (capture -> cells)
        self.combine: list = []  # audit/moe_combine.py's rows

    def capture(self, regime: str, model, token_lists, say) -> dict:
        """Both backends prefill the prompts; C7 scores their logits; returns the first backend's
        operands per Linear."""
        a, b = self.backends
        say(f"{regime}: prefill of {len(token_lists)} prompts with {a} (capture) and {b}")
        cap = Capture()
        logits_a = run_prompts(model, token_lists, a, cap)
        logits_b = run_prompts(model, token_lists, b, None)
        risk = token_risk(logits_a, logits_b)
        # C7 decides from the same logits (it recomputes token_risk: [tokens, vocab], cheap).
        outcome = c7_token_risk(
            Run(None, None, None, None, backend_kernel(a), logits=logits_a),
            Run(None, None, None, None, backend_kernel(b), logits=logits_b),
            backend_kernel(b),
        ).outcome
        if e2e_claimed(self.backends, model):
            expected = self.scorer.add_end_to_end("C7", regime, outcome, observable=not risk["bitwise_equal"])
        else:
            expected, risk["note"] = None, E2E_NOTE
        risk.update({"outcome": outcome, "expected": expected})
        self.e2e[regime] = risk
        self.routes = cap.routes
        return cap.operands()

    def cells(self, regime: str, ops: dict, linears: dict, names, advance) -> None:
        """Every Linear's cells on its captured operands, scored."""
        queue = LinearQueue(regime, self.backends, self.scorer.checks, advance)
        unrouted = [n for n in names if n not in ops]  # only an expert no token was routed to
        if unrouted:
            self.unrouted[regime] = unrouted
        names = [n for n in names if n in ops]
        self.audited[regime] = len(names)
        if regime == "native":
            self.native_pow2_layers += _all_pow2_count([linears[n][1] for n in names])
        for name in names:
            queue.put(name, [(name, ops[name])], Weights(*linears[name]))
        for name, [(row, cells)] in queue.results().items():
            for cell in cells:
                self.scorer.add(cell)
            self.rows.append(row)
        self.combine += combine_rows(regime, self.routes, ops, linears, self.backends)
        self.routes = {}

    def native_is_pow2(self, layers: int) -> bool:
        layers = self.audited.get("native", layers)
        return layers > 0 and self.native_pow2_layers == layers

    def result(self, layers: int) -> dict:
        """The prefill keys of the JSON, in their order."""
        return {
            "cells": self.scorer.cells,
            "variants": len(VARIANTS),
            "regimes": list(REGIMES),
            "baseline_cells": self.scorer.baseline_cells,
            "native_scales_all_pow2_layers": self.native_pow2_layers,
            "per_layer": self.rows,
            "per_layer_summary": summarize_layers(self.rows, native_is_pow2=self.native_is_pow2(layers)),
            **self.scorer.summary(),
            "end_to_end": self.e2e,
            **({"experts_without_tokens": self.unrouted} if self.unrouted else {}),
            **(
                {"moe_combine": {"rows": self.combine, "summary": summarize_layers(self.combine)}}
                if self.combine
                else {}
            ),
        }


def _all_pow2_count(scales: list) -> int:
    """How many of the weight-scale tensors are powers of two throughout: one pass over all of them
    (a few launches on CUDA, not a few per Linear: 18,624 Linears at the 30B-A3B shape)."""
    if not scales:
        return 0
    sizes = torch.tensor([s.numel() for s in scales])
    owner = torch.repeat_interleave(torch.arange(len(scales)), sizes).to(scales[0].device)
    bad = (~is_power_of_two(torch.cat([s.reshape(-1) for s in scales]))).to(torch.int64)
    per = torch.zeros(len(scales), dtype=torch.int64, device=bad.device).index_add_(0, owner, bad)
    return int((per == 0).sum())


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


def prefill_markdown(result: dict) -> list[str]:
    """The report's prefill sections: per-layer comparison, scorecard, detection, baseline rows,
    largest distance per fault family, end to end."""
    card = result["scorecard"]
    s = result["per_layer_summary"]
    lines = ["## Per-layer comparison of the pair", "", f"**{s['line']}**", ""]
    lines += table(
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
        lines += table(
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
        lines += table(
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
    lines += table(
        ["variant", "regime", "cells", "observable", "detected", "by check", "max ULP", "predicted detected"], rows
    )
    lines += ["", "## Baseline rows (each backend of the pair as the kernel under test, no fault)", ""]
    rows = []
    for b in result["baseline"]:
        fired = ", ".join(f"{c}:{o['fire']}" for c, o in b["outcomes"].items() if o["fire"]) or "none"
        na = ", ".join(c for c, o in b["outcomes"].items() if o["not_applicable"]) or "-"
        rows.append(
            [
                f"`{b.get('backend')}`",
                b["variant"],
                b["regime"],
                b["cells"],
                b["differing_cells"],
                b.get("kernel_fault_cells", 0),
                b["max_ulp"],
                fired,
                na,
            ]
        )
    lines += table(
        [
            "backend",
            "row",
            "regime",
            "layers",
            "layers differing from reference",
            "layers breaking the declared order",
            "max ULP",
            "checks fired",
            "not applicable",
        ],
        rows,
    )
    lines += kernel_faults_markdown(result.get("kernel_faults"), "prefill")
    lines += ["", "## Largest distance per fault family (bf16 spacings)", ""]
    lines += table(
        ["fault", "what", "max ULP"], [[f, FAMILY_TITLES[f], u] for f, u in result["max_ulp_by_fault"].items()]
    )
    lines += ["", "## End to end (C7: tokens whose top-1 margin is below the largest logit deviation)", ""]
    lines += table(
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
    return lines + [""]


def kernel_faults_markdown(groups: list | None, phase: str) -> list[str]:
    """The kernel faults of one phase (scoring.Scorer's kernel_faults): which kernel, regime and M,
    how many layers and elements break its declared order, and the first of them."""
    if not groups:
        return []
    lines = [
        "",
        f"**Kernel faults ({phase})**: a backend's own output differs from its declared order emulated on its "
        "own operands (C8), or C1/C4 fire on it. These are faults of the kernel, not false positives; its "
        "baseline cells are not scored against the matrix.",
        "",
    ]
    return lines + table(
        ["backend", "regime", "M", "layers", "elements", "checks", "first differing element"],
        [
            [
                f"`{g['backend']}`",
                g["regime"],
                g["m"],
                g["layers"],
                g["elements"],
                ", ".join(g["checks"]),
                "-"
                if g["first"] is None
                else f"{g['first']['layer']} [{g['first']['index'][0]}, {g['first']['index'][1]}]: "
                f"got {g['first']['got']}, want {g['first']['want']}",
            ]
            for g in groups
        ],
    )


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
