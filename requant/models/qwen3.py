"""The Qwen3 decoder's shapes, described once.

The synthetic-checkpoint generator writes a config.json from this description and the
audit's runtime reads one back into it, so the two can never disagree on which Linears a
Qwen3 layer has or what their [out, in] shapes are. Only shapes and the two numeric
constants the forward pass needs live here; weights and I/O live elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# The quantized Linears of one decoder layer, in model order.
LAYER_LINEARS = (
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
)


# The sizes a config.json must give as positive integers (each is a divisor or a count): the
# one list of Qwen3 config keys (inspect and training/arch.py build on it).
SIZE_KEYS = (
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "vocab_size",
)


def _positive(key: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"config.json: {key} is {value!r}; it must be a positive integer")
    return value


@dataclass(frozen=True)
class Qwen3Arch:
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tie: bool
    # Qwen3's released values; keyword-only so that subclasses may add positional fields.
    eps: float = field(default=1e-06, kw_only=True)
    rope_theta: float = field(default=1000000, kw_only=True)

    @classmethod
    def from_config(cls, config: dict) -> "Qwen3Arch":
        """Read a transformers-style Qwen3 config.json (dict); ValueError names a missing key or
        a size that is not a positive integer."""
        try:
            for key in SIZE_KEYS:
                if key in config and config[key] is not None:
                    _positive(key, config[key])
            hidden = int(config["hidden_size"])
            heads = int(config["num_attention_heads"])
            return cls(
                hidden=hidden,
                intermediate=int(config["intermediate_size"]),
                layers=int(config["num_hidden_layers"]),
                heads=heads,
                kv_heads=int(config.get("num_key_value_heads", heads)),
                head_dim=int(config.get("head_dim") or hidden // heads),
                vocab=int(config["vocab_size"]),
                tie=bool(config.get("tie_word_embeddings", False)),
                eps=float(config.get("rms_norm_eps", 1e-6)),
                rope_theta=float(config.get("rope_theta", 10000.0)),
            )
        except KeyError as exc:
            raise ValueError(f"config.json lacks {exc.args[0]!r}: not a Qwen3 config") from None
        except TypeError as exc:
            raise ValueError(f"config.json: a field that is not a number ({exc})") from None

    def layer_linear_shapes(self) -> dict[str, tuple[int, int]]:
        """{leaf: (out, in)} for one decoder layer, in LAYER_LINEARS order."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        return {
            "self_attn.q_proj": (q, self.hidden),
            "self_attn.k_proj": (kv, self.hidden),
            "self_attn.v_proj": (kv, self.hidden),
            "self_attn.o_proj": (self.hidden, q),
            "mlp.gate_proj": (self.intermediate, self.hidden),
            "mlp.up_proj": (self.intermediate, self.hidden),
            "mlp.down_proj": (self.hidden, self.intermediate),
        }

    def linear_shapes(self) -> dict[str, tuple[int, int]]:
        """Module name -> (out, in) of every decoder-layer Linear, in model order."""
        per = self.layer_linear_shapes()
        return {f"model.layers.{i}.{leaf}": per[leaf] for i in range(self.layers) for leaf in LAYER_LINEARS}
