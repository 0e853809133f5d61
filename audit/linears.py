"""The audit's quantized Linears on its device, each regime's (requant.runtime.load_linears' bytes).

On CUDA the pow2 regime is requantized on the GPU (requant.scales.device.requantize_nearest, the
nearest arm's bytes computed there) and the checkpoint is read ahead by a pool of reader threads
(pread: thread-safe), so reading, the host-to-device copy and the requantization overlap.
Elsewhere: requant.runtime.load_linears (numpy, a thread pool). A converted checkpoint's scales
are powers of two already: the nearest arm returns them unchanged, as on the CPU.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import torch

from requant.runtime import load_linears

READ_AHEAD = 4


def load_audit_linears(ckpt, regime: str, device) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """{name: (int8 w [N, K], fp32 s_w [N, 1])} on device, for regime native or pow2."""
    dev = torch.device(device)
    if dev.type != "cuda":
        return load_linears(ckpt, regime, device)
    from requant.runtime.weights import REGIMES
    from requant.scales.device import requantize_nearest

    if regime not in REGIMES:
        raise ValueError(f"unknown regime {regime!r}; known: {', '.join(REGIMES)}")
    names = list(ckpt.quantized_linears)
    out = {}
    with ThreadPoolExecutor(max_workers=READ_AHEAD) as pool:
        reads = {n: pool.submit(ckpt.weight_and_scale, n) for n in names[:READ_AHEAD]}
        for i, n in enumerate(names):
            q, s = reads.pop(n).result()
            if i + READ_AHEAD < len(names):  # bounded: READ_AHEAD Linears read ahead of the one placed
                nxt = names[i + READ_AHEAD]
                reads[nxt] = pool.submit(ckpt.weight_and_scale, nxt)
            q = q.pin_memory().to(dev, non_blocking=True)
            if regime == "pow2":
                q, s = requantize_nearest(q, s)
            out[n] = (q.contiguous(), s.to(torch.float32).reshape(-1, 1).to(dev).contiguous())
    return out
