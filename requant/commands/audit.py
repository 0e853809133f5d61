"""`requant audit`: per-Linear bitwise comparison of a kernel pair and the fault-injection suite.

    requant audit [CKPT] [--backends cutlass,triton | --backends reference | --backends A,MODULE:FUNCTION]
                  [--order ORDER] [--phases prefill,decode] [--decode-batches 1,8] [--decode-tokens 4]
                  [--injection/--no-injection] [--injection-tokens N] [--prompts N]
                  [--json OUT] [--report DIR] [--plan] [--device DEV] [--revision REV]
                  [--threads N] [--matrix v1|v2|v3|v4] [--byte-tokens]

Exit status: 0 when the audit ran against the pinned prediction matrix, the scorecard has no
false positive or negative and every layer is bitwise equal under pow2; 1 when it ran but one
of those fails; 2 on a usage or checkpoint error (a message, no traceback), including a
SHA256SUMS that does not match the checkpoint's files.

Defaults, the matrices, the decode and injection phases and the JSON's identity fields: docs/audit.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from requant import DEFAULT_CHECKPOINT
from requant.backends import check_runnable, is_custom, parse_backends
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
    plain,
    progress_bar,
    set_threads,
    write_json_atomic,
)
from requant.commands._isolate import deliver, needs_child, run_in_child
from requant.commands._limits import check_generation_memory, check_positions
from requant.evidence.identity import with_progress
from requant.io.inputs import load_json
from requant.io.output import json_bytes, write_files_atomic
from requant.models.tokenizer import load_tokenizer
from requant.regime import REGIMES

console = err()  # progress and phase lines
out = Console(highlight=False, soft_wrap=True)  # tables and the summary: stdout, one stream


def _load_config(ckpt: Optional[str]) -> tuple[dict, str]:
    """config.json of a directory, of a config.json path, or of the embedded default."""

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
    from requant.checkpoint import check_qwen3

    config = load_json(p, what="config.json")
    if not isinstance(config, dict):
        raise UsageError(f"{p}: not a JSON object")
    check_qwen3(config, p)
    return config, str(p)


def _print_plan(plan: dict, where: str) -> None:
    t = Table(title=f"audit plan for {plain(where)}")
    for col in ("GEMM [out, in]", "Linears", "cells"):
        t.add_column(col, justify="right")
    for s in plan["shapes"]:
        t.add_row(
            f"[{s['out']}, {s['in']}]", str(s["count"]), str(s["count"] * plan["variants"] * len(plan["regimes"]))
        )
    out.print(t)
    print(
        f"layers: {plan['layers']}  variants: {plan['variants']}  regimes: {','.join(plan['regimes'])}  cells: {plan['cells']}"
    )
    print(
        f"decode phase: {plan['cells']} cells per decode step and batch size "
        f"(the defaults, M = 1,8 x 4 steps: {plan['cells'] * 8})"
    )


def _print_summary(result: dict) -> None:
    from requant.audit.report import matrix_warning

    warn = matrix_warning(result)
    if warn:
        out.print(f"[bold red]{plain(warn)}[/bold red]")
    _print_detection(result["detection"], "detection, prefill (detected / observable)")
    dec = result.get("decode")
    if dec:
        _print_detection(
            dec["detection"], f"detection, decode at M = {','.join(map(str, dec['batches']))} (detected / observable)"
        )
    print(f"per layer, prefill: {result['per_layer_summary']['line']}")
    if dec:
        for b, sm in dec["per_layer_summary"]["by_batch"].items():
            print(f"per layer, decode M={b} ({dec['steps']} steps): {sm['line']}")
    _print_unrouted(result)
    _print_rest(result)
    print(result["verdict"])  # last: the one line that says pass, or which kernel failed and where


def _print_unrouted(result: dict) -> None:
    """Qwen3-MoE: the expert Linears no calibration token was routed to (not audited, not counted)."""
    from requant.audit.report import unrouted_lines

    for line in unrouted_lines(result):
        print(line)


def _print_detection(detection: list, title: str) -> None:
    t = Table(title=title)
    t.add_column("fault")
    for sev in ("one", "1pct", "all"):
        for regime in REGIMES:
            t.add_column(f"{sev} {regime}", justify="right")
    det = {(d["fault"], d["severity"], d["regime"]): d for d in detection}
    for fam in sorted({d["fault"] for d in detection}):
        cells = []
        for sev in ("one", "1pct", "all"):
            for regime in REGIMES:
                d = det.get((fam, sev, regime))
                cells.append("" if d is None else f"{d['detected']}/{d['observable']}")
        t.add_row(fam, *cells)
    out.print(t)


def scorecard_line(label: str, cells, card: dict) -> str:
    """The scorecard's line: false positives and negatives (what fails an audit), then the
    applicability mismatches apart, as what they are (the JSON keeps applicability_mismatches):
    checks whose applicability differs from the matrix's, a fact about the checkpoint (native
    scales already powers of two make C5 apply under native), never counted against the run."""
    line = f"{label}: {cells}  false positives: {card['false_positives']}  false negatives: {card['false_negatives']}"
    n = card.get("applicability_mismatches") or 0
    if n:
        line += (
            f"  ({n:,} checks whose applicability differs from the matrix's: a fact about the checkpoint, not a fault)"
        )
    return line


def _print_rest(result: dict) -> None:
    from requant.audit.phases.prefill import pow2_native_note

    card = result["scorecard"]
    note = pow2_native_note(result)
    if note:
        print(f"note: {note}")
    print(scorecard_line("cells", result["cells"], card))
    dec = result.get("decode")
    if dec:
        print(scorecard_line("decode cells", dec["cells"], dec["scorecard"]))
    inj = result.get("injection_scorecard")
    if inj:
        print(
            f"injection ({inj['scored']} scored C7 verdicts, matrix v{inj['matrix_version']}): false positives: "
            f"{inj['false_positives']}  false negatives: {inj['false_negatives']}"
        )
        for fam, regs in result["injection"].items():
            print(
                f"  {fam}: "
                + "; ".join(
                    f"{r}: {m['changed_prompts']}/{m['prompts']} prompts changed, C7 {m['c7_flagged']}/{m['tokens']} flagged"
                    f" (one layer: {m['one_layer']['changed_prompts']} changed, {m['one_layer']['c7_flagged']} flagged)"
                    for r, m in regs.items()
                )
            )
    print("max ULP by fault: " + ", ".join(f"{k}={v}" for k, v in result["max_ulp_by_fault"].items()))
    e2e = result["end_to_end"]
    print("end to end (C7 tokens flagged): " + ", ".join(f"{r}: {e['flagged']}/{e['tokens']}" for r, e in e2e.items()))
    print(
        f"matrix sha256: {card['matrix_sha256']} ({'pinned' if card['matrix_pinned'] else 'NOT PINNED'})  wall: {result['wall_seconds']} s"
        + (f"  peak GPU memory: {peak / 2**30:.1f} GiB" if (peak := result.get("peak_gpu_memory_bytes")) else "")
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


def _check_report_dir(report: Optional[Path]) -> None:
    """--report DIR before any work: a directory in which each report file can be written."""
    if report is not None:
        from requant.audit.report import REPORT_FILES

        check_output_dir(report, "--report", REPORT_FILES)


def _write_outputs(result: dict, json_out: Optional[Path], report: Optional[Path], command: str) -> list[Path]:
    """--json and --report's files as one set, all or nothing (requant.output.write_files_atomic);
    the --report files are the ones returned, to be named."""
    from requant.audit.report import report_items
    from requant.audit.suite import collector_paused

    with collector_paused():  # half a million row dicts at 30B-A3B (audit.suite.collector_paused)
        data = json_bytes(result, row_lines=True)  # once for both (an MoE audit's is 200 MB)
    items = [(json_out, lambda tmp: tmp.write_bytes(data))] if json_out is not None else []
    items += report_items(result, report, command, data) if report is not None else []
    with cannot_run(interrupted="interrupted; no --json or --report file was written"):
        written = write_files_atomic(items) if items else []
    return written[1:] if json_out is not None else written


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
        typer.Option(
            "--matrix",
            help="Pinned prediction matrix: v2 (C1..C8, default), v1 (C1..C7, the paper's), v3 or v4 (v2 + injection).",
        ),
    ] = "v2",
    phases: Annotated[
        str,
        typer.Option(
            "--phases", help="prefill, or prefill,decode (default): the decode phase audits each step's operands."
        ),
    ] = "prefill,decode",
    decode_batches: Annotated[
        str, typer.Option("--decode-batches", help="Decode batch sizes M, comma-separated.")
    ] = "1,8",
    decode_tokens: Annotated[int, typer.Option("--decode-tokens", help="Decode steps audited per batch size.")] = 4,
    injection: Annotated[
        Optional[bool],
        typer.Option(
            "--injection/--no-injection",
            help="Inject each fault kernel into the generating model (default: no; ~14 s of CPU for the default).",
        ),
    ] = None,
    injection_tokens: Annotated[
        Optional[int],
        typer.Option("--injection-tokens", help="Greedy tokens per prompt (default 32 on a GPU, 8 on CPU)."),
    ] = None,
    order: Annotated[
        Optional[str],
        typer.Option(
            "--order",
            help="Epilogue order a MODULE:FUNCTION backend declares (cutlass-order, triton-order, fused-order); "
            "default: the order conform's fingerprint names.",
        ),
    ] = None,
) -> None:
    """Bitwise CUTLASS-vs-Triton comparison per Linear on real activations, and the
    fault-injection suite scored against the pinned prediction matrix."""
    if not plan and needs_child(is_custom(backends or "")):
        run_in_child("audit")  # a user kernel runs in a child; the verdict is given here
    with cannot_run():
        check_output_file(json_out, "--json")  # before any work: a bad path costs nothing and writes nothing
        _check_report_dir(report)
        if plan:
            from requant.audit.suite import plan_from_config

            config, where = _load_config(ckpt)
            p = plan_from_config(config)
            _print_plan(p, where)
            if json_out is not None:
                write_json_atomic(json_out, p)
            return
        from requant.audit.capture import prompts as prompt_list
        from requant.audit.cells import CELLS_PER_LAYER
        from requant.audit.pair import resolve_pair
        from requant.checkpoint import open_checkpoint
        from requant.runtime import check_layout

        dev = check_device(device or default_device())
        spec = backends or ("cutlass,triton" if dev.startswith("cuda") else "reference")
        pair = parse_backends(spec)
        check_runnable(pair, dev, "reference")
        phase_list, batch_list = _parse_phases(phases, decode_batches, decode_tokens)
        do_inject = bool(injection)
        if injection_tokens is not None and injection_tokens < 1:
            raise UsageError("--injection-tokens must be at least 1")
        set_threads(threads, dev)
        resolved = resolve_pair(pair, order, dev)  # which kernel, which declared order
        custom = resolved.custom
        if resolved.failure is not None:  # a finding, not a refusal: recorded, then exit 1
            _fail_fingerprint(resolved.failure, custom, ckpt, spec, pair, dev, json_out)
        pair = resolved.kernels
        from requant.audit.catalogue.matrix import baseline_variant, load_matrix, matrix_path

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
        longest = max(len(tok.encode(t)) for t in prompt_list(prompts))
        _check_limits(
            checkpoint.config, dev, longest, prompts, phase_list, batch_list, decode_tokens, do_inject, injection_tokens
        )
        identity = with_progress(
            checkpoint, console
        )  # before the long run: a SHA256SUMS that does not match fails here

    from requant.audit.suite import run_audit

    total = len(checkpoint.quantized_linears) * CELLS_PER_LAYER
    if "decode" in phase_list:
        total += len(checkpoint.quantized_linears) * CELLS_PER_LAYER * len(batch_list) * decode_tokens
    console.print(
        f"auditing {plain(checkpoint.path)} with {plain(pair[0])} vs {plain(pair[1])} on {dev}: {len(checkpoint.quantized_linears)} Linears, {total} cells"
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
                on_phase=lambda msg: progress.console.log(plain(msg)),
                phases=phase_list,
                decode_batches=batch_list,
                decode_steps=decode_tokens,
                injection={"tokens": injection_tokens} if do_inject else None,
            )
    if custom:
        result["custom_kernels"] = custom
    command = echo_command("audit", {"--backends": spec})
    result["command"] = command
    for f in _write_outputs(result, json_out, report, command):
        console.print(f"wrote {plain(f)}")
    _print_summary(result)
    raise deliver(0 if audit_passed(result) else EXIT_FAILED)


def _fail_fingerprint(fail: dict, custom: dict, ckpt, spec: str, pair, dev: str, json_out: Optional[Path]) -> None:
    """A MODULE:FUNCTION kernel whose fingerprint names no legal formula: the JSON records the
    verdict (written first), one line says it, exit 1 (requant.audit.pair)."""
    from requant.audit.pair import failure_line

    line = failure_line(fail)
    if json_out is not None:
        result = {
            "tool": "requant audit",
            "checkpoint": str(ckpt) if ckpt is not None else "(embedded default)",
            "backends": list(pair),
            "device": dev,
            "verdict": "failed: a kernel implements no legal epilogue formula",
            "fingerprint_failure": {**fail, "line": line},
            "custom_kernels": custom,
            "command": echo_command("audit", {"--backends": spec}),
        }
        write_json_atomic(json_out, result)
        console.print(f"wrote {plain(json_out)}")
    print(line)
    raise deliver(EXIT_FAILED)


def audit_passed(result: dict) -> bool:
    """Exit 0: every scorecard pinned, no false positive or negative, no kernel fault, every pow2
    layer bitwise equal, in prefill and (when run) in decode; the injection's scorecard the same
    way (requant.audit.report.verdict)."""
    from requant.audit.report import verdict

    return verdict(result)[0]


def _check_limits(config, dev, longest, prompts, phases, batches, decode_tokens, inject, injection_tokens) -> None:
    """Positions and memory of the decode phase and the injection, before any work (requant.commands._limits)."""
    from requant.audit.phases.injection import DEFAULT_TOKENS

    if "decode" in phases:
        what = f"the longest audit prompt ({longest} tokens) + {decode_tokens} decode steps"
        check_positions(config, longest + decode_tokens, f"--decode-tokens {decode_tokens}", what)
        opt = f"--decode-batches {max(batches)} with --decode-tokens {decode_tokens}"
        # per step both backends' logits rows, and the operands of every Linear (about as many bytes)
        check_generation_memory(config, max(batches), longest + decode_tokens, dev, opt, kept_steps=3 * decode_tokens)
    if inject:
        from requant.audit.phases.injection import runs_per_batch

        cuda = str(dev).startswith("cuda")
        n = injection_tokens or DEFAULT_TOKENS["cuda" if cuda else "cpu"]
        what = f"the longest audit prompt ({longest} tokens) + {n} injection tokens"
        check_positions(config, longest + n, f"--injection-tokens {n}", what)
        rows = prompts * runs_per_batch(prompts, cuda)  # on CUDA the teacher-forced runs go in batches
        check_generation_memory(config, rows, longest + n, dev, f"--injection-tokens {n}", kept_steps=2 * n)


def _parse_phases(phases: str, batches: str, tokens: int) -> tuple[tuple[str, ...], tuple[int, ...]]:
    names = tuple(p.strip() for p in phases.split(",") if p.strip())
    if not names or "prefill" not in names or any(p not in ("prefill", "decode") for p in names):
        raise UsageError(f"--phases takes prefill or prefill,decode, got {phases!r}")
    try:
        ms = tuple(int(b) for b in batches.split(",") if b.strip())
    except ValueError:
        raise UsageError(f"--decode-batches takes comma-separated integers, got {batches!r}") from None
    if "decode" in names and (not ms or min(ms) < 1 or len(set(ms)) != len(ms)):
        raise UsageError(f"--decode-batches takes distinct sizes >= 1, got {batches!r}")
    from requant.commands._limits import MAX_BATCH

    if "decode" in names and max(ms) > MAX_BATCH:
        raise UsageError(f"--decode-batches {max(ms)}: more than the {MAX_BATCH:,} sequences requant runs at once")
    if "decode" in names and tokens < 1:
        raise UsageError("--decode-tokens must be at least 1")
    return tuple(dict.fromkeys(names)), ms
