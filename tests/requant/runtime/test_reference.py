"""requant/runtime on the embedded default (requant.DEFAULT_CHECKPOINT) and micro checkpoints.

References, per test: the pow2 regime against requant.scales.arms.requantize; prefill against a
packed forward with a block-diagonal causal mask written here from the Qwen3 formulas; KV-cache
decoding against prefilling the whole sequence again; batch invariance against each prompt alone.
transformers' Qwen3 is the reference in test_parity.py; the engine's torch ops are tested in
tests/kernels/test_ops.py.
"""

import json
import shutil

import numpy as np
import pytest
import torch

from requant import DEFAULT_CHECKPOINT, kernels
from requant.checkpoint import open_checkpoint
from requant.checkpoint.synthetic import generate
from requant.kernels.bf16 import bitwise_equal, is_power_of_two, ulp_distance
from requant.models.prompts import prompts
from requant.models.qwen3 import Qwen3Arch
from requant.runtime import arch_from_config, dense_names, load_linears, load_model
from requant.scales.arms import requantize
from tests.requant.conftest import MICRO


@pytest.fixture(scope="module")
def ckpt():
    return open_checkpoint(DEFAULT_CHECKPOINT)


@pytest.fixture(scope="module")
def native(ckpt):
    return load_model(ckpt, regime="native")


@pytest.fixture(scope="module")
def toks(native):
    return [native.tokenizer.encode(p) for p in prompts(4)]


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    # small tensors on a shared 2-core machine: intra-op threads only add contention
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


# -- loading --------------------------------------------------------------------------------


def test_runtime_reads_every_tensor_of_the_default(ckpt):
    used = set(dense_names(ckpt.config, set(ckpt.quantized_linears)))
    for n in ckpt.quantized_linears:
        used |= {n + ".weight", n + ".weight_scale"}
    if ckpt.config.get("tie_word_embeddings"):
        used.discard("lm_head.weight")  # a tied lm_head is the embedding
    assert used == set(ckpt.tensor_names())
    assert list(Qwen3Arch.from_config(ckpt.config).linear_shapes()) == ckpt.quantized_linears


def test_pow2_regime_is_the_nearest_arm(ckpt):
    lin = load_linears(ckpt, "pow2", "cpu", threads=2)
    assert list(lin) == ckpt.quantized_linears
    for n in ckpt.quantized_linears[:3] + ckpt.quantized_linears[-2:]:
        q, s = requantize(*ckpt.weight_and_scale(n), "nearest")
        assert torch.equal(lin[n][0], q) and torch.equal(lin[n][1], s.to(torch.float32).reshape(-1, 1))
        assert bool(is_power_of_two(lin[n][1]).all())


def test_config_rope_parameters_and_refusals():
    base = json.loads((DEFAULT_CHECKPOINT / "config.json").read_text())
    tf5 = {k: v for k, v in base.items() if k != "rope_theta"}
    tf5["rope_parameters"] = {"rope_theta": 1000000.0, "rope_type": "default"}
    assert arch_from_config(tf5).rope_theta == 1e6  # transformers 5 writes no top-level rope_theta
    assert Qwen3Arch.from_config(tf5).rope_theta == 10000.0  # what the bare description would use
    for bad, word in (
        (dict(base, rope_scaling={"rope_type": "yarn", "factor": 4.0}), "yarn"),
        (dict(base, attention_bias=True), "attention_bias"),
        (dict(base, hidden_act="gelu"), "hidden_act"),
        (dict(base, use_sliding_window=True), "sliding"),
    ):
        with pytest.raises(ValueError, match=word):
            arch_from_config(bad)


def test_bad_requests_are_value_errors(native, tmp_path):
    for bad, word in (
        ([], "non-empty"),
        ([[]], "empty"),
        ([[1, native.arch.vocab]], "outside"),
        ([[-1]], "outside"),
        ([[1] * (native.max_length + 1)], "max_length"),
    ):
        with pytest.raises(ValueError, match=word):
            native.logits(bad)
    with pytest.raises(ValueError, match="max_length"):
        native.greedy([[1] * 10], max_new_tokens=native.max_length)
    with pytest.raises(ValueError, match="unknown scaled_mm backend"):
        load_model(DEFAULT_CHECKPOINT, backend="nope")
    with pytest.raises(ValueError, match="CUDA"):
        load_model(DEFAULT_CHECKPOINT, backend="cutlass", device="cpu")
    with pytest.raises(ValueError, match="regime"):
        load_model(DEFAULT_CHECKPOINT, regime="ceiling")


# -- prefill ----------------------------------------------------------------------------------


def _block_diagonal_reference(model, token_lists, backend):
    """The Qwen3 forward written out over ALL prompts packed, attention under one T x T
    block-diagonal causal mask (how the audit runtime worked before requant.runtime)."""
    sh, d = model.arch, model.dense
    ids = torch.tensor(sum(token_lists, []))
    seg = torch.cat([torch.full((len(p),), i) for i, p in enumerate(token_lists)])
    pos = torch.cat([torch.arange(len(p)) for p in token_lists])
    idx = torch.arange(len(ids))
    mask = (seg[:, None] != seg[None, :]) | (idx[None, :] > idx[:, None])

    def norm(x, w):
        xf = x.float()
        return (w.float() * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + sh.eps)).to(x.dtype).float()).to(
            x.dtype
        )

    def rot(x):
        dd = x.shape[-1]
        inv = 1.0 / (sh.rope_theta ** (torch.arange(0, dd, 2, dtype=torch.float32) / dd))
        ang = pos.float()[:, None] * inv[None, :]
        cos, sin = torch.cat([ang, ang], -1).cos()[:, None], torch.cat([ang, ang], -1).sin()[:, None]
        xf = x.float()
        return (xf * cos + torch.cat([-xf[..., dd // 2 :], xf[..., : dd // 2]], -1) * sin).to(x.dtype)

    def lin(x, name):
        if name in model.linears:
            q, s = kernels.quantize_activations(x, backend="reference")
            w, s_w = model.linears[name]
            return kernels.scaled_mm(q, w, s, s_w, backend=backend)
        return (x.float() @ d[name + ".weight"].float().T).to(torch.bfloat16)

    x = d["model.embed_tokens.weight"][ids].to(torch.bfloat16)
    t, g = len(ids), sh.heads // sh.kv_heads
    for i in range(sh.layers):
        p = f"model.layers.{i}."
        h = norm(x, d[p + "input_layernorm.weight"])
        q = rot(norm(lin(h, p + "self_attn.q_proj").view(t, sh.heads, sh.head_dim), d[p + "self_attn.q_norm.weight"]))
        k = rot(
            norm(lin(h, p + "self_attn.k_proj").view(t, sh.kv_heads, sh.head_dim), d[p + "self_attn.k_norm.weight"])
        )
        v = lin(h, p + "self_attn.v_proj").view(t, sh.kv_heads, sh.head_dim)
        qh, kh, vh = (
            q.transpose(0, 1).float(),
            k.transpose(0, 1).float().repeat_interleave(g, 0),
            v.transpose(0, 1).float().repeat_interleave(g, 0),
        )
        probs = torch.softmax(((qh @ kh.transpose(1, 2)) * sh.head_dim**-0.5).masked_fill(mask, float("-inf")), -1)
        attn = (probs.to(torch.bfloat16).float() @ vh).to(torch.bfloat16).transpose(0, 1).reshape(t, -1)
        x = x + lin(attn, p + "self_attn.o_proj")
        h = norm(x, d[p + "post_attention_layernorm.weight"])
        act = (torch.nn.functional.silu(lin(h, p + "mlp.gate_proj").float()) * lin(h, p + "mlp.up_proj").float()).to(
            torch.bfloat16
        )
        x = x + lin(act, p + "mlp.down_proj")
    return lin(norm(x, d["model.norm.weight"]), "lm_head").float()


def test_prefill_equals_a_block_diagonal_packed_forward(native, toks):
    """Attention per prompt equals the packed forward with a block-diagonal mask, bit for
    bit on this CPU (masked positions add exact zeros to the softmax sums)."""
    want = _block_diagonal_reference(native, toks, "reference-triton-order")
    got = native.logits(toks)
    assert [g.shape for g in got] == [(len(t), native.arch.vocab) for t in toks]
    assert bitwise_equal(torch.cat(got), want)


@pytest.mark.parametrize("reduction", ["torch", "tree"])
def test_prefill_alone_equals_inside_a_batch(ckpt, toks, reduction):
    model = load_model(ckpt, regime="pow2", reduction=reduction)
    batch = model.logits(toks)
    for t, b in zip(toks, batch):
        assert bitwise_equal(model.logits([t])[0], b)
    if reduction == "tree":
        # the tree changes the summation order of the norms, not the formula: a one-spacing
        # change of a norm output propagates through the layers (measured on the default's
        # 8 prompts: at most 0.9% of the logits' spread, 5 of 8 prompts bitwise equal)
        ref = load_model(ckpt, regime="pow2", reduction="torch").logits(toks)
        for a, b in zip(batch, ref):
            assert float((a - b).abs().max()) <= 0.05 * float(b.max() - b.min())


# -- decode -----------------------------------------------------------------------------------


@pytest.mark.parametrize("reduction", ["torch", "tree"])
def test_decode_alone_equals_inside_a_batch(ckpt, toks, reduction):
    """Greedy decoding of each prompt alone gives the tokens, and every step's logits, of
    its row in the batch of all prompts (different lengths), bit for bit."""
    model = load_model(ckpt, regime="native", reduction=reduction)
    batch = model.generate(toks, 6, keep_logits=True)
    for i, t in enumerate(toks):
        alone = model.generate([t], 6, keep_logits=True)
        assert alone.ids[0] == batch.ids[i]
        for s in range(6):
            assert bitwise_equal(alone.step_logits[s][0], batch.step_logits[s][i])


def test_kv_cache_decoding_against_full_prefill(native, toks):
    """Each decoded token's logits against prefilling prompt + tokens so far without a
    cache; every token must be the full prefill's argmax.

    Not bitwise by contract: prefill (kernels.ops.attend_prompt) sums q.k and P.v with torch matmuls,
    whose fp32 summation order is the CPU BLAS library's blocking (it differs between MKL and
    OpenBLAS builds, and with the thread count), and normalises with torch.softmax; decode
    (kernels.ops.attend_decode) sums the same products with tree_sum_halves. One fp32 rounding apart in
    one score can move a bf16 probability by one spacing, and that propagates through every
    later layer. Measured on this build: 0, every logit bitwise equal over 64 steps of 4 prompts;
    the bound, 1% of the logits' spread, is what the test can promise on any BLAS. The bitwise
    invariances the engine does promise (alone vs in a batch, decode steps) are the tests above."""
    gen = native.generate(toks, 8, keep_logits=True)
    for i, t in enumerate(toks):
        assert len(gen.ids[i]) == 8
        full = native.logits([t + gen.ids[i][:-1]])[0]
        for s in range(8):
            ref = full[len(t) - 1 + s]
            assert float((ref - gen.step_logits[s][i]).abs().max()) <= 0.01 * float(ref.max() - ref.min())
            assert int(ref.argmax()) == gen.ids[i][s]


def test_greedy_stops_at_eos(native, toks):
    free = native.greedy(toks[:2], max_new_tokens=5)
    first = free[0][0]
    stopped = native.greedy(toks[:2], max_new_tokens=5, eos_id=first)
    assert stopped[0] == [first]
    assert stopped[1] == (free[1][: free[1].index(first) + 1] if first in free[1] else free[1])
    assert native.greedy(toks[:1], max_new_tokens=0) == [[]]
    assert native.greedy(toks[:1], max_new_tokens=3, eos_id=[first, 7])[0] == [first]
    assert native.greedy(toks[:1], max_new_tokens=3, eos_id=np.int64(first))[0] == [first]


def test_backends_share_weights_and_pow2_orders_agree(ckpt, toks):
    a = load_model(ckpt, regime="pow2", backend="reference-cutlass-order")
    b = a.with_backends("reference-triton-order")
    assert b.linears is a.linears and b.dense is a.dense and b.backend == "reference-triton-order"
    assert a.greedy(toks, 4) == b.greedy(toks, 4)
    c = load_model(ckpt, regime="native", share=a)
    assert c.dense is a.dense and c.linears is not a.linears


# -- bf16 directories -----------------------------------------------------------------------


def test_bf16_directory_runs_every_linear_dense(tmp_path):
    """A plain bf16 Qwen3 (requant.checkpoint.synthetic --keep-source): every Linear is fp32(x) @ W^T
    of the bf16 weights (reference: the first layer's q projection recomputed in float64)."""
    src = tmp_path / "bf16"
    generate(MICRO, tmp_path / "q", seed=3, keep_source=src)
    cfg = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps(dict(cfg, quantization_config=None)))  # null counts as absent
    m = load_model(src)
    assert m.regime == "bf16" and m.linears == {} and m.tokenizer.kind == "byte-level"
    seen = []

    class Spy:
        def record(self, names, q, s):
            seen.append(names)

    lg = m.logits([[1, 5, 9, 3], [4, 4]], capture=Spy())
    assert [x.shape for x in lg] == [(4, 64), (2, 64)] and not seen  # nothing quantized
    assert m.greedy([[1, 5, 9, 3], [4, 4]], 3) == [m.greedy([[1, 5, 9, 3]], 3)[0], m.greedy([[4, 4]], 3)[0]]
    h = torch.randn(3, 32, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    (y,) = m.impl.linears.column(h, ("model.layers.0.self_attn.q_proj",), None)
    w = m.dense["model.layers.0.self_attn.q_proj.weight"]
    assert int(ulp_distance(y, (h.double() @ w.double().T).to(torch.bfloat16)).max()) <= 1
    with pytest.raises(ValueError, match="no scales"):
        load_model(src, regime="pow2")


def test_bad_bf16_directories_name_the_tensor(tmp_path):
    from safetensors.torch import load_file, save_file

    src = tmp_path / "bf16"
    generate(MICRO, tmp_path / "q", seed=3, keep_source=src)
    good = load_file(str(src / "model.safetensors"))
    bad = dict(good)
    del bad["model.layers.1.self_attn.k_norm.weight"]
    save_file(bad, str(src / "model.safetensors"))
    with pytest.raises(ValueError, match="k_norm"):
        load_model(src)
    bad = dict(good)
    bad["model.layers.0.mlp.up_proj.weight"] = torch.zeros(64, 32, dtype=torch.int8)
    save_file(bad, str(src / "model.safetensors"))
    with pytest.raises(ValueError, match="up_proj.*int8"):
        load_model(src)
    shutil.rmtree(src)
    src.mkdir()
    qwen3 = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3"}  # a Qwen3 config, but no weights
    (src / "config.json").write_text(json.dumps({"vocab_size": 64, **qwen3}))
    with pytest.raises(ValueError, match="model.safetensors"):
        load_model(src)
