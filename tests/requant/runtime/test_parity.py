"""requant.runtime against transformers' Qwen3ForCausalLM with the same weights.

Reference: transformers' own Qwen3 (5.x), built from the checkpoint's config.json (minus
quantization_config) in float32 ("eager" attention), with
  * every quantized Linear's weight dequantized as q * s in fp32 (exact: an int8 times a
    bf16 scale has at most 16 significant bits);
  * every quantized Linear's input fake-quantized by a forward pre-hook with the same
    per-token quantizer (kernels.quantize_activations, reference): x -> q_a * s_a;
  * norms, embeddings and the non-quantized lm_head as stored (bf16 -> fp32, exact).
The logits are compared, not their bits, with a yardstick measured in the same test: transformers' bf16
model (same weights, same hooks) against the same fp32 reference. Thresholds: relative RMS <= max(1.25 x
transformers' bf16, 0.02) and <= 0.05; top-1 agreement >= transformers' bf16 - 5 points and >= 90%; max
deviation <= max(1.5 x transformers' bf16, 2% of the range). relative RMS = sqrt(mean((ours - ref)^2)) /
std(ref), over all positions and the vocabulary.

Why not zero, and the faults the thresholds catch: docs/runtime.md#parity-with-transformers; the
measured values: docs/results.md#runtime-and-determinism.
"""

import pytest
import torch

from requant import DEFAULT_CHECKPOINT, kernels
from requant.checkpoint import open_checkpoint
from requant.models.prompts import prompts
from requant.runtime import load_model

transformers = pytest.importorskip("transformers")


def hf_qwen3(config: dict, tensors: dict, quantized: set, dtype) -> torch.nn.Module:
    """transformers' Qwen3ForCausalLM with these fp32 weights, cast to dtype, with the
    per-token fake quantization on the inputs of the `quantized` Linears."""
    cfg = {k: v for k, v in config.items() if k != "quantization_config"}
    model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**cfg, attn_implementation="eager")).eval()
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    model = model.to(dtype)

    def fake_quant(module, args):
        x = args[0]
        q, s = kernels.quantize_activations(x.reshape(-1, x.shape[-1]), backend="reference")
        return ((q.to(torch.float32) * s).to(x.dtype).reshape(x.shape),)

    for name, mod in model.named_modules():
        if name in quantized:
            mod.register_forward_pre_hook(fake_quant)
    return model


def w8a8_tensors(ckpt) -> dict:
    out = {}
    for n in ckpt.tensor_names():
        if n.endswith(".weight_scale"):
            continue
        module = n[: -len(".weight")]
        if module in ckpt.quantized_linears:
            q, s = ckpt.weight_and_scale(module)
            out[n] = q.to(torch.float32) * s.to(torch.float32)  # exact
        else:
            out[n] = ckpt.tensor(n).to(torch.float32)
    return out


def deviation(ours: list, ref: list) -> dict:
    o, r = torch.cat(ours), torch.cat(ref)
    spread = max(float(x.max() - x.min()) for x in ref)
    return {
        "rel_rms": float((o - r).pow(2).mean().sqrt() / r.std()),
        "max_rel": float((o - r).abs().max()) / spread,
        "top1": float((o.argmax(-1) == r.argmax(-1)).to(torch.float64).mean()),
    }


def check_against_yardstick(ours: dict, yard: dict, what: str) -> None:
    print(f"\n{what}: runtime vs fp32 transformers {ours}; transformers bf16 vs fp32 {yard}")
    assert ours["rel_rms"] <= max(1.25 * yard["rel_rms"], 0.02) and ours["rel_rms"] <= 0.05, (ours, yard)
    assert ours["top1"] >= min(yard["top1"] - 0.05, 0.99) and ours["top1"] >= 0.90, (ours, yard)
    assert ours["max_rel"] <= max(1.5 * yard["max_rel"], 0.02), (ours, yard)


@pytest.fixture(scope="module")
def setup():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    ckpt = open_checkpoint(DEFAULT_CHECKPOINT)
    tensors = w8a8_tensors(ckpt)
    quantized = set(ckpt.quantized_linears)
    ref32 = hf_qwen3(ckpt.config, tensors, quantized, torch.float32)
    ref16 = hf_qwen3(ckpt.config, tensors, quantized, torch.bfloat16)
    model = load_model(ckpt)
    yield model, ref32, ref16, [model.tokenizer.encode(p) for p in prompts(8)]
    torch.set_num_threads(n)


def _hf_logits(model, seqs):
    with torch.no_grad():
        return [model(torch.tensor([s])).logits[0].to(torch.float32) for s in seqs]


def test_prefill_logits_match_transformers(setup):
    model, ref32, ref16, toks = setup
    r32 = _hf_logits(ref32, toks)
    check_against_yardstick(
        deviation(model.logits(toks), r32), deviation(_hf_logits(ref16, toks), r32), "prefill, 8 prompts"
    )


def test_kv_cache_decode_matches_transformers(setup):
    """The decode path (KV cache, tree-sum attention): each new token's logits against
    transformers on prompt + tokens so far (its own prefill, no cache involved)."""
    model, ref32, ref16, toks = setup
    gen = model.generate(toks, 12, keep_logits=True)
    seqs = [t + gen.ids[i][:-1] for i, t in enumerate(toks)]
    r32, r16 = _hf_logits(ref32, seqs), _hf_logits(ref16, seqs)
    pick = [(i, len(t) - 1 + s) for i, t in enumerate(toks) for s in range(12)]
    ours = [torch.stack([gen.step_logits[s][i] for i in range(len(toks)) for s in range(12)])]
    check_against_yardstick(
        deviation(ours, [torch.stack([r32[i][p] for i, p in pick])]),
        deviation([torch.stack([r16[i][p] for i, p in pick])], [torch.stack([r32[i][p] for i, p in pick])]),
        "decode, 8 prompts x 12 tokens",
    )


def check_four_prompts(model, ref32, ref16, what: str) -> None:
    """The first 4 built-in prompts' prefill logits against the fp32 reference, with the yardstick."""
    toks = [model.tokenizer.encode(p) for p in prompts(4)]
    r32 = _hf_logits(ref32, toks)
    check_against_yardstick(deviation(model.logits(toks), r32), deviation(_hf_logits(ref16, toks), r32), what)


def test_bf16_directory_matches_transformers(tmp_path):
    """The bf16 row: a plain bf16 Qwen3 directory (the tiny preset's originals, written by
    requant.checkpoint.synthetic --keep-source) with every Linear dense, against transformers on the
    same weights in fp32 (no fake quantization anywhere)."""
    from safetensors.torch import load_file

    from requant.checkpoint.synthetic import generate

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        src = tmp_path / "bf16"
        generate("tiny", tmp_path / "q", keep_source=src)
        model = load_model(src)
        tensors = {k: v.to(torch.float32) for k, v in load_file(str(src / "model.safetensors")).items()}
        ref32 = hf_qwen3(model.config, tensors, set(), torch.float32)
        ref16 = hf_qwen3(model.config, tensors, set(), torch.bfloat16)
        check_four_prompts(model, ref32, ref16, "bf16 directory, 4 prompts")
    finally:
        torch.set_num_threads(n)
