"""Limits checked before any work: a value that cannot fit is one UsageError naming the option.

check_positions: prompt + new tokens inside the model's max_position_embeddings (the rotary
tables and the KV cache are sized by it). check_generation_memory: an estimate of what a
generation of `batch` sequences of `positions` positions holds at once (the KV cache at its
capacity, bf16; the fp32 logits rows of a step and those kept; one token's widest activation), refused when it exceeds the memory available on the device
(MemAvailable on a CPU, the free memory of a CUDA device). The estimate is a lower bound of
what the run holds, so a refused value cannot fit; a value that passes can still run out when
other processes take memory meanwhile. check_threads: at most max_threads() torch threads.
docs/runtime.md, "Limits".
"""

from __future__ import annotations

import os

from requant.errors import UsageError

__all__ = [
    "MAX_BATCH",
    "max_threads",
    "check_threads",
    "check_positions",
    "generation_bytes",
    "available_bytes",
    "check_generation_memory",
]

MAX_BATCH = 1 << 20  # sequences in one batch: far past any memory here, and bounds every loop over them


def max_threads() -> int:
    """The most torch CPU threads requant starts: four per core (more only contend)."""
    return 4 * (os.cpu_count() or 1)


def check_threads(n: int, option: str = "--threads") -> None:
    if n > max_threads():
        raise UsageError(f"{option} {n}: at most {max_threads()} (4 per CPU core of this machine)")


def max_positions(config: dict) -> int:
    return int(config.get("max_position_embeddings") or 2048)


def check_positions(config: dict, positions: int, option: str, what: str) -> None:
    """`positions` (what: how they add up) inside the model's max_position_embeddings."""
    limit = max_positions(config)
    if positions > limit:
        raise UsageError(
            f"{option}: {what} = {positions:,} positions, more than the model's {limit:,} (max_position_embeddings)"
        )


def _capacity(positions: int) -> int:
    return 1 << max(0, positions - 1).bit_length()  # requant.runtime.cache.generation_capacity


def generation_bytes(config: dict, batch: int, positions: int, kept_steps: int = 0) -> int:
    """A lower bound of the bytes a generation of `batch` sequences of `positions` positions
    holds at once (module docstring); kept_steps: logits rows [batch, vocab] fp32 kept per step."""
    layers = int(config["num_hidden_layers"])
    hidden = int(config["hidden_size"])
    heads = int(config["num_attention_heads"])
    kv = int(config.get("num_key_value_heads") or heads)
    hd = int(config.get("head_dim") or hidden // heads)
    vocab = int(config["vocab_size"])
    inter = int(config["intermediate_size"])
    kv_cache = 2 * layers * batch * kv * _capacity(positions) * hd * 2
    logits = batch * vocab * 4 * (1 + kept_steps)  # the step's fp32 logits rows, and the kept ones
    acts = batch * max(hidden, inter) * 4  # one token's widest activation, fp32
    return kv_cache + logits + acts


def available_bytes(device: str) -> int | None:
    """Memory free for this process on `device` (None: unknown)."""
    if str(device).startswith("cuda"):
        try:
            import torch

            return int(torch.cuda.mem_get_info(torch.device(device))[0])
        except Exception:  # no usable device answer: no estimate, the run says it itself
            return None
    try:
        with open("/proc/meminfo", "rb") as f:
            for line in f:
                if line.startswith(b"MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):
        return None


def check_generation_memory(
    config: dict, batch: int, positions: int, device: str, option: str, kept_steps: int = 0
) -> None:
    """UsageError naming `option` when a batch of `batch` cannot be held (module docstring)."""
    if batch > MAX_BATCH:
        raise UsageError(f"{option}: a batch of {batch:,} sequences, more than the {MAX_BATCH:,} requant runs at once")
    need = generation_bytes(config, batch, positions, kept_steps)
    have = available_bytes(device)
    if have is not None and need > have:
        raise UsageError(
            f"{option}: a batch of {batch:,} sequences of {positions:,} positions needs at least "
            f"{need / 2**30:,.1f} GiB (KV cache and logits), more than the {have / 2**30:,.1f} GiB available on {device}"
        )
