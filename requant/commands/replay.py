"""`requant replay`: re-run a `requant generate` record and compare it bit for bit.

    requant replay RECORD [--checkpoint CKPT] [--backend NAME] [--engine auto|fast|reference|portable]
                   [--batch-with N] [--device DEV] [--json OUT] [--threads N] [--byte-tokens]

RECORD: the JSON-lines file `requant generate --json` wrote (every record of it is replayed, as one batch).
Its checkpoint (or --checkpoint's copy) must have the record's manifest digest and tokenizer, or the replay
is refused (exit 2) before anything runs. The settings come from the record; --backend, --engine and
--batch-with N may change the kernel or the batch around it.
Every step is compared: the token, then the digest of the fp32 logits row, then the logprob.
One line a record on stdout (the first differing step and position, and what differs: the token,
or only the logits); --json writes the result. Exit status: 0 every step of every record matches
bit for bit; 1 a step differs; 2 could not run (a malformed record naming the line and field,
another checkpoint or tokenizer than the record's, a backend that cannot run here); 130 interrupted.

Which settings, and what --backend, --engine and --batch-with may change:
docs/runtime.md#verifiable-generation.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from requant.backends import check_runnable
from requant.commands._common import (
    EXIT_FAILED,
    ByteTokensOpt,
    DeviceOpt,
    ThreadsOpt,
    UsageError,
    byte_tokens_option,
    cannot_run,
    check_device,
    check_engine,
    check_output_file,
    check_outputs,
    default_device,
    echo_command,
    err,
    plain,
    printable,
    set_threads,
    write_json_atomic,
)
from requant.commands._limits import check_generation_memory, max_positions
from requant.evidence.identity import with_progress
from requant.evidence.manifest import REPORTS
from requant.models.tokenizer import summary

__all__ = ["replay"]


def _portable_choice(record, first, be: str, eng: str, dev: str, backend_given: bool) -> tuple[str, str]:
    """A record of the portable arithmetic replays on the portable engine only; on a CPU its GPU
    kernel's epilogue order is the reference emulation of it (kernels.EMULATION_OF)."""
    from requant import kernels

    if eng != "portable":
        raise UsageError(
            f"{record}: made by the portable arithmetic ({first['arithmetic']}); --engine {eng} computes "
            "other bits (use --engine portable)"
        )
    if not str(dev).startswith("cuda") and be in ("cutlass", "triton", "cublas") and not backend_given:
        be = kernels.EMULATION_OF[be]
    return be, eng


@byte_tokens_option
def replay(
    record: Annotated[
        Path,
        typer.Argument(help="A record written by `requant generate --json`.", show_default=False, metavar="RECORD"),
    ],
    checkpoint: Annotated[
        Optional[str], typer.Option("--checkpoint", help="The checkpoint, when not at the record's path.")
    ] = None,
    backend: Annotated[
        Optional[str], typer.Option("--backend", help="The scaled_mm backend (default: the record's).")
    ] = None,
    engine: Annotated[
        Optional[str], typer.Option("--engine", help="auto, fast, reference or portable (default: the record's).")
    ] = None,
    batch_with: Annotated[int, typer.Option("--batch-with", help="Run inside a batch with N filler prompts.")] = 0,
    device: DeviceOpt = None,
    json_out: Annotated[
        Optional[Path], typer.Option("--json", help="Write the comparison report (JSON) here (atomically).")
    ] = None,
    threads: ThreadsOpt = None,
    byte_tokens: ByteTokensOpt = False,
) -> None:
    """Re-run a generation record (optionally on another kernel, inside a batch) and compare every
    token and logits digest bit for bit."""
    console = err()
    with cannot_run():
        check_output_file(json_out, "--json")
        from requant import DEFAULT_CHECKPOINT, kernels
        from requant.checkpoint import open_checkpoint
        from requant.runtime import check_layout, load_model
        from requant.runtime.generation import (
            filler_prompts,
            first_difference,
            first_token_difference,
            read_records,
            record_params,
        )

        records = read_records(record)
        first = records[0]
        if batch_with < 0:
            raise UsageError("--batch-with must be >= 0")
        from requant.commands._limits import MAX_BATCH

        if batch_with + len(records) > MAX_BATCH:
            raise UsageError(
                f"--batch-with {batch_with}: a batch of more than the {MAX_BATCH:,} sequences requant runs"
            )
        dev = check_device(device or default_device())
        be = backend or first["backend"]
        known = ", ".join(kernels.scaled_mm_backends())
        eng = engine or first["engine"]
        if first.get("arithmetic") is not None:
            be, eng = _portable_choice(record, first, be, eng, dev, backend is not None)
        if be not in kernels.scaled_mm_backends():
            if backend is None:  # the record's: say where it came from
                raise UsageError(
                    f"{first['where']}: field 'backend' is {be[:40]!r}, not a backend here (known: {known}); give --backend"
                )
            raise UsageError(f"--backend: unknown backend {be!r}; known: {known}")
        if first["act_backend"] not in kernels.quantize_backends():
            raise UsageError(
                f"{first['where']}: field 'act_backend' is {first['act_backend'][:40]!r}; known: "
                f"{', '.join(kernels.quantize_backends())}"
            )
        check_runnable((be,), dev, first["act_backend"], option="--backend")
        check_engine(eng, dev)
        set_threads(threads, dev)
        src = checkpoint or first.get("checkpoint") or DEFAULT_CHECKPOINT
        if checkpoint is None and first.get("checkpoint") and Path(str(first.get("checkpoint_path"))).is_dir():
            src = first["checkpoint_path"]  # the directory it ran on (a relative path was relative to that cwd)
        ckpt = open_checkpoint(src, revision=None if checkpoint else first.get("revision"))
        if json_out is not None:  # the checkpoint named inside the record is an input too
            check_outputs([("--json", json_out, None)], [("the record's checkpoint", ckpt.path, REPORTS)])
        check_layout(ckpt)
        from requant.runtime.generation import check_against_model

        check_against_model(records, int(ckpt.config["vocab_size"]), max_positions(ckpt.config))
        longest = max(len(r["prompt_ids"]) for r in records) + first["max_new_tokens"]
        check_generation_memory(ckpt.config, batch_with + len(records), longest, dev, f"--batch-with {batch_with}")
        identity = with_progress(ckpt, console)
        if identity["manifest_digest"] != first["manifest_digest"]:
            raise UsageError(
                f"{record}: the checkpoint's bytes are not the record's: {src} has manifest digest "
                f"{identity['manifest_digest']}, the record {first['manifest_digest']}"
            )
        model = load_model(
            ckpt,
            regime=first["regime"],
            backend=be,
            act_backend=first["act_backend"],
            device=dev,
            reduction=first["reduction"],
            engine=eng,
        )
        tok = model.tokenizer
        if tok.describe() != first["tokenizer"]:
            raise UsageError(
                f"{record}: the tokenizer is not the record's: {summary(tok.describe())} here, "
                f"{summary(first['tokenizer'])} in the record"
            )
        fill_ids, fill_params = filler_prompts(tok, batch_with)
        params = [record_params(r, r["where"]) for r in records]

    from requant.runtime.generation import describe_difference
    from requant.runtime.sampling import generate as sample

    t0 = time.perf_counter()
    with cannot_run():
        out = sample(
            model,
            fill_ids + [r["prompt_ids"] for r in records],
            fill_params + params,
            first["max_new_tokens"],
            eos_id=first["eos_ids"] or None,
        )[batch_with:]
    wall = time.perf_counter() - t0
    results = []
    for i, (rec, s) in enumerate(zip(records, out)):
        diff = first_difference(rec, s)
        token_step = first_token_difference(rec, s)
        line = describe_difference(i, rec, diff, token_step)
        print(printable(line))
        results.append(
            {
                "index": i,
                "key": rec["key"],
                "match": diff is None,
                "first_difference": diff,
                "first_token_difference": token_step,
                "line": line,
            }
        )
    ok = all(r["match"] for r in results)
    engine_ran = model.engine
    if len(records) > 1:
        print(f"replay: {sum(r['match'] for r in results)}/{len(records)} records match bit for bit")
    console.print(
        f"replayed {len(records)} record(s) with {plain(be)} ({engine_ran} engine) on {dev}, "
        f"batch of {batch_with + len(records)}, in {wall:.2f} s"
    )
    if json_out is not None:
        result = {
            "tool": "requant replay",
            "record": str(record),
            "checkpoint": str(ckpt.path),
            **identity,
            "recorded": {
                "backend": first["backend"],
                "engine": first["engine"],
                "device": first.get("device"),
                "arithmetic": first.get("arithmetic"),
            },
            "backend": be,
            "epilogue_order": kernels.emulation_of(be),
            "engine": engine_ran,
            "device": dev,
            "batch_with": batch_with,
            "records": results,
            "ok": ok,
            "command": echo_command("replay"),
        }
        with cannot_run():
            write_json_atomic(json_out, result)
        console.print(f"wrote {plain(json_out)}")
    if not ok:
        raise typer.Exit(EXIT_FAILED)
