"""`requant conform`'s fingerprint of the real Triton kernel (under TRITON_INTERPRET=1 on a
machine without a GPU, see conftest.py), on the epilogue and small accumulator cases and the
small batches: it must be identified as the order it declares (kernels.EMULATION_OF)."""

import pytest
import torch

from requant.audit import conform as C
from requant.audit.conform import vectors as V

SMALL = (
    "epilogue",
    "epilogue_random",
    "acc_int16",
    "acc_bf16",
    "batch_m0001",
    "batch_m0001b",
    "batch_m0002",
    "batch_m0003",
    "batch_m0017",
)


def test_triton_is_identified_as_the_triton_order():
    if not torch.cuda.is_available():
        import os

        if os.environ.get("TRITON_INTERPRET") != "1":
            pytest.skip("needs TRITON_INTERPRET=1 before triton is imported")
    vs = V.build_vectors(batch_ms=(1, 2, 3, 17))
    name, fn = C.resolve_kernel("triton", None)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    r = C.fingerprint(name, C.run_cases(name, fn, vs, dev, cases=SMALL), vs, C.declared_order("triton"))
    assert r["identified"] and r["formula"] == "triton-order" and r["formulas_agreeing"] == ["triton-order"]
    assert r["exact_accumulation"] and r["batch"]["invariant"] and r["batch"]["ms"] == [2, 3, 17]
    assert r["conforms"] and r["declared_confirmed"]
