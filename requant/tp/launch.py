"""Run the tensor-parallel model at several degrees in one set of processes.

    results = run(Spec(ckpt, prompts=ids, degrees=(1, 2, 4), runs=(LaunchConfig("reference-triton-order"),)))
    r = results[(LaunchConfig("reference-triton-order"), 2)]
    r.logits                            # prefill logits [T_i, vocab] per prompt (bf16 values)
    r.ids, r.steps                      # greedy ids per prompt; logits [B, vocab] per step

max(degrees) spawned processes, one world; every degree d runs on ranks 0..d-1, so one launch and one
checkpoint load per process serve every degree and every LaunchConfig. Spec.comm: gloo on the CPU; on
CUDA NCCL with one GPU per rank, or gloo with the ranks sharing the GPUs there are. The run times out
after timeout_s; a worker's exception comes back as a RuntimeError naming its rank and its last line.
run(..., progress=fn) calls fn(line) in the caller's process for each stage rank 0 reaches (the
checkpoint loaded, each degree of each variant done), passed through the launch's TCPStore.
Spawned workers import the caller's main module again, so a script calling run() needs the
`if __name__ == "__main__":` guard (the requant command line has it).

How, and why: docs/tensor-parallel.md#the-command.
"""

from __future__ import annotations

import dataclasses
import datetime
import io
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import torch

from requant.checkpoint import open_checkpoint
from requant.io.output import write_bytes_atomic
from requant.runtime.cache import generation_capacity
from requant.runtime.weights import check_layout, load_dense, load_linears
from requant.tp.engine import Comm, ShardedModel
from requant.tp.shard import as_dense

__all__ = ["LaunchConfig", "Result", "Spec", "run"]


@dataclass(frozen=True)
class LaunchConfig:
    """One model variant of a launch: a scaled_mm backend, a weight regime, a row-parallel reduction."""

    backend: str = "reference-triton-order"
    regime: str = "native"
    reduce: str = "int32"
    act_backend: str = "reference"
    dense: tuple[str, ...] = ()  # quantized Linears to run as dense bf16 ones (requant.tp.shard.as_dense)


@dataclass(frozen=True)
class Spec:
    """One launch: a W8A8 checkpoint directory, the prompts (token ids), the TP degrees, the
    variants, the number of greedy tokens, the device ("cpu" or "cuda") and the collectives'
    library (comm: "nccl" or "gloo"; "auto" is gloo on the CPU, NCCL on CUDA)."""

    ckpt: str
    prompts: tuple[tuple[int, ...], ...]
    degrees: tuple[int, ...] = (1, 2, 4)
    runs: tuple[LaunchConfig, ...] = (LaunchConfig(),)
    new_tokens: int = 8
    device: str = "cpu"
    comm: str = "auto"
    reduction: str = "auto"
    threads: int = 1
    time_reps: int = 0  # > 0: also time prefill and decode (best of this many), for benchmarks
    keep_logits: bool = True  # False: return ids, digest and timing only (large models)


@dataclass
class Result:
    logits: list[torch.Tensor]
    ids: list[list[int]]
    steps: list[torch.Tensor] = field(default_factory=list)
    timing: dict = field(default_factory=dict)
    digest: str = ""  # requant.tp.compare.digest of the logits, ids and step logits


def _time(m, prompts: list[list[int]], new_tokens: int, reps: int, group, cuda: bool) -> dict:
    """Best-of-reps wall times of one packed prefill (no cache) and of new_tokens - 1 decode
    steps after a cached prefill, all ranks starting together (a barrier of the group)."""
    import torch.distributed as dist

    tensors = [torch.as_tensor(p, dtype=torch.long) for p in prompts]

    def sync():
        if cuda:
            torch.cuda.synchronize()
        dist.barrier(group=group)

    best_p = best_d = float("inf")
    steps = max(new_tokens - 1, 1)
    with torch.no_grad():
        for _ in range(reps):
            sync()
            t0 = time.perf_counter()
            m.prefill(tensors)
            sync()
            best_p = min(best_p, time.perf_counter() - t0)
            cache = m.new_cache(len(tensors), generation_capacity(max(len(t) for t in tensors) + steps + 1))
            nxt = torch.argmax(m.prefill(tensors, cache=cache, last_only=True), dim=-1)
            sync()
            t0 = time.perf_counter()
            for _ in range(steps):
                nxt = torch.argmax(m.decode_step(nxt, cache), dim=-1)
            sync()
            best_d = min(best_d, time.perf_counter() - t0)
    tokens = sum(len(t) for t in tensors)
    return {
        "prefill_s": best_p,
        "prefill_tok_s": tokens / best_p,
        "decode_s": best_d,
        "decode_steps": steps,
        "decode_tok_s": len(tensors) * steps / best_d,
    }


_STAGES = "requant-stages"  # the store's counter of stage lines; line i under f"{_STAGES}-{i}"


def _stage(store, line: str) -> None:
    """Rank 0's progress line for the caller (run's progress): the line first, then the count."""
    n = store.add(f"{_STAGES}-next", 1) - 1
    store.set(f"{_STAGES}-{n}", line)
    store.add(_STAGES, 1)


def _report(store, seen: int, progress) -> int:
    """progress(line) for each stage line after the first `seen` (the master's view of what
    rank 0 reported); the number seen now."""
    if progress is None:
        return seen
    n = store.add(_STAGES, 0)
    for i in range(seen, n):
        progress(store.get(f"{_STAGES}-{i}").decode("utf-8", "replace"))
    return max(seen, n)


def _worker(rank: int, world: int, port: int, spec: Spec, out: str, timeout_s: float) -> None:
    import torch.distributed as dist

    from requant.tp.compare import digest

    torch.set_num_threads(spec.threads)
    cuda = spec.device == "cuda"
    comm = comm_of(spec)
    gpu = rank % torch.cuda.device_count() if cuda else None
    if cuda:
        torch.cuda.set_device(gpu)
    if comm == "gloo" and "GLOO_SOCKET_IFNAME" not in os.environ and Path("/sys/class/net/lo").exists():
        os.environ["GLOO_SOCKET_IFNAME"] = "lo"  # loopback only: no name lookup of the host
    timeout = datetime.timedelta(seconds=timeout_s)
    store = dist.TCPStore("127.0.0.1", port, world, is_master=False, timeout=timeout)
    dist.init_process_group(comm, store=store, rank=rank, world_size=world, timeout=timeout)
    try:
        groups = {d: dist.new_group(list(range(d))) for d in sorted(set(spec.degrees))}  # every rank, same order
        ckpt = open_checkpoint(spec.ckpt)
        check_layout(ckpt)
        dense = load_dense(ckpt, "cpu")
        if rank == 0:
            _stage(store, f"{world} process(es) started, checkpoint read")
        linears = {}  # per regime, loaded once
        device = torch.device(f"cuda:{gpu}") if cuda else None
        prompts = [list(p) for p in spec.prompts]
        results: dict[tuple[LaunchConfig, int], Result] = {}
        for r in spec.runs:
            if r.regime not in linears:
                linears[r.regime] = load_linears(ckpt, r.regime, "cpu")
            for d in spec.degrees:
                if rank < d:
                    dn, lin = as_dense(dense, linears[r.regime], r.dense) if r.dense else (dense, linears[r.regime])
                    m = ShardedModel.build(
                        ckpt.config,
                        dn,
                        lin,
                        Comm(groups[d]),
                        device=device,
                        backend=r.backend,
                        act_backend=r.act_backend,
                        reduce=r.reduce,
                        reduction=spec.reduction,
                    )
                    logits = m.logits(prompts)
                    gen = m.generate(prompts, spec.new_tokens, keep_logits=True)
                    ids, steps = gen.ids, gen.step_logits
                    timing = (
                        _time(m, prompts, spec.new_tokens, spec.time_reps, groups[d], cuda) if spec.time_reps else {}
                    )
                    if rank == 0:
                        # bf16 holds the logits exactly (bf16 values as fp32) in half the bytes
                        logits = [t.to(torch.bfloat16).cpu() for t in logits]
                        steps = [t.to(torch.bfloat16).cpu() for t in steps]
                        dg = digest(logits, ids, steps)
                        if not spec.keep_logits:
                            logits, steps = [], []
                        results[(r, d)] = Result(logits, ids, steps, timing, dg)
                        _stage(store, f"tp {d}{_label(r, spec)}: prefill and {spec.new_tokens} greedy tokens done")
                    del m
                dist.barrier()
        if rank == 0:
            buf = io.BytesIO()
            torch.save(
                [
                    (dataclasses.astuple(k), d, (r.logits, r.ids, r.steps, r.timing, r.digest))
                    for (k, d), r in results.items()
                ],
                buf,
            )
            write_bytes_atomic(out, buf.getvalue())
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _label(r: LaunchConfig, spec: Spec) -> str:
    """A variant's name in a stage line, when the launch runs more than one."""
    return f" ({r.backend}, {r.regime}, {r.reduce})" if len(spec.runs) > 1 else ""


def comm_of(spec: Spec) -> str:
    """The collectives' library of a launch: spec.comm, with "auto" resolved."""
    if spec.comm == "auto":
        return "nccl" if spec.device == "cuda" else "gloo"
    if spec.comm not in ("gloo", "nccl") or (spec.comm == "nccl" and spec.device != "cuda"):
        raise ValueError(f"comm {spec.comm!r} on {spec.device}: gloo runs anywhere, nccl on CUDA only")
    return spec.comm


def run(
    spec: Spec, timeout_s: float = 300.0, progress: Optional[Callable[[str], None]] = None
) -> dict[tuple[LaunchConfig, int], Result]:
    """Every (LaunchConfig, degree) of spec, on max(degrees) processes; progress(line) for each
    stage (the module docstring)."""
    import torch.distributed as dist
    import torch.multiprocessing as mp

    world = max(spec.degrees)
    if comm_of(spec) == "nccl" and torch.cuda.device_count() < world:
        raise ValueError(f"tp {world} needs {world} CUDA devices, this machine has {torch.cuda.device_count()}")
    td = datetime.timedelta(seconds=timeout_s)
    store = dist.TCPStore("127.0.0.1", 0, world, is_master=True, wait_for_workers=False, timeout=td)
    with tempfile.TemporaryDirectory(prefix="requant-tp-") as tmp:
        out = str(Path(tmp) / "results.pt")
        ctx = mp.start_processes(
            _worker,
            args=(world, store.port, spec, out, timeout_s),
            nprocs=world,
            join=False,
            daemon=True,
            start_method="spawn",
        )
        deadline = time.monotonic() + timeout_s
        seen = 0
        try:
            while not ctx.join(timeout=0.5):
                seen = _report(store, seen, progress)
                if time.monotonic() > deadline:
                    raise TimeoutError(f"tensor-parallel run did not finish within {timeout_s:g} s")
            _report(store, seen, progress)
        except mp.ProcessRaisedException as exc:
            last = [ln for ln in str(exc).strip().splitlines() if ln.strip()]
            raise RuntimeError(f"tensor-parallel rank {exc.error_index} failed: {last[-1] if last else exc}") from None
        except mp.ProcessExitedException as exc:
            raise RuntimeError(f"tensor-parallel rank {exc.error_index} exited with code {exc.exit_code}") from None
        finally:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
                    p.join(5)
        raw = torch.load(out, weights_only=True)
    del store
    return {(LaunchConfig(*k[:4], tuple(k[4])), d): Result(*r) for k, d, r in raw}
