"""The audit's quantized Linears on its device, each regime's (requant.runtime.load_linears' bytes).

On CUDA the checkpoint is read once: a pool of reader threads (pread: thread-safe) reads ahead
while each Linear is copied to the GPU, and the pow2 regime is derived there from the native
tensors already on the device (requant.regime.pow2_weights: the nearest arm's bytes,
computed on the GPU from the stored scales), freeing each native Linear as its pow2 twin is made.
Elsewhere: requant.runtime.load_linears (numpy, a thread pool). A converted checkpoint's scales
are powers of two already: the nearest arm returns them unchanged, as on the CPU.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import torch

from requant.regime import POW2, pow2_weights, pow2_weights_many
from requant.runtime import load_linears

READ_AHEAD = 4
# int8 weight bytes requantized together when pow2 is derived on the device (a Qwen3-30B-A3B
# layer's 128 gate projections are 201 MB: two stacks). The stack, its fp32 product and rounding and
# the result live at once: about 10 bytes a weight, 1.3 GB at the bound.
STACK_BYTES = 1 << 27


class AuditLinears:
    """load(regime, previous) -> {name: (int8 w [N, K], fp32 s_w [N, 1])} on the device."""

    def __init__(self, ckpt, device):
        self.ckpt = ckpt
        self.device = torch.device(device)
        self.stored: dict[str, torch.Tensor] = {}  # the native scales in their stored dtype (host)

    def load(self, regime: str, previous: dict | None = None) -> dict:
        """regime: one of requant.regime.REGIMES (the suite's); previous: the native regime's dict
        (emptied here) when deriving pow2 on the GPU."""
        if self.device.type != "cuda":
            return load_linears(self.ckpt, regime, self.device)

        names = list(self.ckpt.quantized_linears)
        if regime == POW2 and previous is not None and set(self.stored) == set(names):
            return self._pow2_from(previous, names)
        out = {}
        with ThreadPoolExecutor(max_workers=READ_AHEAD) as pool:
            reads = {n: pool.submit(read_linear, self.ckpt, n, True) for n in names[:READ_AHEAD]}
            for i, n in enumerate(names):
                q, s = reads.pop(n).result()
                if i + READ_AHEAD < len(names):  # bounded: READ_AHEAD Linears read ahead of the one placed
                    nxt = names[i + READ_AHEAD]
                    reads[nxt] = pool.submit(read_linear, self.ckpt, nxt, True)
                # q is pinned: an asynchronous copy (the host allocator keeps the block until it is done)
                q = q.to(self.device, non_blocking=True)
                if regime == POW2:
                    q, s = pow2_weights(q, s)
                else:
                    self.stored[n] = s
                out[n] = self._place(q, s)
        return out

    def _pow2_from(self, previous: dict, names: list[str]) -> dict:
        """The pow2 Linears derived on the device from the native ones (emptying `previous`), the
        Linears of one weight shape and scale dtype requantized together, up to STACK_BYTES of
        weights at a time (a larger Linear alone) (pow2_weights_many: the same bits as one at a time); in `names` order."""
        done: dict = {}
        buckets: dict = {}  # (weight shape, scale dtype) -> [names, their weight bytes]

        def flush(key):
            group, _ = buckets.pop(key)
            pairs = [(previous.pop(n)[0], self.stored[n]) for n in group]
            made = pow2_weights_many(pairs)
            scales = self._place_scales([s for _, s in made])
            for n, (q, _), s in zip(group, made, scales):
                done[n] = (q, s)

        for n in names:
            size = previous[n][0].numel()
            key = (tuple(previous[n][0].shape), self.stored[n].dtype)
            if key in buckets and buckets[key][1] + size > STACK_BYTES:  # a stack stays within the bound
                flush(key)
            entry = buckets.setdefault(key, [[], 0])
            entry[0].append(n)
            entry[1] += size
        for key in list(buckets):
            flush(key)
        return {n: done[n] for n in names}

    def _place_scales(self, scales: list[torch.Tensor]) -> list[torch.Tensor]:
        """fp32 [N, 1] scales on the device (an exact upcast on the host), for many Linears in one
        pinned, non-blocking host-to-device copy (views of it)."""
        flat = torch.cat([s.to(torch.float32).reshape(-1) for s in scales])
        if self.device.type == "cuda":
            flat = flat.pin_memory()
        dev = flat.to(self.device, non_blocking=True)
        return [v.reshape(-1, 1) for v in dev.split([s.numel() for s in scales])]

    def _place(self, q: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return q.contiguous(), self._place_scales([s])[0]  # no stream sync per Linear


def read_linear(ckpt, linear: str, pin: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """ckpt.weight_and_scale(linear), the weight read straight into page-locked memory when `pin`
    (SafetensorsFile.tensor_direct: one pread into the buffer the device copy reads)."""
    if linear not in ckpt.quantized_linears or not hasattr(ckpt, "shard_of"):
        return ckpt.weight_and_scale(linear)  # its own error, or a checkpoint without shards
    name = linear + ".weight"
    return ckpt.shard_of(name).tensor_direct(name, pin), ckpt.tensor(linear + ".weight_scale")


def load_audit_linears(ckpt, regime: str, device) -> dict:
    """One regime's Linears (AuditLinears(ckpt, device).load(regime))."""
    return AuditLinears(ckpt, device).load(regime)
