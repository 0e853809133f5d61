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

from requant.regime import POW2, pow2_weights
from requant.runtime import load_linears

READ_AHEAD = 4


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
            out = {}
            for n in names:
                q, _ = previous.pop(n)
                out[n] = self._place(*pow2_weights(q, self.stored[n]))
            return out
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

    def _place(self, q: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        s = s.to(torch.float32).reshape(-1, 1).contiguous()  # exact upcast, on the host
        return q.contiguous(), s.pin_memory().to(self.device, non_blocking=True)  # no stream sync per Linear


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
