"""The numbers under requant.runtime.sampling, shared with its batched chooser (sampling_batch):
the request's random integer and the floors below which a weight is 0, the same bits on every
machine (exp/log from + * / only: requant.kernels.math64, shared with the portable RoPE tables).
Definitions and proofs: requant/runtime/sampling.py's module docstring, docs/runtime.md."""

from __future__ import annotations

import hashlib

WEIGHT_BITS = 40
_DOMAIN = b"requant-sample-v1"


def uniform_int(seed: int, key: str, position: int) -> int:
    """The request's random integer in [0, 2**128) at absolute position `position`."""
    kb = key.encode("utf-8")
    msg = _DOMAIN + seed.to_bytes(8, "little") + len(kb).to_bytes(8, "little") + kb + position.to_bytes(8, "little")
    return int.from_bytes(hashlib.sha256(msg).digest()[:16], "big")


# Below these, a term is 0 anyway (exp64 is within an ulp of exp): exp(-28) < 2**-40 (a weight),
# exp(-56) < 2**-80 (a term of the logprob's sum). Skipping them is only faster.
WEIGHT_FLOOR = -28.0
SUM_FLOOR = -56.0
