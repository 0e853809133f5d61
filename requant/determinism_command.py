"""`requant determinism`: the typer command (assembled into the CLI by cli.py).

    requant determinism [CKPT] [--backends cutlass,triton | reference] [--prompts 8]
                        [--new-tokens 64] [--json OUT] [--device DEV] [--act-backend NAME]
                        [--revision REV] [--threads N]

No CKPT: the embedded default. `--backends reference` is the pair
reference-cutlass-order,reference-triton-order (the default without a CUDA GPU); with one,
the default pair is cutlass,triton. Markdown on stdout, ending with the summary line
("pow2: 8/8 identical; native: k/8"); progress on stderr; `--json` writes the record
atomically. Exit status: 0 when pow2 is identical across the pair for every prompt and
every prompt decodes the same alone as inside the batch (both regimes, both backends);
1 when it ran but one of those failed; 2 on a usage or checkpoint error (one line), a
SHA256SUMS that does not match the checkpoint's files included (checked before the run).
The JSON ties the generations to the checkpoint's bytes and to the code
(requant.identity: manifest, manifest_digest, tool_version, git_commit), as the audit's does.
"""

from __future__ import annotations

import json
import os
import shlex
import tempfile
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

console = Console(stderr=True)


class UsageError(Exception):
    """A request refused with a message (exit 2)."""


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def write_json_atomic(result: dict, path: Path) -> Path:
    """JSON into a temporary file next to `path`, then renamed over it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(result, indent=1) + "\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def check_devices(pair: tuple[str, str], device: str, act_backend: str) -> None:
    """Refuse a backend the device cannot run, before anything is loaded."""
    if device.startswith("cuda") and not _cuda():
        raise UsageError(f"--device {device}: no CUDA device here")
    if "cutlass" in pair and not device.startswith("cuda"):
        raise UsageError("the cutlass backend needs a CUDA GPU; on CPU use --backends reference")
    interpret = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
    if ("triton" in pair or act_backend == "triton") and not device.startswith("cuda") and not interpret:
        raise UsageError("the triton backend needs a CUDA GPU (or TRITON_INTERPRET=1 on CPU); on CPU use --backends reference")


def determinism(
    ckpt: Annotated[Optional[str], typer.Argument(help="checkpoint directory or Hub repo id (default: the embedded default)")] = None,
    backends: Annotated[Optional[str], typer.Option("--backends", help="two scaled_mm backends 'A,B', or 'reference' (default: cutlass,triton on a GPU, else reference)")] = None,
    prompts: Annotated[int, typer.Option("--prompts", help="built-in calibration prompts to decode (1-16)")] = 8,
    new_tokens: Annotated[int, typer.Option("--new-tokens", help="tokens to generate per prompt (greedy, no stop at eos)")] = 64,
    json_out: Annotated[Optional[Path], typer.Option("--json", help="write the JSON record here (atomically)")] = None,
    device: Annotated[Optional[str], typer.Option("--device", help="torch device (default: cuda if available, else cpu)")] = None,
    act_backend: Annotated[str, typer.Option("--act-backend", help="quantize_activations backend shared by both sides (reference or triton: the same bits)")] = "reference",
    revision: Annotated[Optional[str], typer.Option("--revision", help="Hub revision when CKPT is a repo id")] = None,
    threads: Annotated[Optional[int], typer.Option("--threads", help="torch CPU threads (default: 1 on a CPU device, torch's default otherwise; 0 = torch's default)")] = None,
) -> None:
    """Greedy generations with each backend of the pair, native and pow2: byte-identical or not,
    and each prompt alone vs inside the batch."""
    from requant.errors import CheckpointError

    try:
        import torch

        from requant import DEFAULT_CHECKPOINT
        from requant.audit.suite import parse_backends
        from requant.checkpoint import open_checkpoint
        from requant.prompts import prompts as prompt_list

        spec = backends or ("cutlass,triton" if _cuda() else "reference")
        pair = parse_backends(spec)
        dev = device or ("cuda" if _cuda() else "cpu")
        check_devices(pair, dev, act_backend)
        if new_tokens < 1:
            raise UsageError("--new-tokens must be at least 1")
        prompt_list(prompts)  # validate N before loading (or downloading) anything big
        n_threads = threads if threads is not None else (1 if dev == "cpu" else 0)
        if n_threads < 0:
            raise UsageError("--threads must be >= 0")
        if n_threads:
            # small tensors on CPU: intra-op threads only add contention (see `requant audit --threads`)
            torch.set_num_threads(n_threads)
        checkpoint = open_checkpoint(DEFAULT_CHECKPOINT if ckpt is None else ckpt, revision=revision)
        from requant.determinism import all_scales_pow2, run_determinism, work_units
        from requant.runtime import check_layout

        check_layout(checkpoint)
        units = work_units(prompts, 1 if all_scales_pow2(checkpoint) else 2)
        from requant.identity import with_progress

        identity = with_progress(checkpoint, console)  # before the long run: a SHA256SUMS that does not match fails here
    except (CheckpointError, UsageError, ValueError) as exc:
        console.print(f"[bold red]error:[/bold red] {escape(str(exc))}")
        raise typer.Exit(2) from None

    console.print(f"determinism of {checkpoint.path}: {pair[0]} vs {pair[1]} on {dev}, {prompts} prompts x {new_tokens} tokens")
    try:
        with Progress(TextColumn("[progress.description]{task.description}"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), TimeRemainingColumn(), console=console) as progress:
            task = progress.add_task("greedy runs", total=units)
            result = run_determinism(checkpoint, pair, prompts, new_tokens, dev, act_backend=act_backend, identity=identity,
                                     advance=lambda n=1: progress.advance(task, n),
                                     on_phase=lambda msg: progress.console.log(msg))
    except (CheckpointError, ValueError, KeyError) as exc:  # e.g. a tokenizer the model cannot embed, an unknown act backend
        msg = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
        console.print(f"[bold red]error:[/bold red] {escape(str(msg))}")
        raise typer.Exit(2) from None
    args = [] if ckpt is None else [ckpt]
    args += ["--backends", spec, "--prompts", str(prompts), "--new-tokens", str(new_tokens)]
    for flag, value in (("--json", json_out), ("--device", device), ("--revision", revision), ("--threads", threads)):
        if value is not None:
            args += [flag, str(value)]
    if act_backend != "reference":
        args += ["--act-backend", act_backend]
    result["command"] = " ".join(["requant determinism"] + [shlex.quote(a) for a in args])
    if json_out is not None:
        write_json_atomic(result, json_out)
        console.print(f"wrote {json_out}")
    from requant.determinism import markdown

    print(markdown(result, result["command"]))
    print(result["summary"])
    if not result["ok"]:
        raise typer.Exit(1)
