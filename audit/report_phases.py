"""The report's decode and injection sections (Markdown) and the injection plot.

Decode sits beside prefill: the same per-layer table and detection counts, per batch size.
Injection: per fault kernel and regime, what the fault did to the generated tokens and what
C7 saw, in both scopes, and the plot injection.png (logit deviation and C7's flagged tokens
per fault), drawn with matplotlib's Agg backend (matplotlib is an optional dependency, as
for the other plots).
"""

from __future__ import annotations

from pathlib import Path

from requant.audit.matrix import REGIMES

__all__ = ["decode_markdown", "injection_markdown", "plot_injection"]


def _table(header: list[str], rows: list[list]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return out


def decode_markdown(result: dict) -> list[str]:
    dec = result.get("decode")
    if not dec:
        return []
    pre, card = result["per_layer_summary"], dec["scorecard"]
    lines = [
        "## Decode beside prefill",
        "",
        f"Decode: {dec['steps']} greedy steps at each batch size M = {', '.join(map(str, dec['batches']))} "
        "(KV cache, reference engine); every step's operands audited at that step's M, never concatenated.",
        "",
    ]
    rows = [["prefill", f"M = {result['tokens']} (packed)", *_regime_cells(pre)]]
    for b, s in dec["per_layer_summary"]["by_batch"].items():
        rows.append(["decode", f"M = {b}, {dec['steps']} steps", *_regime_cells(s)])
    lines += _table(
        ["phase", "operands", "pow2 layers bitwise equal", "native layers bitwise equal", "max ULP native"], rows
    )
    lines += [
        "",
        f"Decode scorecard: {dec['cells']} cells, false positives **{card['false_positives']}**, false negatives "
        f"**{card['false_negatives']}**, applicability mismatches {card['applicability_mismatches']} "
        f"(matrix `{card['matrix_sha256'][:12]}`, {'pinned' if card['matrix_pinned'] else 'NOT PINNED'}).",
        "",
    ]
    det = {(d["variant"], d["regime"]): d for d in dec["detection"]}
    pdet = {(d["variant"], d["regime"]): d for d in result["detection"]}
    rows = []
    for (variant, regime), d in det.items():
        p = pdet.get((variant, regime), {"detected": "-", "observable": "-"})
        rows.append([variant, regime, f"{p['detected']}/{p['observable']}", f"{d['detected']}/{d['observable']}"])
    lines += _table(["variant", "regime", "prefill detected/observable", "decode detected/observable"], rows)
    e2e = dec.get("end_to_end") or {}
    if e2e:
        lines += ["", "Decode end to end (C7 on the pair's decode logits, same tokens fed):", ""]
        lines += _table(
            ["regime", "M", "tokens", "flagged", "top-1 disagreements", "max deviation", "outcome", "expected"],
            [
                [
                    r,
                    b,
                    e["tokens"],
                    e["flagged"],
                    e["top1_disagreements"],
                    e["max_deviation"],
                    e["outcome"],
                    e["expected"] or "no claim",
                ]
                for r, per in e2e.items()
                for b, e in per.items()
            ],
        )
    return lines + [""]


def _regime_cells(s: dict) -> list:
    return [
        f"{s['pow2']['bitwise_equal']}/{s['pow2']['layers']}",
        f"{s['native']['bitwise_equal']}/{s['native']['layers']}",
        s["native"]["max_ulp"],
    ]


def injection_markdown(result: dict) -> list[str]:
    inj, card = result.get("injection"), result.get("injection_scorecard")
    if not inj:
        return []
    runs = card["runs"]
    any_run = next(iter(runs.values()))
    lines = [
        "## Faults injected into the generating model",
        "",
        f"Each fault kernel (audit/fault_kernels.py) replaced the GEMM of every quantized Linear (`all`) or of the "
        f"Linears of one decoder layer (`one layer`: {', '.join(f'`{n}`' for n in any_run['one_layer'])}) while the "
        f"model generated {any_run['tokens']} greedy tokens for {any_run['prompts']} prompts (base backend "
        f"`{any_run['base']}`, fed the unfaulted run's tokens). C7 compares the faulted logits with the unfaulted ones.",
        "",
        f"Injection scorecard (matrix v{card['matrix_version']} `{card['matrix_sha256'][:12]}`, "
        f"{'pinned' if card['matrix_pinned'] else 'NOT PINNED'}): {card['scored']} scored verdicts, false positives "
        f"**{card['false_positives']}**, false negatives **{card['false_negatives']}**.",
        "",
    ]
    rows = []
    for fam, regs in inj.items():
        for r in REGIMES:
            m = regs.get(r)
            if m is None:
                continue
            o = m["one_layer"]
            rows.append(
                [
                    fam,
                    r,
                    f"{m['changed_prompts']}/{m['prompts']}",
                    "-" if m["first_divergence"] is None else m["first_divergence"],
                    f"{m['logit_max_abs']:.4g}",
                    f"{m['c7_flagged']}/{m['tokens']}",
                    m["c7_top1_flips"],
                    m["expected"] or "no claim",
                    f"{o['changed_prompts']}/{o['prompts']}",
                    f"{o['logit_max_abs']:.4g}",
                    f"{o['c7_flagged']}/{o['tokens']}",
                    o["expected"] or "no claim",
                ]
            )
    lines += _table(
        [
            "fault",
            "regime",
            "prompts changed",
            "first divergence",
            "max logit deviation",
            "C7 flagged",
            "top-1 flips",
            "C7 expected",
            "one layer: changed",
            "one layer: deviation",
            "one layer: flagged",
            "one layer: expected",
        ],
        rows,
    )
    if card["contradictions"]:
        lines += [
            "",
            "Contradictions: "
            + "; ".join(f"{c['kind']} {c['fault']} {c['regime']} {c['scope']}" for c in card["contradictions"]),
        ]
    return lines + [""]


def plot_injection(result: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    inj = result["injection"]
    fams = list(inj)
    x = np.arange(len(fams))
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    for off, (r, scope) in zip((-0.3, -0.1, 0.1, 0.3), [(r, s) for r in REGIMES for s in ("all", "one_layer")]):
        pick = [inj[f].get(r, {}) for f in fams]
        pick = [m if scope == "all" else m.get("one_layer", {}) for m in pick]
        dev = [m.get("logit_max_abs", 0.0) for m in pick]
        flagged = [m.get("c7_flagged", 0) / max(m.get("tokens", 1), 1) for m in pick]
        axes[0].bar(x + off, dev, width=0.2, label=f"{r}, {scope}")
        axes[1].bar(x + off, flagged, width=0.2, label=f"{r}, {scope}")
    axes[0].set_yscale("symlog", linthresh=0.01)
    axes[0].set_title("largest logit deviation from the unfaulted run")
    axes[1].set_title("fraction of generated tokens C7 flags")
    for ax in axes:
        ax.set_xticks(x, fams, fontsize=8)
        ax.legend(fontsize=7)
    fig.suptitle("faults injected into the generating model")
    fig.tight_layout()
    fig.savefig(path, dpi=100, format="png")
    plt.close(fig)
    return path
