"""audit/runtime.py and audit/capture.py on the embedded default (requant.DEFAULT_CHECKPOINT).

References: RoPE against the complex-rotation formula; RMSNorm against its definition;
the pow2 regime against requant.arms.requantize and kernels.bf16.is_power_of_two; the
captured operands against kernels.quantize_activations."""

import pytest
import torch

import kernels
from audit.capture import CALIBRATION_PROMPTS, Capture, prompts, run_prompts, tokenizer_for
from audit.runtime import Qwen3Shape, Qwen3W8A8, dense_names, load_dense, load_linears, rms_norm, rope
from kernels.bf16 import bitwise_equal, is_power_of_two
from requant import DEFAULT_CHECKPOINT
from requant.arms import requantize
from requant.checkpoint import open_checkpoint


@pytest.fixture(scope="module")
def ckpt():
    return open_checkpoint(DEFAULT_CHECKPOINT)


@pytest.fixture(scope="module")
def dense(ckpt):
    return load_dense(ckpt, "cpu")


def test_rope_is_a_complex_rotation():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 2, 8, generator=g).to(torch.bfloat16)
    got = rope(x, 10000.0)
    xf = x.to(torch.float32)
    c = torch.complex(xf[..., :4], xf[..., 4:])
    inv = 1.0 / (10000.0 ** (torch.arange(0, 8, 2, dtype=torch.float32) / 8))
    ang = torch.arange(5, dtype=torch.float32)[:, None] * inv[None, :]
    r = c * torch.polar(torch.ones_like(ang), ang)[:, None, :]
    want = torch.cat([r.real, r.imag], dim=-1).to(torch.bfloat16)
    # the formula and cos/sin arithmetic agree to the bit after the bf16 cast on this input
    assert (got.to(torch.float32) - want.to(torch.float32)).abs().max() <= 2 ** -6


def test_rms_norm_definition():
    x = torch.tensor([[3.0, 4.0]], dtype=torch.bfloat16)
    w = torch.tensor([1.0, 2.0], dtype=torch.bfloat16)
    y = rms_norm(x, w, 0.0)
    want = torch.tensor([[3.0, 4.0]]) / (12.5 ** 0.5)
    assert bitwise_equal(y, (want.to(torch.bfloat16).to(torch.float32) * torch.tensor([1.0, 2.0])).to(torch.bfloat16))


def test_runtime_reads_every_tensor_of_the_default(ckpt):
    used = set(dense_names(ckpt.config, set(ckpt.quantized_linears)))
    for n in ckpt.quantized_linears:
        used |= {n + ".weight", n + ".weight_scale"}
    assert used == set(ckpt.tensor_names())
    assert list(Qwen3Shape.from_config(ckpt.config).linear_shapes()) == ckpt.quantized_linears


def test_pow2_regime_is_the_nearest_arm(ckpt):
    lin = load_linears(ckpt, "pow2", "cpu")
    for n in ckpt.quantized_linears[:3]:
        q, s = requantize(*ckpt.weight_and_scale(n), "nearest")
        assert torch.equal(lin[n][0], q) and torch.equal(lin[n][1], s.to(torch.float32).reshape(-1, 1))
        assert bool(is_power_of_two(lin[n][1]).all())


def test_capture_shares_operands_and_pow2_logits_are_equal(ckpt, dense):
    encode, kind = tokenizer_for(ckpt.path, 512)
    assert kind == "byte-level" and encode("Hé") == [72, 195, 169]
    toks = [encode(p) for p in prompts(2)]
    model = Qwen3W8A8(ckpt.config, dense, load_linears(ckpt, "pow2", "cpu"))
    cap = Capture()
    la = run_prompts(model, toks, "reference-cutlass-order", cap, "cpu")
    lb = run_prompts(model, toks, "reference-triton-order", None, "cpu")
    assert la.shape == (sum(map(len, toks)), 512)
    assert bitwise_equal(la, lb)  # every layer bitwise equal under pow2 -> equal logits
    assert bitwise_equal(la, run_prompts(model, toks, "reference-cutlass-order", None, "cpu"))  # deterministic
    ops = cap.operands()
    p = "model.layers.0."
    assert ops[p + "self_attn.q_proj"] is ops[p + "self_attn.k_proj"] is ops[p + "self_attn.v_proj"]
    assert ops[p + "mlp.gate_proj"] is ops[p + "mlp.up_proj"]
    assert ops[p + "mlp.down_proj"].a.shape == (sum(map(len, toks)), 768)
    # the first layer's input is the embedding's RMSNorm: recompute and quantize it
    x = torch.cat([rms_norm(dense["model.embed_tokens.weight"][torch.tensor(t)], dense[p + "input_layernorm.weight"], 1e-6) for t in toks])
    q, s = kernels.quantize_activations(x, backend="reference")
    assert torch.equal(ops[p + "self_attn.q_proj"].a, q) and torch.equal(ops[p + "self_attn.q_proj"].s_a, s)


def test_prompt_count_bounds():
    assert prompts(len(CALIBRATION_PROMPTS)) == list(CALIBRATION_PROMPTS)
    with pytest.raises(ValueError):
        prompts(0)
    with pytest.raises(ValueError):
        prompts(len(CALIBRATION_PROMPTS) + 1)
