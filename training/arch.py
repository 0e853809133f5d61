"""The default model's architecture, and its config.json written the requant.checkpoint.synthetic way.

DEFAULT: a Qwen3 with hidden 256, intermediate 768, 6 layers, 4 query heads and 2 KV heads
of dimension 64, vocabulary 8,192 (training/tokenizer), embeddings tied to the output layer
(as in Qwen3-1.7B, so no lm_head.weight is stored and lm_head is not quantized),
rms_norm_eps 1e-6, max_position_embeddings 2048: 6,819,840 parameters.

rope_theta is Qwen3's 1e6, not the 10,000 of older models. The default stands in for the
released Qwen3 checkpoints, whose configs all carry 1e6, so the runtime, the transformers
parity test and vLLM see the same RoPE constant as on a real Qwen3. The cost at this size is
small: with head_dim 64, 10 of the 32 RoPE frequencies turn at least once over a 512-token
window under 1e6 (15 under 10,000); the slower ones act as almost position-free channels.
(transformers 5 reads the top-level `rope_theta` into `rope_parameters`; requant's Qwen3Arch
reads it directly: both agree, tested.)

TINY: a 2-layer, 64-wide version with the same vocabulary, for CPU tests only.

bos = eos = `<|endoftext|>` = id 0, as the Qwen3 base models use one end-of-text token.
"""

from __future__ import annotations

from dataclasses import replace

from requant.checkpoint.synthetic import Preset, model_config
from requant.models.qwen3 import SIZE_KEYS

EOT_ID = 0
DEFAULT = Preset(
    hidden=256,
    intermediate=768,
    layers=6,
    heads=4,
    kv_heads=2,
    head_dim=64,
    vocab=8192,
    tie=True,
    max_position=2048,
    bos=EOT_ID,
    eos=EOT_ID,
    eps=1e-6,
    rope_theta=1000000.0,
)
TINY = replace(DEFAULT, hidden=64, intermediate=192, layers=2, heads=2, kv_heads=1, head_dim=32)


def preset(tiny: bool = False) -> Preset:
    return TINY if tiny else DEFAULT


def config_dict(p: Preset) -> dict:
    """The bf16 model's config.json (transformers Qwen3 keys), as requant.checkpoint.synthetic writes it."""
    return model_config(p, quantized=False)


def preset_from_config(cfg: dict, file: str = "config.json") -> Preset:
    """The Preset a config.json written by config_dict describes; ValueError names the field
    when the config is not exactly such a config (so that re-writing it changes nothing)."""
    keys = (
        *SIZE_KEYS,
        "tie_word_embeddings",
        "max_position_embeddings",
        "bos_token_id",
        "eos_token_id",
        "rms_norm_eps",
        "rope_theta",
    )
    for k in keys:
        if k not in cfg:
            raise ValueError(f"{file}: no {k!r}: not a Qwen3 config written by training/arch.py")
    p = Preset(
        hidden=cfg["hidden_size"],
        intermediate=cfg["intermediate_size"],
        layers=cfg["num_hidden_layers"],
        heads=cfg["num_attention_heads"],
        kv_heads=cfg["num_key_value_heads"],
        head_dim=cfg["head_dim"],
        vocab=cfg["vocab_size"],
        tie=cfg["tie_word_embeddings"],
        max_position=cfg["max_position_embeddings"],
        bos=cfg["bos_token_id"],
        eos=cfg["eos_token_id"],
        eps=cfg["rms_norm_eps"],
        rope_theta=cfg["rope_theta"],
    )
    want = config_dict(p)
    for k in sorted(set(want) | set(cfg)):
        if cfg.get(k, "<missing>") != want.get(k, "<missing>"):
            raise ValueError(
                f"{file}: field {k!r} is {cfg.get(k, '<missing>')!r}, expected {want.get(k, '<missing>')!r}"
            )
    if not p.tie:
        raise ValueError(f"{file}: tie_word_embeddings must be true for the default model")
    return p


def parameter_count(p: Preset) -> int:
    """Parameters with tied embeddings counted once."""
    per_layer = sum(o * i for o, i in p.layer_linear_shapes().values()) + 2 * p.hidden + 2 * p.head_dim
    return p.vocab * p.hidden + p.layers * per_layer + p.hidden + (0 if p.tie else p.vocab * p.hidden)
