"""`requant determinism`: greedy generations across a backend pair, native and pow2.

    requant determinism [CKPT] [--backends cutlass,triton | reference | A,MODULE:FUNCTION] [--prompts 8]
                        [--new-tokens 64] [--json OUT] [--device DEV] [--act-backend NAME]
                        [--revision REV] [--threads N] [--engine auto|fast|reference|portable] [--byte-tokens]

No CKPT: the embedded default. `--backends reference` is the pair
reference-cutlass-order,reference-triton-order (the default without a CUDA GPU); with one,
the default pair is cutlass,triton. Markdown on stdout, ending with the summary line
("pow2: 8/8 identical; native: k/8"); progress on stderr; `--json` writes the record
atomically. Exit status: 0 when pow2 is identical across the pair for every prompt and
every prompt decodes the same alone as inside the batch (both regimes, both backends);
1 when it ran but one of those failed; 2 on a usage or checkpoint error (one line), a
SHA256SUMS that does not match the checkpoint's files included (checked before the run).
The JSON ties the generations to the checkpoint's bytes and to the code
(requant.evidence.identity: manifest, manifest_digest, tool_version, git_commit), as the audit's does.
"""

from __future__ import annotations

from typing import Annotated

import typer

from requant import DEFAULT_CHECKPOINT
from requant.backends import check_runnable, is_custom, parse_backends
from requant.commands._common import (
    EXIT_FAILED,
    BackendsOpt,
    ByteTokensOpt,
    CkptArg,
    DeviceOpt,
    EngineOpt,
    JsonOpt,
    RevisionOpt,
    ThreadsOpt,
    UsageError,
    byte_tokens_option,
    cannot_run,
    check_device,
    check_engine,
    check_output_file,
    default_device,
    echo_command,
    err,
    plain,
    printable,
    progress_bar,
    set_threads,
    write_json_atomic,
)
from requant.commands._isolate import deliver, needs_child, run_in_child
from requant.commands._limits import check_positions
from requant.evidence.identity import with_progress
from requant.models.prompts import prompts as prompt_list
from requant.models.tokenizer import load_tokenizer


@byte_tokens_option
def determinism(
    ckpt: CkptArg = None,
    backends: BackendsOpt = None,
    prompts: Annotated[int, typer.Option("--prompts", help="Built-in calibration prompts to decode (1-16).")] = 8,
    new_tokens: Annotated[
        int, typer.Option("--new-tokens", help="Tokens to generate per prompt (greedy, no stop at eos).")
    ] = 64,
    json_out: JsonOpt = None,
    device: DeviceOpt = None,
    act_backend: Annotated[
        str,
        typer.Option(
            "--act-backend",
            help="The quantize_activations backend shared by both sides (reference or triton: the same bits).",
        ),
    ] = "reference",
    revision: RevisionOpt = None,
    threads: ThreadsOpt = None,
    engine: EngineOpt = "auto",
    byte_tokens: ByteTokensOpt = False,
) -> None:
    """Greedy generations with each backend of the pair, native and pow2: byte-identical or not,
    and each prompt alone vs inside the batch."""
    if needs_child(is_custom(backends or "")):
        run_in_child("determinism")  # a user kernel runs in a child; the verdict is given here
    console = err()
    with cannot_run():
        check_output_file(json_out, "--json")  # before any work: a bad path costs nothing and writes nothing
        from requant.audit.pair import resolve_pair
        from requant.checkpoint import open_checkpoint
        from requant.determinism import all_scales_pow2, run_determinism, work_units
        from requant.runtime import check_layout

        dev = check_device(device or default_device())
        spec = backends or ("cutlass,triton" if dev.startswith("cuda") else "reference")
        pair = parse_backends(spec)
        check_runnable(pair, dev, act_backend)
        if new_tokens < 1:
            raise UsageError("--new-tokens must be at least 1")
        check_engine(engine, dev)
        prompt_list(prompts)  # validate N before loading (or downloading) anything big
        set_threads(threads, dev)
        # a MODULE:FUNCTION kernel runs conform's cases first: one that cannot run is refused here
        resolved = resolve_pair(pair, None, dev, require_order=False)
        custom, pair = resolved.custom, resolved.kernels
        checkpoint = open_checkpoint(DEFAULT_CHECKPOINT if ckpt is None else ckpt, revision=revision)
        check_layout(checkpoint)

        tok = load_tokenizer(checkpoint.path, int(checkpoint.config["vocab_size"]))
        longest = max(len(tok.encode(t)) for t in prompt_list(prompts))
        what = f"the longest prompt ({longest} tokens) + {new_tokens} new tokens"
        check_positions(checkpoint.config, longest + new_tokens, f"--new-tokens {new_tokens}", what)
        units = work_units(prompts, 1 if all_scales_pow2(checkpoint) else 2)
        identity = with_progress(
            checkpoint, console
        )  # before the long run: a SHA256SUMS that does not match fails here

    console.print(
        f"determinism of {plain(checkpoint.path)}: {plain(pair[0])} vs {plain(pair[1])} on {dev}, {prompts} prompts x {new_tokens} tokens"
    )
    with cannot_run():  # e.g. a tokenizer the model cannot embed, an unknown act backend
        with progress_bar(console) as progress:
            task = progress.add_task("greedy runs", total=units)
            result = run_determinism(
                checkpoint,
                pair,
                prompts,
                new_tokens,
                dev,
                act_backend=act_backend,
                identity=identity,
                engine=engine,
                advance=lambda n=1: progress.advance(task, n),
                on_phase=lambda msg: progress.console.log(plain(msg)),
            )
    if custom:
        result["custom_kernels"] = custom
    result["command"] = echo_command("determinism", {"--backends": spec})
    if json_out is not None:
        with cannot_run():
            write_json_atomic(json_out, result)
        console.print(f"wrote {plain(json_out)}")
    from requant.determinism import markdown

    print(printable(markdown(result, result["command"]), keep="\n"))
    print(result["summary"])
    raise deliver(0 if result["ok"] else EXIT_FAILED)
