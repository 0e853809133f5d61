"""`requant tp-check`: greedy generation and prefill logits at each tensor-parallel degree,
compared bit for bit with TP 1.

    requant tp-check [CKPT] [--tp 1,2,4] [--backend NAME] [--regime native|pow2]
                     [--reduce int32|bf16] [--new-tokens N] [--prompts N] [--json OUT]
                     [--device cpu|cuda] [--comm gloo|nccl] [--act-backend NAME] [--threads N] [--timeout S]

--reduce int32 (default) all-reduces the row-parallel Linears' int32 accumulators before the epilogue
(exact: every degree gives the TP-1 bits); bf16 all-reduces bf16 partial outputs, for contrast.
stdout: one line per degree, then the summary line
(`tp 1,2,4: logits and tokens bitwise identical`). Exit status: 0 identical at every degree,
1 when a degree differs, 2 when it could not run (usage, a checkpoint the degrees do not fit,
a backend the device cannot run, a worker that failed or timed out; one `error:` line).

What is launched, what is compared and the --json record: docs/tensor-parallel.md#the-command.
"""

from __future__ import annotations

import math
from typing import Annotated, Optional

import typer

from requant.backends import check_runnable, default_backend, environment
from requant.commands._common import (
    EXIT_FAILED,
    CkptArg,
    DeviceOpt,
    JsonOpt,
    RevisionOpt,
    ThreadsOpt,
    UsageError,
    cannot_run,
    check_device,
    check_output_file,
    default_device,
    echo_command,
    err,
    fail,
    plain,
    progress_bar,
    set_threads,
    sigterm_as_interrupt,
    write_json_atomic,
)
from requant.evidence.identity import with_progress
from requant.models.prompts import prompts as prompt_list
from requant.models.tokenizer import load_tokenizer
from requant.regime import check_regime

__all__ = ["tp_check", "parse_degrees", "summary_line"]


def parse_degrees(spec: str) -> tuple[int, ...]:
    """'1,2,4' -> (1, 2, 4) (sorted, unique, TP 1 added); UsageError naming --tp otherwise."""
    try:
        degrees = {int(s) for s in spec.split(",") if s.strip()}
    except ValueError:
        raise UsageError(f"--tp takes comma-separated positive integers, got {spec!r}") from None
    if not degrees or min(degrees) < 1:
        raise UsageError(f"--tp takes comma-separated positive integers, got {spec!r}")
    return tuple(sorted(degrees | {1}))


def _where(c: dict) -> str:
    parts = []
    if c["logits_first_diff"] is not None:
        f = c["logits_first_diff"]
        parts.append(
            f"prefill logits differ from prompt {f['prompt']} position {f['position']} "
            f"({c['logits_differing']} of {c['logits_total']} values, max |diff| {c['logits_max_abs_diff']:g})"
        )
    else:
        parts.append("prefill logits identical")
    if c["tokens_first_diff"] is not None:
        f = c["tokens_first_diff"]
        parts.append(
            f"tokens differ in {c['prompts_tokens_differ']} prompt(s), first at step {f['step']} of prompt "
            f"{f['prompt']}"
        )
    else:
        parts.append("tokens identical")
    if c["steps_first_diff"] is not None:
        f = c["steps_first_diff"]
        parts.append(f"decode logits differ from step {f['step']}")
    return ", ".join(parts)


def summary_line(degrees: tuple[int, ...], per_degree: list[dict]) -> str:
    tp = ",".join(map(str, degrees))
    bad = [c for c in per_degree if not c["identical"]]
    if not bad:
        return f"tp {tp}: logits and tokens bitwise identical"
    return f"tp {tp}: NOT bitwise identical to tp 1 at tp {','.join(str(c['tp']) for c in bad)}"


def _check_timeout(value: float) -> float:
    """--timeout at parse time: a finite number of seconds, at least a millisecond."""
    if not math.isfinite(value) or value < 1e-3:
        raise typer.BadParameter(f"must be a finite number of seconds >= 0.001, got {value!r}")
    return value


def _check_act_backend(value: str) -> str:
    """--act-backend at parse time: a registered quantize_activations backend."""
    from requant import kernels

    if value not in kernels.quantize_backends():
        raise typer.BadParameter(f"unknown backend {value!r}; known: {', '.join(kernels.quantize_backends())}")
    return value


def _check_parsed(timeout: float, act_backend: str, json_out) -> None:
    """The same checks for a direct call (tests call tp_check() without the parser), and --json
    before the launch: a bad report path costs nothing."""
    try:
        _check_timeout(timeout)
        _check_act_backend(act_backend)
    except typer.BadParameter as exc:
        option = "--timeout" if "seconds" in str(exc) else "--act-backend"
        raise UsageError(f"{option}: {exc}") from None
    check_output_file(json_out, "--json")


def tp_check(
    ckpt: CkptArg = None,
    tp: Annotated[
        str, typer.Option("--tp", help="Tensor-parallel degrees, comma-separated (TP 1 is always run).")
    ] = "1,2",
    backend: Annotated[
        Optional[str],
        typer.Option(
            "--backend", help="The scaled_mm backend (default: triton on a GPU, reference-triton-order on CPU)."
        ),
    ] = None,
    regime: Annotated[
        str, typer.Option("--regime", help="Weight scales: native or pow2 (the nearest arm).")
    ] = "native",
    reduce: Annotated[
        str,
        typer.Option("--reduce", help="Row-parallel all-reduce: int32 accumulators (exact) or bf16 partial outputs."),
    ] = "int32",
    new_tokens: Annotated[int, typer.Option("--new-tokens", help="Greedy tokens per prompt (no stop at eos).")] = 16,
    prompts: Annotated[int, typer.Option("--prompts", help="Built-in calibration prompts (1-16).")] = 4,
    json_out: JsonOpt = None,
    device: DeviceOpt = None,
    act_backend: Annotated[
        str,
        typer.Option(
            "--act-backend",
            help="The quantize_activations backend (reference or triton: the same bits).",
            callback=_check_act_backend,
        ),
    ] = "reference",
    revision: RevisionOpt = None,
    threads: ThreadsOpt = None,
    timeout: Annotated[
        float, typer.Option("--timeout", help="Seconds for the whole launch.", callback=_check_timeout)
    ] = 600.0,
    comm: Annotated[
        str,
        typer.Option(
            "--comm",
            help="Collectives: nccl (one GPU per rank) or gloo (any device; on CUDA ranks share the GPUs); "
            "default nccl on CUDA, gloo on CPU.",
        ),
    ] = "auto",
) -> None:
    """Prefill logits and greedy tokens at each tensor-parallel degree, bitwise against TP 1."""
    console = err()
    with cannot_run():
        from requant import DEFAULT_CHECKPOINT, kernels
        from requant.checkpoint import open_checkpoint
        from requant.runtime import arch_from_config, check_layout
        from requant.tp import REDUCES, LaunchConfig, check_degree

        dev = check_device(device or default_device())
        cuda = dev.startswith("cuda")
        if cuda and dev != "cuda":
            raise UsageError(f"--device {dev}: tp-check uses one GPU per rank from cuda:0; pass --device cuda")
        degrees = parse_degrees(tp)
        name = backend or default_backend(dev)  # generate's and eval's: one default for one model
        if name not in kernels.scaled_mm_backends():
            raise UsageError(f"--backend: unknown backend {name!r}; known: {', '.join(kernels.scaled_mm_backends())}")
        check_runnable((name,), dev, act_backend, option="--backend")
        check_regime(regime, "--regime")
        if reduce not in REDUCES:
            raise UsageError(f"--reduce must be one of {', '.join(REDUCES)}, got {reduce!r}")
        if new_tokens < 0:
            raise UsageError("--new-tokens must be >= 0")
        _check_parsed(timeout, act_backend, json_out)
        texts = prompt_list(prompts)
        set_threads(threads, dev)
        if comm not in ("auto", "gloo", "nccl") or (comm == "nccl" and not cuda):
            raise UsageError(f"--comm must be gloo, or nccl on a CUDA device, got {comm!r}")
        nccl = cuda and comm != "gloo"
        if nccl:
            import torch

            if torch.cuda.device_count() < max(degrees):
                raise UsageError(
                    f"--tp {max(degrees)} needs {max(degrees)} CUDA devices, this machine has "
                    f"{torch.cuda.device_count()}"
                )
        checkpoint = open_checkpoint(DEFAULT_CHECKPOINT if ckpt is None else ckpt, revision=revision)
        check_layout(checkpoint)
        arch = arch_from_config(checkpoint.config)
        for d in degrees:
            try:
                check_degree(arch, d)
            except ValueError as exc:
                raise UsageError(f"--tp {d}: {checkpoint.path / 'config.json'}: {exc}") from None
        tok = load_tokenizer(checkpoint.path, arch.vocab)
        ids = tuple(tuple(tok.encode(t)) for t in texts)
        if max(len(p) for p in ids) + new_tokens > int(checkpoint.config.get("max_position_embeddings") or 2048):
            raise UsageError("--new-tokens: prompt + new tokens exceed max_position_embeddings")
        identity = with_progress(checkpoint, console)

    run_spec = LaunchConfig(name, regime, reduce, act_backend)
    console.print(
        f"tp-check of {plain(checkpoint.path)}: tp {','.join(map(str, degrees))}, {name}, {regime}, {reduce} all-reduce, "
        f"{'NCCL' if nccl else 'gloo'} on {dev}, {prompts} prompts x {new_tokens} tokens"
    )
    from requant.tp import Spec, compare, run

    spec = Spec(
        str(checkpoint.path),
        ids,
        degrees=degrees,
        runs=(run_spec,),
        new_tokens=new_tokens,
        device="cuda" if cuda else "cpu",
        comm="nccl" if nccl else "gloo",
        threads=threads or 1,
    )
    try:
        # the launch takes seconds before a worker has anything to say (spawn, imports, the load):
        # the audit's bar, one step for the load and one per degree, and each stage's line
        with sigterm_as_interrupt(), progress_bar(console) as bar:
            task = bar.add_task("tp-check", total=1 + len(degrees))
            bar.console.log(f"starting {max(degrees)} process(es)")

            def stage(line: str) -> None:
                bar.console.log(plain(line))
                bar.advance(task)

            results = run(spec, timeout_s=timeout, progress=stage)
    except (RuntimeError, TimeoutError) as exc:
        fail(str(exc))
    except KeyboardInterrupt:
        fail("interrupted; nothing was written", 130)
    base = results[(run_spec, 1)]
    per_degree = []
    for d in degrees:
        r = results[(run_spec, d)]
        per_degree.append({"tp": d, **compare(base, r), "digest": r.digest})
    summary = summary_line(degrees, per_degree)
    identical = all(c["identical"] for c in per_degree)
    if json_out is not None:
        record = {
            "tp": list(degrees),
            "reduce": reduce,
            "identical": identical,
            "summary": summary,
            "per_degree": per_degree,
            "backend": name,
            "act_backend": act_backend,
            "regime": regime,
            "device": dev,
            "collectives": "nccl" if nccl else "gloo",
            "checkpoint": str(checkpoint.path),
            "prompts": prompts,
            "prompt_tokens": [len(p) for p in ids],
            "new_tokens": new_tokens,
            "command": echo_command("tp-check"),
            "environment": environment(dev),
            **identity,
        }
        with cannot_run():
            write_json_atomic(json_out, record)
        console.print(f"wrote {plain(json_out)}")
    for c in per_degree[1:]:
        print(f"tp {c['tp']}: {'bitwise identical to tp 1' if c['identical'] else _where(c)}")
    print(summary)
    if not identical:
        raise typer.Exit(EXIT_FAILED)
