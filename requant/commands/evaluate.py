"""`requant eval`: perplexity of a checkpoint's scale arms through lm-eval, with paired intervals.

    requant eval [CKPT] [--arms native,nearest,ceiling,mse,probe] [--source BF16_DIR]
                 [--tasks requant-heldout] [--backend NAME] [--act-backend NAME] [--limit N]
                 [--bootstrap 2000] [--seed 0] [--batch-size 4] [--max-length N]
                 [--json OUT] [--report DIR] [--device DEV] [--threads N]
                 [--engine auto|fast|reference|portable] [--byte-tokens]

No CKPT: the embedded default. Exit status 0 when the evaluation ran; 2 on a usage or
checkpoint error (one line on stderr, no traceback), a SHA256SUMS that does not match the
checkpoint's files included (checked before any arm runs). The JSON ties the numbers to
the checkpoint's bytes and to the code (requant.evidence.identity: manifest, manifest_digest,
tool_version, git_commit), as the audit's does. Progress (a bar over documents per
arm) and messages go to stderr; the table to stdout.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from requant.commands._common import (
    ByteTokensOpt,
    CkptArg,
    DeviceOpt,
    EngineOpt,
    JsonOpt,
    ReportOpt,
    ThreadsOpt,
    byte_tokens_option,
    cannot_run,
    check_device,
    check_engine,
    check_output_dir,
    check_output_file,
    default_device,
    echo_command,
    err,
    out,
    plain,
    progress_bar,
    warn,
)
from requant.eval.report import REPORT_FILES, fmt_number, report_items
from requant.io.output import json_bytes, write_files_atomic

console = err()
DEFAULT_ARMS = "native,nearest,ceiling,mse,probe"


def _print_table(result: dict) -> None:
    stdout = out()
    if not result.get("primary_task"):
        stdout.print("no perplexity task: lm-eval metrics are in the JSON (per_task)")
        return
    t = Table(title=f"{plain(result['primary_task'])}: {result['documents']} documents, 90% paired bootstrap vs native")
    for col in ("arm", "word ppl", "byte ppl", "bits/byte", "Δ word ppl", "90% interval"):
        t.add_column(col, justify="left" if col in ("arm", "90% interval") else "right")
    for name in result["arm_order"]:
        a = result["arms"][name]
        ci = a.get("ci90")
        t.add_row(
            name + ("" if result["servable"].get(name, True) else " (not servable)"),
            fmt_number(a["word_perplexity"]),
            fmt_number(a["byte_perplexity"]),
            fmt_number(a["bits_per_byte"]),
            "-" if a.get("delta_pct") is None else f"{a['delta_pct']:+.3f}%",
            "-" if not ci else f"[{ci[0]:+.3f}%, {ci[1]:+.3f}%]",
        )
    stdout.print(t)
    share = result["decomposition"].get("probe_mismatch_share")
    if share is not None:
        ci = result["decomposition"].get("ci90")
        stdout.print(
            f"probe mismatch share: {share:.4f}" + (f" (90% interval [{ci[0]:.4f}, {ci[1]:.4f}])" if ci else "")
        )


@contextlib.contextmanager
def _stopped(progress):
    """The progress bar stopped at the end if a bar started it (see progress_for)."""
    try:
        yield
    finally:
        if progress.live.is_started:
            progress.stop()


def _check_report_dir(report: Optional[Path]) -> None:
    """--report DIR before any work: a directory in which each report file can be written."""
    if report is not None:
        check_output_dir(report, "--report", REPORT_FILES)


def _write_outputs(result: dict, json_out: Optional[Path], report: Optional[Path]) -> list[Path]:
    """--json and --report's files as one set, all or nothing (requant.output.write_files_atomic)."""

    items = [(json_out, lambda tmp: tmp.write_bytes(json_bytes(result)))] if json_out is not None else []
    items += report_items(result, report) if report is not None else []
    with cannot_run(interrupted="interrupted; no --json or --report file was written"):
        return write_files_atomic(items) if items else []


@byte_tokens_option
def eval_command(
    ckpt: CkptArg = None,
    arms: Annotated[
        str,
        typer.Option(
            "--arms",
            help="Comma-separated: native and converter arms (unconstrained, nearest, ceiling, mse, probe); native is always included.",
        ),
    ] = DEFAULT_ARMS,
    source: Annotated[
        Optional[Path],
        typer.Option("--source", help="The unquantized bf16 Qwen3 directory: adds a 'bf16' row (dense Linears)."),
    ] = None,
    tasks: Annotated[
        str,
        typer.Option(
            "--tasks",
            help="Comma-separated lm-eval tasks; requant-heldout is shipped and offline, others need lm-eval's datasets.",
        ),
    ] = "requant-heldout",
    backend: Annotated[
        Optional[str],
        typer.Option(
            "--backend", help="The scaled_mm backend (default: triton on a GPU, reference-triton-order on CPU)."
        ),
    ] = None,
    act_backend: Annotated[str, typer.Option("--act-backend", help="The quantize_activations backend.")] = "reference",
    limit: Annotated[
        Optional[int], typer.Option("--limit", help="Score only the first N documents of each task.")
    ] = None,
    bootstrap: Annotated[
        int, typer.Option("--bootstrap", help="Paired bootstrap replicates (resampling documents).")
    ] = 2000,
    seed: Annotated[int, typer.Option("--seed", help="Bootstrap seed.")] = 0,
    batch_size: Annotated[int, typer.Option("--batch-size", help="Windows per runtime call.")] = 4,
    max_length: Annotated[
        Optional[int],
        typer.Option("--max-length", help="Rolling window length in tokens (default: the model's max_length)."),
    ] = None,
    json_out: JsonOpt = None,
    report: ReportOpt = None,
    device: DeviceOpt = None,
    threads: ThreadsOpt = None,
    engine: EngineOpt = "auto",
    byte_tokens: ByteTokensOpt = False,
) -> None:
    """Perplexity of each scale arm through lm-eval, with paired bootstrap intervals against native."""
    with cannot_run():  # before any work (an hour of CPU with the defaults): a bad path costs nothing
        check_output_file(json_out, "--json")
        _check_report_dir(report)
    from rich.progress import TextColumn

    from requant.eval.run import parse_arms, run_eval

    task_list = [t.strip() for t in tasks.split(",") if t.strip()]
    progress = progress_bar(console, TextColumn("{task.fields[unit]}"))
    bars: dict[str, int] = {}

    def progress_for(arm: str, unit: str = "documents"):
        def update(done: int, total: int) -> None:
            if arm not in bars:
                if not progress.live.is_started:  # started by its first bar: an error before any prints no blank line
                    progress.start()
                bars[arm] = progress.add_task(arm, total=total, unit=unit)
            progress.update(bars[arm], completed=done, total=total)

        return update

    with cannot_run():  # the runtime or the LM refusing a checkpoint or a model argument: ValueError
        arm_list = parse_arms(arms)
        if device is not None:
            check_device(device)
        check_engine(engine, device or default_device())
        with _stopped(progress):
            result = run_eval(
                ckpt,
                arm_list,
                source=None if source is None else str(source),
                tasks=task_list,
                backend=backend,
                act_backend=act_backend,
                device=device,
                limit=limit,
                replicates=bootstrap,
                seed=seed,
                batch_size=batch_size,
                max_length=max_length,
                progress_for=progress_for,
                threads=threads,
                engine=engine,
                on_phase=lambda msg: progress.console.print(plain(msg)),
                hash_progress=progress_for("manifest digest (sha256 of every file)", "bytes"),
            )
    result["command"] = echo_command("eval")
    for f in _write_outputs(result, json_out, report):
        console.print(f"wrote {plain(f)}")
    _print_table(result)
    for w in result.get("warnings", []):
        warn(w)
