"""audit/batched.py equals the per-cell path (cells.layer_cells, evaluate_cell on each cell), cell by
cell: every field of every CellResult (observable, mismatches, max_ulp, each check's outcome, the
ULP histogram) and every per_layer row, on crafted layers that exercise every fault family and on
the embedded default (prefill and decode, whole audit). The per-cell path is the independent
reference: it evaluates each cell on its own with audit/catalogue/faults.py and audit/catalogue/checks.py.
"""

import pytest
import torch

from requant import DEFAULT_CHECKPOINT, kernels
from requant.audit.batched import PER_CELL_ENV, Segment, evaluate_linear, resolve_all
from requant.audit.catalogue.matrix import load_matrix, matrix_path
from requant.audit.cells import backend_kernel, layer_cells
from requant.audit.records import Activations
from requant.audit.suite import run_audit
from requant.backends import REFERENCE_PAIR
from requant.checkpoint import open_checkpoint
from tests.audit.conftest import make_operands
from tests.audit.custom_kernels import wrong_at_decode

CHECKS_V2 = load_matrix(matrix_path("v2")).checks
CHECKS_V1 = load_matrix(matrix_path("v1")).checks
WRONG = "tests-batched-wrong-at-decode"


@pytest.fixture
def wrong_kernel():
    return kernels.ScaledMM(WRONG, wrong_at_decode, "triton-order")


def _segments(seed, ms, k, n, pow2, craft):
    """Operand sets sharing one weight: decode-like (M = 1, 8) and prefill-like (M = 24) rows."""
    act0, wt = make_operands(seed, m=sum(ms), k=k, n=n, pow2=pow2)
    a, s_a = act0.a.clone(), act0.s_a.clone()
    if craft:
        s_a[0] = 0.0  # a zero scale row (F9a draws among the others)
        a[0] = 0
        s_a[2] = float("nan")  # a poisoned row: NaN outputs, distance 2**31
        a[3, : k // 2] = 127  # large accumulators: F7 wraps, F6 loses bits
        a[4] = -a[4]
    out, at = [], 0
    for i, m in enumerate(ms):
        rows = slice(at, at + m)
        act = Activations(a[rows].clone(), s_a[rows].clone())
        if craft and m == 1 and i == 0:
            act = Activations(act.a, torch.zeros_like(act.s_a))  # every scale zero: F9a draws among all rows
        out.append((f"layer{seed}@s{i}", act))
        at += m
    return out, wt


def _compare(regime, labelled, wt, backends, checks):
    pair = tuple(dict.fromkeys(backends))
    outs = [{b: kernels.scaled_mm(act.a, wt.w, act.s_a, wt.s_w, backend=b) for b in pair} for _, act in labelled]
    want = [layer_cells(lb, regime, act, wt, backends, checks, o) for (lb, act), o in zip(labelled, outs)]
    segs = [Segment(lb, act, o) for (lb, act), o in zip(labelled, outs)]
    pending = evaluate_linear(regime, segs, wt, backends, backend_kernel)
    assert pending is not None
    [got] = resolve_all([pending], checks)
    assert len(got) == len(want)
    for (row_g, cells_g), (row_w, cells_w) in zip(got, want):
        assert row_g == row_w
        assert len(cells_g) == len(cells_w) == 21 + len(pair)
        for cg, cw in zip(cells_g, cells_w):
            assert cg == cw, (cg.variant, cg.layer)
    return want


@pytest.fixture(params=[None, False], ids=["host-shortcuts", "device-path"])
def shortcuts(request, monkeypatch):
    """The CPU's shortcuts, and the code path a GPU runs (no host read-back), both on the CPU."""
    from requant.audit import batched_stats

    monkeypatch.setattr(batched_stats, "HOST_SHORTCUTS", request.param)


@pytest.mark.parametrize("pow2", [False, True])
@pytest.mark.parametrize("craft", [False, True])
def test_crafted_layers_every_family_equal_cell_by_cell(pow2, craft, shortcuts):
    seen, observable = set(), set()
    for seed, (k, n) in enumerate([(96, 40), (256, 64), (200, 33)]):
        labelled, wt = _segments(seed, [1, 8, 24], k, n, pow2, craft)
        regime = "pow2" if pow2 else "native"
        for segment_cells in _compare(regime, labelled, wt, REFERENCE_PAIR, CHECKS_V2):
            for cell in segment_cells[1]:
                seen.update((cell.family, cid) for cid, o in cell.outcomes.items() if o == "fire")
                observable.update([cell.family] if cell.observable else [])
    assert {"F4", "F6", "F7", "F9"} <= observable and "F8" not in observable
    assert pow2 or "F2" in observable  # F1, F3, F5 change a few outputs per million: rare here
    assert ("F9", "C1") in seen and ("F7", "C3") in seen and ("F6", "C4") in seen


def test_other_pairs_checks_and_a_faulty_backend_equal_cell_by_cell(wrong_kernel, shortcuts):
    labelled, wt = _segments(7, [1, 8, 24], 128, 48, True, True)
    for backends, checks in [
        (("reference-triton-order", "reference-fused-order"), CHECKS_V2),
        (("reference-cutlass-order", wrong_kernel), CHECKS_V2),
        (REFERENCE_PAIR, CHECKS_V1),
        (("reference-triton-order", "reference-triton-order"), CHECKS_V2),
        ((wrong_kernel, "reference-triton-order"), CHECKS_V2),  # one order twice: two cells, compared
    ]:
        want = _compare("pow2", labelled, wt, backends, checks)
        if wrong_kernel in backends:  # its baseline row fires at M <= 8 (C5, C8), not at M = 24
            i = backends.index(wrong_kernel)
            fired = [cells[i].outcomes["C5"] for _, cells in want]
            assert fired == ["silent", "fire", "silent"]  # M = 1: zero scales
            assert want[0][1][i].variant == "B.triton-order" and want[0][1][i].backend == wrong_kernel
            assert [cells[i].fault is not None for _, cells in want] == [False, True, False]
            assert [row["bitwise_equal"] for row, _ in want] == [True, False, True]


def test_unsuitable_outputs_fall_back_to_the_per_cell_path():
    act, wt = make_operands(1, m=4, k=32, n=8)
    bad = {"reference-cutlass-order": torch.zeros(4, 8), "reference-triton-order": torch.zeros(4, 8)}
    assert evaluate_linear("native", [Segment("l", act, bad)], wt, REFERENCE_PAIR, backend_kernel) is None
    empty = Activations(act.a[:0], act.s_a[:0])
    outs = {b: torch.zeros(0, 8, dtype=torch.bfloat16) for b in REFERENCE_PAIR}
    assert evaluate_linear("native", [Segment("l", empty, outs)], wt, REFERENCE_PAIR, backend_kernel) is None


def _strip(res):
    res = dict(res)
    for key in ("timings", "wall_seconds"):
        res.pop(key, None)
    if "decode" in res:
        res["decode"] = {k: v for k, v in res["decode"].items() if k != "timings"}
    return res


def test_embedded_default_whole_audit_equal_to_the_per_cell_path(monkeypatch):
    """Prefill and decode (M = 1 and 3, 2 steps), every cell row kept, reference pair."""
    ckpt = open_checkpoint(DEFAULT_CHECKPOINT)
    kw = dict(phases=("prefill", "decode"), decode_batches=(1, 3), decode_steps=2, keep_cells="all")
    monkeypatch.setenv(PER_CELL_ENV, "1")
    want = run_audit(ckpt, REFERENCE_PAIR, 2, "cpu", **kw)
    monkeypatch.delenv(PER_CELL_ENV)
    got = run_audit(ckpt, REFERENCE_PAIR, 2, "cpu", **kw)
    assert _strip(got) == _strip(want)
    assert got["cell_results"] and got["decode"]["cell_results"] and got["ulp_histograms"]


def _sm90() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() >= (9, 0)


@pytest.mark.gpu
@pytest.mark.skipif(not _sm90(), reason="needs an sm90 GPU (CUTLASS)")
@pytest.mark.parametrize("preset", ["tiny", "tiny-moe"])
def test_gpu_batched_equals_per_cell_with_the_real_pair(preset, tmp_path, monkeypatch):
    """cutlass,triton on a small synthetic (tiny preset; tiny-moe: its expert Linears in groups) on the
    GPU, prefill and decode: the batched path (Triton F6 kernel, GPU requantization) equals the per-cell
    path, every key but timings."""
    from requant.checkpoint.synthetic import generate

    ckpt = open_checkpoint(generate(preset, tmp_path / preset))
    kw = dict(phases=("prefill", "decode"), decode_batches=(1, 8), decode_steps=2, keep_cells="all")
    monkeypatch.setenv(PER_CELL_ENV, "1")
    want = run_audit(ckpt, ("cutlass", "triton"), 8, "cuda", **kw)
    monkeypatch.delenv(PER_CELL_ENV)
    got = run_audit(ckpt, ("cutlass", "triton"), 8, "cuda", **kw)
    for res in (got, want):
        res.pop("peak_gpu_memory_bytes")
    assert _strip(got) == _strip(want)
    idle = got.get("experts_without_tokens", {}).get("pow2", [])  # tiny-moe: experts no token reached
    pow2 = got["per_layer_summary"]["pow2"]
    assert pow2["bitwise_equal"] == pow2["layers"] == got["layers"] - len(idle)


def test_row_histogram_without_atomics_equals_ulp_histogram_row_by_row():
    """batched_stats._row_hist (exponent bins, one comparison per bin) against scoring.ulp_histogram
    (frexp of every non-zero distance, bincount) row by row, on every power-of-two edge up to 2**16
    and NaN elements (distance 2**31)."""
    from requant.audit.batched_stats import _row_hist
    from requant.audit.catalogue.scoring import ulp_histogram

    edges = [0, 1, 2, 3] + [v for j in range(2, 17) for v in (2**j - 1, 2**j, 2**j + 1)]
    g = torch.Generator().manual_seed(3)
    d = torch.cat([torch.tensor(edges), torch.randint(0, 2**16 + 2, (2 * 3 * 40 - len(edges),), generator=g)])
    d = d[torch.randperm(d.numel(), generator=g)].view(2, 3, 40).to(torch.int32)
    nan = torch.rand(2, 3, 40, generator=g) < 0.1
    got = _row_hist(d, nan)
    dist = torch.where(nan, 2**31, d.to(torch.int64))
    for c in range(2):
        for r in range(3):
            assert got[c, r].tolist() == ulp_histogram(dist[c, r])


@pytest.mark.gpu
@pytest.mark.skipif(not _sm90(), reason="needs an sm90 GPU (CUTLASS)")
@pytest.mark.parametrize("pair", [("cutlass", "reference-cutlass-order"), ("triton", "reference-triton-order")])
def test_gpu_real_kernel_beside_its_emulation(pair, tmp_path, monkeypatch):
    """A real kernel against the emulation of the order it declares (one order twice: each has its
    own cells), tiny synthetic, prefill and decode: the batched path equals the per-cell path on every
    key but timings; both regimes' rows are bitwise equal (the kernel implements its order), and no
    baseline row proves a kernel fault."""
    from requant.checkpoint.synthetic import generate

    ckpt = open_checkpoint(generate("tiny", tmp_path / "tiny"))
    kw = dict(phases=("prefill", "decode"), decode_batches=(1, 8), decode_steps=2, keep_cells="all")
    kw["matrix"] = load_matrix(matrix_path("v2"))
    monkeypatch.setenv(PER_CELL_ENV, "1")
    want = run_audit(ckpt, pair, 8, "cuda", **kw)
    monkeypatch.delenv(PER_CELL_ENV)
    got = run_audit(ckpt, pair, 8, "cuda", **kw)
    for res in (got, want):
        res.pop("peak_gpu_memory_bytes")
    assert _strip(got) == _strip(want)
    for summary in (got["per_layer_summary"], got["decode"]["per_layer_summary"]):
        assert summary["pow2"]["bitwise_equal"] == summary["pow2"]["layers"]
        assert summary["native"]["bitwise_equal"] == summary["native"]["layers"]
    assert got["kernel_faults"] == [] and got["decode"]["kernel_faults"] == []
    assert {b["backend"] for b in got["baseline"]} == set(pair)


@pytest.mark.gpu
@pytest.mark.skipif(not _sm90(), reason="needs an sm90 GPU (CUTLASS)")
@pytest.mark.parametrize("preset", ["tiny", "tiny-moe"])
def test_gpu_triton_activation_quantizer_gives_the_same_audit(preset, tmp_path, monkeypatch):
    """REQUANT_AUDIT_ACT=triton (the capture quantizes through the Triton kernel) against the default
    (kernels/reference.py's quantizer), cutlass,triton, prefill, decode and the injection: every key
    equal but timings and the `activation_quantizer` the JSON then names."""
    from requant.audit.suite import ACT_ENV
    from requant.checkpoint.synthetic import generate

    ckpt = open_checkpoint(generate(preset, tmp_path / preset))
    kw = dict(
        phases=("prefill", "decode"), decode_batches=(1, 8), decode_steps=2, keep_cells="all",
        injection={"tokens": 4, "prompts": 2},
    )  # fmt: skip
    want = run_audit(ckpt, ("cutlass", "triton"), 8, "cuda", **kw)
    monkeypatch.setenv(ACT_ENV, "triton")
    got = run_audit(ckpt, ("cutlass", "triton"), 8, "cuda", **kw)
    assert got.pop("activation_quantizer") == "triton" and "activation_quantizer" not in want
    for res in (got, want):
        res.pop("peak_gpu_memory_bytes")
    assert _strip(got) == _strip(want)
