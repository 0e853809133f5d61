"""`requant audit`: per-Linear bitwise comparison of a kernel pair and the fault-injection suite.

    requant audit [CKPT] [--backends cutlass,triton | --backends reference] [--prompts N]
                  [--json OUT] [--report DIR] [--plan] [--device DEV] [--revision REV]
                  [--threads N] [--matrix v1|v2]

No CKPT: the embedded default (requant.DEFAULT_CHECKPOINT). `--backends reference` is the
pair reference-cutlass-order,reference-triton-order, the default where no CUDA GPU is
present; with one, the default pair is cutlass,triton. `--plan` prints the cell count and
the GEMM shapes from config.json alone (CKPT may be the directory or the config.json file).
`--matrix` picks the pinned prediction matrix: v2 (default: v1's cells plus C8, and the only
one with a baseline row for the cublas backend's fused-scale order) or v1 (the seed paper's
reproduction, C1..C7).

Exit status: 0 when the audit ran against the pinned prediction matrix, the scorecard has no
false positive or negative and every layer is bitwise equal under pow2; 1 when it ran but one
of those fails; 2 on a usage or checkpoint error (a message, no traceback), including a
SHA256SUMS that does not match the checkpoint's files.

The JSON ties itself to the bytes audited and the code that ran: `manifest_digest` (the
checkpoint's SHA256SUMS digest, or the digest of the manifest computed now when it has none;
`manifest` says which), `tool_version`, `git_commit`, and the matrix digest (`scorecard`).
A checkpoint made by `requant convert` is audited as stored (`converted`: its arm; native =
pow2 = the stored power-of-two scales).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from requant.commands._common import (
    EXIT_FAILED,
    BackendsOpt,
    ByteTokensOpt,
    CkptArg,
    DeviceOpt,
    JsonOpt,
    ReportOpt,
    RevisionOpt,
    ThreadsOpt,
    UsageError,
    byte_tokens_option,
    cannot_run,
    check_device,
    check_output_dir,
    check_output_file,
    default_device,
    echo_command,
    err,
    progress_bar,
    set_threads,
    write_json_atomic,
)

console = err()


def _load_config(ckpt: Optional[str]) -> tuple[dict, str]:
    """config.json of a directory, of a config.json path, or of the embedded default."""
    from requant import DEFAULT_CHECKPOINT

    if ckpt is None:
        p = Path(DEFAULT_CHECKPOINT) / "config.json"
    else:
        p = Path(ckpt)
        if p.is_dir():
            p = p / "config.json"
        elif not p.exists():
            from requant.checkpoint import open_checkpoint

            c = open_checkpoint(ckpt)  # a Hub repo id: resolve it, then read its config
            return c.config, str(c.path / "config.json")
    if not p.is_file():
        raise UsageError(f"{p}: no config.json")
    try:
        config = json.loads(p.read_text())
    except ValueError as exc:
        raise UsageError(f"{p}: not valid JSON: {exc}") from None
    if not isinstance(config, dict):
        raise UsageError(f"{p}: not a JSON object")
    from requant.checkpoint import check_qwen3

    check_qwen3(config, p)
    return config, str(p)


def _print_plan(plan: dict, where: str) -> None:
    t = Table(title=f"audit plan for {where}")
    for col in ("GEMM [out, in]", "Linears", "cells"):
        t.add_column(col, justify="right")
    for s in plan["shapes"]:
        t.add_row(
            f"[{s['out']}, {s['in']}]", str(s["count"]), str(s["count"] * plan["variants"] * len(plan["regimes"]))
        )
    console.print(t)
    print(
        f"layers: {plan['layers']}  variants: {plan['variants']}  regimes: {','.join(plan['regimes'])}  cells: {plan['cells']}"
    )


def _print_summary(result: dict) -> None:
    from requant.audit.report import matrix_warning

    card = result["scorecard"]
    warn = matrix_warning(result)
    if warn:
        console.print(f"[bold red]{warn}[/bold red]")
    t = Table(title="detection (observable / detected)")
    t.add_column("fault")
    for sev in ("one", "1pct", "all"):
        for regime in ("native", "pow2"):
            t.add_column(f"{sev} {regime}", justify="right")
    det = {(d["fault"], d["severity"], d["regime"]): d for d in result["detection"]}
    for fam in sorted({d["fault"] for d in result["detection"]}):
        cells = []
        for sev in ("one", "1pct", "all"):
            for regime in ("native", "pow2"):
                d = det.get((fam, sev, regime))
                cells.append("" if d is None else f"{d['detected']}/{d['observable']}")
        t.add_row(fam, *cells)
    console.print(t)
    print(f"per layer: {result['per_layer_summary']['line']}")
    if result.get("native_scales_all_pow2_layers"):
        print(
            f"note: {result['native_scales_all_pow2_layers']}/{result['layers']} layers already have power-of-two native scales "
            "(a converted checkpoint?): C5 applies under native there, counted as applicability mismatches"
        )
    print(
        f"cells: {result['cells']}  false positives: {card['false_positives']}  false negatives: {card['false_negatives']}  "
        f"applicability mismatches: {card['applicability_mismatches']}"
    )
    print("max ULP by fault: " + ", ".join(f"{k}={v}" for k, v in result["max_ulp_by_fault"].items()))
    e2e = result["end_to_end"]
    print("end to end (C7 tokens flagged): " + ", ".join(f"{r}: {e['flagged']}/{e['tokens']}" for r, e in e2e.items()))
    print(
        f"matrix sha256: {card['matrix_sha256']} ({'pinned' if card['matrix_pinned'] else 'NOT PINNED'})  wall: {result['wall_seconds']} s"
    )
    print(
        f"manifest digest: {result.get('manifest_digest')} ({result.get('manifest') or 'computed; no SHA256SUMS'})  "
        f"requant {result.get('tool_version')} ({result.get('git_commit') or 'no git checkout'})"
    )
    conv = result.get("converted")
    if conv:
        print(
            f"converted checkpoint, arm {conv['arm']}{'' if conv.get('servable', True) else ' (NOT servable)'}: {conv['regimes']}"
        )


@byte_tokens_option
def audit(
    ckpt: CkptArg = None,
    backends: BackendsOpt = None,
    prompts: Annotated[int, typer.Option("--prompts", help="Calibration prompts to run (prefill).")] = 8,
    json_out: JsonOpt = None,
    report: ReportOpt = None,
    plan: Annotated[
        bool, typer.Option("--plan", help="Print cell count and shapes from config.json, run nothing.")
    ] = False,
    device: DeviceOpt = None,
    revision: RevisionOpt = None,
    threads: ThreadsOpt = None,
    byte_tokens: ByteTokensOpt = False,
    matrix: Annotated[
        str,
        typer.Option("--matrix", help="Pinned prediction matrix: v2 (C1..C8, default) or v1 (C1..C7, the paper's)."),
    ] = "v2",
) -> None:
    """Bitwise CUTLASS-vs-Triton comparison per Linear on real activations, and the
    fault-injection suite scored against the pinned prediction matrix."""
    with cannot_run():
        check_output_file(json_out, "--json")  # before any work: a bad path costs nothing and writes nothing
        check_output_dir(report, "--report")
        if plan:
            from requant.audit.suite import plan_from_config

            config, where = _load_config(ckpt)
            p = plan_from_config(config)
            _print_plan(p, where)
            if json_out is not None:
                write_json_atomic(json_out, p)
            return
        from requant import DEFAULT_CHECKPOINT
        from requant.audit.capture import prompts as prompt_list
        from requant.audit.suite import CELLS_PER_LAYER
        from requant.backends import check_runnable, parse_backends
        from requant.checkpoint import open_checkpoint
        from requant.evidence.identity import with_progress
        from requant.runtime import check_layout
        from requant.tokenizer import load_tokenizer

        dev = check_device(device or default_device())
        spec = backends or ("cutlass,triton" if dev.startswith("cuda") else "reference")
        pair = parse_backends(spec)
        check_runnable(pair, dev, "reference")
        set_threads(threads, dev)
        from requant.audit.matrix import baseline_variant, load_matrix, matrix_path

        pred = load_matrix(matrix_path(matrix))
        for b in pair:
            if not pred.has_variant(baseline_variant(b)):
                raise UsageError(
                    f"--matrix {matrix} has no baseline row {baseline_variant(b)} for backend {b}; use --matrix v2"
                )
        prompt_list(prompts)  # validate N before loading (or downloading) anything big
        src = DEFAULT_CHECKPOINT if ckpt is None else ckpt
        checkpoint = open_checkpoint(src, revision=revision)
        check_layout(checkpoint)
        # a tokenizer that cannot encode the prompts is a usage error, before the run
        tok = load_tokenizer(checkpoint.path, int(checkpoint.config["vocab_size"]))
        [tok.encode(t) for t in prompt_list(prompts)]
        identity = with_progress(
            checkpoint, console
        )  # before the long run: a SHA256SUMS that does not match fails here

    from requant.audit.report import write_json, write_report
    from requant.audit.suite import run_audit

    total = len(checkpoint.quantized_linears) * CELLS_PER_LAYER
    console.print(
        f"auditing {checkpoint.path} with {pair[0]} vs {pair[1]} on {dev}: {len(checkpoint.quantized_linears)} Linears, {total} cells"
    )
    with cannot_run():  # a tensor that turned out unreadable while running
        with progress_bar(console) as progress:
            task = progress.add_task("cells", total=total)
            result = run_audit(
                checkpoint,
                pair,
                prompts,
                dev,
                identity=identity,
                matrix=pred,
                advance=lambda n: progress.advance(task, n),
                on_phase=lambda msg: progress.console.log(msg),
            )
    command = echo_command("audit", {"--backends": spec})
    result["command"] = command
    with cannot_run():
        if json_out is not None:
            write_json(result, json_out)
        if report is not None:
            for f in write_report(result, report, command):
                console.print(f"wrote {f}")
    _print_summary(result)
    card = result["scorecard"]
    ok = (
        card["matrix_pinned"]
        and card["false_positives"] == 0
        and card["false_negatives"] == 0
        and result["per_layer_summary"]["pow2"]["bitwise_equal"] == result["per_layer_summary"]["pow2"]["layers"]
    )
    if not ok:
        raise typer.Exit(EXIT_FAILED)
