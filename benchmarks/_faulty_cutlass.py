"""A faulty user kernel for benchmarks/gpu_audit_truth.sh: CUTLASS (`kernels.scaled_mm(backend="cutlass")`),
declared in the CUTLASS order, except that at M <= DECODE_M one output element (the last, [M-1, N-1])
is one bf16 spacing off (its low bit flipped): a decode-tile bug no prefill reaches, the smallest
fault a kernel can have. `requant audit CKPT --backends cutlass,benchmarks._faulty_cutlass:flip_one_at_decode
--order cutlass-order` must name it (exit 1), its decode layers must differ from cutlass's by one
element each, and its prefill layers must be bitwise equal.
"""

import torch

from requant import kernels

DECODE_M = 8


def flip_one_at_decode(a, w, s_a, s_w):
    y = kernels.scaled_mm(a, w, s_a, s_w, backend="cutlass")
    if a.shape[0] > DECODE_M or y.numel() == 0:
        return y
    y = y.clone()
    y.view(torch.int16)[-1, -1] ^= 1
    return y
