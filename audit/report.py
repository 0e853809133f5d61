"""Audit outputs: the JSON (the record), a Markdown summary (for people) and the PNG plots, drawn
with matplotlib's Agg backend so they render on a headless machine. The Markdown is a header and
each phase's section in order (audit/phases/: prefill, decode, injection); each phase draws its
own plots (detection heat map, ULP histograms; injection.png).
"""

from __future__ import annotations

from pathlib import Path

from requant.audit.catalogue.checks import CHECK_TITLES
from requant.audit.catalogue.matrix import PINNED_SHA256, PINS
from requant.audit.phases.decode import decode_markdown
from requant.audit.phases.injection import injection_markdown, plot_injection
from requant.audit.phases.prefill import plot_heatmap, plot_histograms, prefill_markdown
from requant.evidence.identity import markdown_lines as identity_lines
from requant.io.output import json_bytes, write_bytes_atomic, write_files_atomic
from requant.models.tokenizer import summary as tokenizer_summary

__all__ = [
    "REPORT_FILES",
    "kernel_faults",
    "markdown",
    "matrix_warning",
    "report_items",
    "verdict",
    "write_json",
    "write_report",
]


def matrix_warning(result: dict) -> str | None:
    card = result["scorecard"]
    if card.get("matrix_pinned"):
        return None
    pin = PINS.get(card.get("matrix_version"), PINNED_SHA256)
    return (
        f"WARNING: the prediction matrix digest {card['matrix_sha256']} is NOT the pinned {pin}; "
        "this run was scored against an unpinned matrix."
    )


def kernel_faults(result: dict) -> list[dict]:
    """Every phase's kernel-fault groups (scoring.Scorer: one per backend, regime and M whose
    baseline cells prove the kernel faulty), each with its phase, prefill first."""
    out = [dict(g, phase="prefill") for g in result.get("kernel_faults") or []]
    out += [dict(g, phase="decode") for g in (result.get("decode") or {}).get("kernel_faults") or []]
    return out


def _culprit(backend: str, groups: list[dict], result: dict) -> str:
    """One kernel's fault in a clause: its declared order, the checks, each (phase, M) with its layers
    and elements (regimes summed), and the first differing element."""
    order = ((result.get("kernels") or {}).get("backends") or {}).get(backend, {}).get("declares")
    where: dict = {}
    for g in groups:
        w = where.setdefault((g["phase"], g["m"]), [0, 0])
        w[0] += g["layers"]
        w[1] += g["elements"]
    checks = sorted({c for g in groups for c in g["checks"]})
    first = next((g for g in groups if g["first"] is not None), None)
    line = (
        f"kernel {backend} is faulty: {'its output differs from its declared ' + str(order) + ' on its own operands' if 'C8' in checks else 'a check proves it'}"
        f" ({', '.join(checks)}) in "
        + ", ".join(f"{ph} M={m} ({n} layers, {e} elements)" for (ph, m), (n, e) in where.items())
    )
    if first is not None:
        f = first["first"]
        line += (
            f"; first: {first['phase']} M={first['m']} {first['regime']} {f['layer']} element "
            f"[{f['index'][0]}, {f['index'][1]}] (got {f['got']}, want {f['want']})"
        )
    if backend == (result.get("backends") or [None])[0]:
        # the cells and the faults run on what its forward made: checks may then miss (a false negative)
        line += "; it is the capture backend: every cell ran on operands its forward made"
    return line


def verdict(result: dict) -> tuple[bool, str]:
    """(passed, the one-line verdict). Passed: every scorecard pinned, no false positive or negative,
    no kernel fault, every pow2 layer bitwise equal, in prefill and (when run) in decode, and every
    pow2 MoE block's routed down projections + combine (moe_combine, prefill); the
    injection's scorecard the same way. A kernel fault is named first (the culprit), then the
    other failures; docs/audit.md ("The verdict")."""
    faults = kernel_faults(result)
    parts = []
    for b in dict.fromkeys(g["backend"] for g in faults):
        parts.append(_culprit(b, [g for g in faults if g["backend"] == b], result))
    phases = [("prefill", result)] + ([("decode", result["decode"])] if result.get("decode") else [])
    for name, ph in phases:
        card, pow2 = ph["scorecard"], ph["per_layer_summary"]["pow2"]
        if not card["matrix_pinned"]:
            parts.append(f"{name} scored against an unpinned matrix")
        if card["false_positives"] or card["false_negatives"]:
            parts.append(
                f"{name}: {card['false_positives']} false positives, {card['false_negatives']} false negatives"
            )
        if pow2["bitwise_equal"] != pow2["layers"]:
            parts.append(f"{name}: pow2 {pow2['bitwise_equal']}/{pow2['layers']} layers bitwise equal")
    comb = (result.get("moe_combine") or {}).get("summary", {}).get("pow2")
    if comb and comb["bitwise_equal"] != comb["layers"]:  # audit/moe_combine.py: the pair's MoE blocks differ
        parts.append(
            f"prefill: pow2 {comb['bitwise_equal']}/{comb['layers']} MoE blocks (down + combine) bitwise equal"
        )
    inj = result.get("injection_scorecard")
    if inj is not None and not (inj["matrix_pinned"] and inj["false_positives"] == 0 and inj["false_negatives"] == 0):
        parts.append(f"injection: {inj['false_positives']} false positives, {inj['false_negatives']} false negatives")
    if parts:
        return False, "audit failed: " + "; ".join(parts)
    return True, (
        f"audit passed: {result['per_layer_summary']['line']}; no false positive or negative, no kernel fault"
    )


def write_json(result: dict, path: Path) -> Path:
    return write_bytes_atomic(path, json_bytes(result, row_lines=True))


def compact_experts(names: list[str]) -> str:
    """Expert Linear names in brace form, one group per block and set of projections, e.g.
    `model.layers.1.mlp.experts.{6,7}.{gate_proj,up_proj,down_proj}` (3,000 names at the 30B-A3B
    shape fit a line; the JSON keeps every name). Expanding the braces gives exactly the names given,
    each once; a name not of the form BLOCK.experts.E.LEAF stays as it is."""
    blocks: dict[str, dict[int, list[str]]] = {}
    others = []
    for name in names:
        head, sep, tail = name.rpartition(".experts.")
        expert, _, leaf = tail.partition(".")
        if not sep or not expert.isdigit() or not leaf:
            others.append(name)
            continue
        blocks.setdefault(head, {}).setdefault(int(expert), []).append(leaf)
    groups = []
    for head, experts in blocks.items():
        by_leaves: dict[tuple[str, ...], list[int]] = {}
        for e in sorted(experts):
            by_leaves.setdefault(tuple(experts[e]), []).append(e)
        for leaves, es in by_leaves.items():
            ids = str(es[0]) if len(es) == 1 else "{" + ",".join(map(str, es)) + "}"
            tail = leaves[0] if len(leaves) == 1 else "{" + ",".join(leaves) + "}"
            groups.append(f"{head}.experts.{ids}.{tail}")
    return ", ".join(groups + others)


def unrouted_lines(result: dict) -> list[str]:
    """Qwen3-MoE: one line per phase and regime naming the expert Linears that received no token
    (never compared, never counted as equal), and the blocks' combine line; none for a dense model."""
    lines = []
    for regime, names in (result.get("experts_without_tokens") or {}).items():
        lines.append(
            f"experts without tokens, prefill, {regime} (not audited): {len(names)} Linears, {compact_experts(names)}"
        )
    for regime, d in ((result.get("decode") or {}).get("experts_without_tokens") or {}).items():
        lines.append(
            f"experts without tokens, decode, {regime}: {d['operand_sets_without_tokens']} (Linear, batch, step) "
            f"operand sets; never routed: {compact_experts(d['experts']) or 'none'}"
        )
    if result.get("moe_combine"):  # audit/moe_combine.py: the routed down projections and the combine
        lines.append(
            f"MoE blocks, routed down projections + combine, prefill: {result['moe_combine']['summary']['line']}"
        )
    return lines


def markdown(result: dict, command: str | None = None) -> str:
    card = result["scorecard"]
    lines = ["# requant audit", ""]
    warn = matrix_warning(result)
    if warn:
        lines += [f"**{warn}**", ""]
    if command:
        lines += ["```bash", command, "```", ""]
    if result.get("verdict"):
        lines += [f"**{result['verdict']}**", ""]
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
        *[f"- {line}" for line in unrouted_lines(result)],
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
    lines += prefill_markdown(result) + decode_markdown(result) + injection_markdown(result)
    lines += ["Checks: " + "; ".join(f"{c} {t}" for c, t in CHECK_TITLES.items()), ""]
    return "\n".join(lines)


REPORT_FILES = ("audit.json", "audit.md", "detection_heatmap.png", "ulp_histograms.png", "injection.png")


def report_items(result: dict, directory: Path, command: str | None = None, data: bytes | None = None) -> list:
    """The (destination, render) pairs of --report DIR, for write_files_atomic: audit.json (`data`
    when the caller has serialized the result already), audit.md, detection_heatmap.png,
    ulp_histograms.png, and injection.png when the faults were injected into the generating model."""
    d = Path(directory)
    data = json_bytes(result, row_lines=True) if data is None else data
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
