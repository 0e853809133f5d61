"""`requant conform`'s fingerprint (audit/conform/__init__.py) on kernels whose formula is known
independently: the reference emulations and the cublas backend (each declares its order in
kernels.EMULATION_OF), every fault of the catalogue wrapped as a kernel (audit/conform/fault_kernels.py:
FAULT_FORMULAS says, from audit/catalogue/faults.py's definitions, what each one computes), and
hand-broken kernels (one flipped element, an M-dependent order, wrong dtype/shape, raising)."""

import pytest
import torch

from requant.audit import conform as C
from requant.audit.conform import fault_kernels as FK
from requant.audit.conform import vectors as V
from requant.kernels import EMULATION_OF
from requant.kernels.reference import scaled_mm_cutlass_order, scaled_mm_triton_order


@pytest.fixture(scope="module")
def vs():
    return V.build_vectors()


def _fp(name, fn, vs, declared=None):
    return C.fingerprint(name, C.run_cases(name, fn, vs, "cpu"), vs, declared)


@pytest.mark.parametrize(
    "backend", ["reference", "reference-cutlass-order", "reference-triton-order", "reference-fused-order", "cublas"]
)
def test_reference_orders_and_cublas_are_identified(vs, backend):
    name, fn = C.resolve_kernel(backend, None)
    declared = C.declared_order(backend)
    assert declared == ("exact" if backend == "reference" else EMULATION_OF[backend].removeprefix("reference-"))
    r = _fp(name, fn, vs, declared)
    assert r["identified"] and r["formula"] == declared and r["formulas_agreeing"] == [declared]
    assert r["exact_accumulation"] and r["batch"]["invariant"] and r["batch"]["vs_formula"]["mismatches"] == 0
    assert r["conforms"] and r["declared_confirmed"]
    assert r["verdict"].startswith("implements ") and r["verdict"].endswith("exact int32 accumulation, batch-invariant")


@pytest.mark.parametrize("fault", list(FK.FAULTS))
def test_every_catalogue_fault_is_identified(vs, fault):
    r = _fp(fault, FK.FAULTS[fault], vs)
    want = FK.FAULT_FORMULAS[fault]
    if want is None:  # operand faults: no formula reproduces them
        assert (
            not r["identified"] and not r["conforms"] and r["verdict"].startswith("matches no known formula; nearest: ")
        )
        assert r["candidates"][f"{r['accumulator']}/{r['formula']}"]["first"] is not None
        return
    model, formula = want
    assert r["identified"] and r["accumulator"] == model and formula in r["formulas_agreeing"]
    if model == "exact":
        assert r["formulas_agreeing"] == [formula]
    # legal orders conform (F3 is CUTLASS's, F5 TensorRT-LLM's, F8 the reference); the rest do not
    assert r["conforms"] is (fault in ("F3", "F5", "F8"))
    assert ("not a legal order" in r["verdict"]) is (fault in ("F1", "F2", "F4"))
    assert ("inexact accumulation" in r["verdict"]) is (model != "exact")


def test_a_declared_order_that_is_not_implemented_fails(vs):
    r = _fp("liar", scaled_mm_cutlass_order, vs, declared="triton-order")
    assert r["formula"] == "cutlass-order" and r["declared_confirmed"] is False and not r["conforms"]
    assert "declares triton-order" in r["verdict"]


def test_one_flipped_element_names_the_nearest_formula_and_the_element(vs):
    target = vs.cases[0]

    def kernel(a, w, s_a, s_w):
        y = scaled_mm_triton_order(a, w, s_a, s_w)
        if a.shape == target.a.shape and torch.equal(a, target.a):
            y = y.clone()
            y.view(torch.int16)[2, 3] ^= 1  # one bit of one output element
        return y

    r = _fp("flip", kernel, vs)
    assert not r["identified"] and not r["conforms"] and r["formula"] == "triton-order"
    near = r["candidates"]["exact/triton-order"]
    assert near["mismatches"] == 1 and near["first"]["case"] == target.name and near["first"]["element"] == [2, 3]
    assert "nearest: Triton order" in r["verdict"] and "1 of " in r["verdict"] and "element [2, 3]" in r["verdict"]


def test_an_m_dependent_kernel_is_not_batch_invariant(vs):
    def kernel(a, w, s_a, s_w):  # a legal order per call, but which one depends on M
        return (scaled_mm_cutlass_order if a.shape[0] > 64 else scaled_mm_triton_order)(a, w, s_a, s_w)

    r = _fp("by-m", kernel, vs)
    assert r["formula"] == "triton-order" and r["identified"] and not r["batch"]["invariant"] and not r["conforms"]
    assert min(f["m"] for f in r["batch"]["failures"]) == 65 and "NOT batch-invariant" in r["verdict"]


@pytest.mark.parametrize(
    "kind,msg",
    [
        ("raises", "raised ZeroDivisionError on case epilogue"),
        ("dtype", "returned dtype torch.float32 on case epilogue, expected torch.bfloat16"),
        ("shape", "returned shape (8, 7) on case epilogue, expected (8, 8)"),
        ("none", "returned NoneType on case epilogue, not a tensor"),
    ],
)
def test_broken_callables_are_refused_with_one_line(vs, kind, msg):
    def kernel(a, w, s_a, s_w):
        y = scaled_mm_triton_order(a, w, s_a, s_w)
        return {"raises": lambda: 1 / 0, "dtype": lambda: y.float(), "shape": lambda: y[:, :-1], "none": lambda: None}[
            kind
        ]()

    with pytest.raises(C.KernelError) as e:
        C.run_cases("bad", kernel, vs, "cpu")
    assert str(e.value).startswith("kernel bad ") and msg in str(e.value) and "\n" not in str(e.value)


def test_kernel_inputs_are_copies(vs):
    def vandal(a, w, s_a, s_w):
        y = scaled_mm_triton_order(a, w, s_a, s_w)
        a.zero_()
        s_w.mul_(2)
        return y

    before = vs.digest()
    C.run_cases("vandal", vandal, vs, "cpu")
    assert vs.digest() == before


def test_resolve_kernel_refusals():
    for args, msg in [
        ((None, None), "exactly one"),
        (("cutlass", "m:f"), "exactly one"),
        (("nope", None), "unknown backend"),
        ((None, "no_colon"), "MODULE:FUNCTION"),
        ((None, "requant.no_such_module:f"), "cannot import"),
        ((None, "requant.audit.conform.fault_kernels:nothing"), "no callable"),
    ]:
        with pytest.raises(ValueError, match=msg):
            C.resolve_kernel(*args)
    # the documented --kernel path (docs/conformance.md)
    name, fn = C.resolve_kernel(None, "requant.audit.conform.fault_kernels:F4")
    assert name == "requant.audit.conform.fault_kernels:F4" and fn is FK.F4
