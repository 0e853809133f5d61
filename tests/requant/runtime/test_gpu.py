"""GPU tests of requant.runtime (marker `gpu`; skipped without CUDA), on the embedded default.

References: on the same GPU, the same model with the emulated epilogue orders
(reference-triton-order / reference-cutlass-order, kernels/reference.py): the real kernels
equal their emulated orders bit for bit (tests/kernels/test_gpu.py), and nothing else
differs between the runs, so the logits must be bitwise equal. Batch invariance on CUDA:
each prompt decoded alone against its row of the batch (RMSNorm by tree sums, the CUDA
default). Run: python3 -m pytest -q -m gpu tests/requant/runtime/test_gpu.py
"""

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU (the CUTLASS half needs sm90)", allow_module_level=True)

from requant import DEFAULT_CHECKPOINT  # noqa: E402
from requant.kernels.bf16 import bitwise_equal  # noqa: E402
from requant.models.prompts import prompts  # noqa: E402
from requant.runtime import load_model  # noqa: E402

pytestmark = pytest.mark.gpu
SM90 = torch.cuda.get_device_capability() == (9, 0)
KERNELS = [
    ("triton", "reference-triton-order"),
    pytest.param(
        "cutlass", "reference-cutlass-order", marks=pytest.mark.skipif(not SM90, reason="CUTLASS is sm90a only")
    ),
]


@pytest.fixture(scope="module", params=["native", "pow2"])
def model(request):
    return load_model(DEFAULT_CHECKPOINT, regime=request.param, device="cuda")


@pytest.fixture(scope="module")
def toks():
    from requant.checkpoint import open_checkpoint
    from requant.models.tokenizer import load_tokenizer

    tok = load_tokenizer(DEFAULT_CHECKPOINT, open_checkpoint(DEFAULT_CHECKPOINT).config["vocab_size"])
    return [tok.encode(p) for p in prompts(8)]


@pytest.mark.parametrize("kernel, emulation", KERNELS)
@pytest.mark.parametrize("act", ["reference", "triton"])
def test_kernels_equal_their_emulated_order_end_to_end(model, toks, kernel, emulation, act):
    assert model.tree  # the CUDA default
    got = model.with_backends(kernel, act).logits(toks)
    want = model.with_backends(emulation, "reference").logits(toks)
    assert all(bitwise_equal(a, b) for a, b in zip(got, want))
    g = model.with_backends(kernel, act).generate(toks, 16, keep_logits=True)
    w = model.with_backends(emulation, "reference").generate(toks, 16, keep_logits=True)
    assert g.ids == w.ids and all(bitwise_equal(a, b) for a, b in zip(g.step_logits, w.step_logits))


@pytest.mark.parametrize(
    "kernel", ["triton", pytest.param("cutlass", marks=pytest.mark.skipif(not SM90, reason="sm90a only"))]
)
def test_decode_alone_equals_inside_the_batch_on_cuda(model, toks, kernel):
    m = model.with_backends(kernel, "triton")
    batch = m.generate(toks, 24, keep_logits=True)
    for i, t in enumerate(toks):
        alone = m.generate([t], 24, keep_logits=True)
        assert alone.ids[0] == batch.ids[i], i
        assert all(bitwise_equal(alone.step_logits[s][0], batch.step_logits[s][i]) for s in range(24)), i


@pytest.mark.skipif(not SM90, reason="the pair needs CUTLASS (sm90a)")
def test_pow2_pair_is_bitwise_equal(toks):
    m = load_model(DEFAULT_CHECKPOINT, regime="pow2", device="cuda")
    a = m.with_backends("cutlass", "triton").generate(toks, 32, keep_logits=True)
    b = m.with_backends("triton", "triton").generate(toks, 32, keep_logits=True)
    assert a.ids == b.ids and all(bitwise_equal(x, y) for x, y in zip(a.step_logits, b.step_logits))


def test_decode_graph_capture_survives_garbage_that_holds_graphs(toks):
    """Garbage left by an earlier model (its decoders sit in a reference cycle and hold captured
    CUDA graphs) collected during the next capture used to destroy those graphs mid-capture and
    invalidate it: the suite-order failure. Here the collection is forced inside the capture.
    Independent reference: the same generation launched eagerly (graphs=False)."""
    import gc

    from requant.runtime import fast

    old = load_model(DEFAULT_CHECKPOINT, regime="pow2", device="cuda").with_backends("triton", "triton")
    old.generate(toks[:1], 4)  # eager first step, then a captured graph
    del old
    m = load_model(DEFAULT_CHECKPOINT, regime="pow2", device="cuda").with_backends("triton", "triton")
    forward = fast.FastEngine.forward

    def collecting_forward(self, *args, **kwargs):
        if torch.cuda.is_current_stream_capturing():
            gc.collect()  # what an automatic collection at this moment would do
        return forward(self, *args, **kwargs)

    enabled = gc.isenabled()
    gc.disable()  # the garbage survives until the capture
    fast.FastEngine.forward = collecting_forward
    try:
        got = m.generate(toks[:2], 8, keep_logits=True)
    finally:
        fast.FastEngine.forward = forward
        if enabled:
            gc.enable()
    want = m.generate(toks[:2], 8, keep_logits=True, graphs=False)
    assert got.ids == want.ids and all(bitwise_equal(a, b) for a, b in zip(got.step_logits, want.step_logits))
