"""The Qwen3-MoE decoder's shapes (Qwen3MoeForCausalLM, model_type "qwen3_moe"), described once.

Where each fact comes from (read, not copied; docs/moe.md has the list with links):
  * transformers 5.25 `models/qwen3_moe/configuration_qwen3_moe.py`: the keys num_experts,
    num_experts_per_tok, moe_intermediate_size, norm_topk_prob (default false),
    decoder_sparse_step (default 1), mlp_only_layers (default []); `num_experts` is an alias of
    `num_local_experts` there, so a config saved by transformers 5 may carry either name.
  * its `modeling_qwen3_moe.py`: layer i is sparse iff i is not in mlp_only_layers and
    num_experts > 0 and (i + 1) % decoder_sparse_step == 0; a dense layer of an MoE model is a
    Qwen3 MLP of `intermediate_size`; the router `mlp.gate` is a bias-free Linear [num_experts,
    hidden]; every expert a SwiGLU MLP of moe_intermediate_size.
  * its `conversion_mapping.py` (qwen3_moe -> qwen2_moe): the tensors on disk are one Linear per
    expert, `model.layers.L.mlp.experts.E.{gate,up,down}_proj.weight`, fused only in memory.
  * llm-compressor's MoE examples ignore ["lm_head", "re:.*mlp.gate$"]: the router stays bf16.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from requant.models.qwen3 import LAYER_LINEARS, Qwen3Arch, _positive

ARCHITECTURE = "Qwen3MoeForCausalLM"
MODEL_TYPE = "qwen3_moe"
ROUTER = "mlp.gate"
EXPERT_LEAVES = ("gate_proj", "up_proj", "down_proj")
# The MoE config keys (inspect shows them next to qwen3.SIZE_KEYS).
MOE_KEYS = (
    "num_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
    "norm_topk_prob",
    "decoder_sparse_step",
    "mlp_only_layers",
)


def is_moe_config(config: dict) -> bool:
    return isinstance(config, dict) and config.get("model_type") == MODEL_TYPE


def _num_experts(config: dict) -> int:
    a, b = config.get("num_experts"), config.get("num_local_experts")
    if a is None and b is None:
        raise ValueError(
            "config.json lacks 'num_experts' (or transformers 5's 'num_local_experts'): not a Qwen3-MoE config"
        )
    if a is not None and b is not None and a != b:
        raise ValueError(f"config.json: num_experts {a!r} and num_local_experts {b!r} disagree")
    key = "num_experts" if a is not None else "num_local_experts"
    return _positive(key, a if a is not None else b)


@dataclass(frozen=True)
class Qwen3MoeArch(Qwen3Arch):
    """Qwen3Arch plus the experts. `intermediate` is the dense MLP's size (mlp_only_layers)."""

    experts: int = field(default=1, kw_only=True)
    top_k: int = field(default=1, kw_only=True)
    moe_intermediate: int = field(default=1, kw_only=True)
    norm_topk_prob: bool = field(default=False, kw_only=True)
    sparse_step: int = field(default=1, kw_only=True)
    mlp_only_layers: tuple[int, ...] = field(default=(), kw_only=True)

    @classmethod
    def from_config(cls, config: dict) -> "Qwen3MoeArch":
        """Read a Qwen3-MoE config.json; ValueError names the key that is missing or wrong
        (e.g. num_experts_per_tok above num_experts, a layer of mlp_only_layers out of range)."""
        base = Qwen3Arch.from_config(config)
        experts = _num_experts(config)
        for key in ("num_experts_per_tok", "moe_intermediate_size"):
            if key not in config:
                raise ValueError(f"config.json lacks {key!r}: not a Qwen3-MoE config")
            _positive(key, config[key])
        top_k = config["num_experts_per_tok"]
        if top_k > experts:
            raise ValueError(f"config.json: num_experts_per_tok {top_k} is more than num_experts {experts}")
        step = config.get("decoder_sparse_step", 1)
        step = 1 if step is None else _positive("decoder_sparse_step", step)
        norm = config.get("norm_topk_prob", False)
        if not isinstance(norm, bool):
            raise ValueError(f"config.json: norm_topk_prob is {norm!r}; it must be true or false")
        only = config.get("mlp_only_layers") or []
        if not isinstance(only, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in only):
            raise ValueError(f"config.json: mlp_only_layers is {only!r}; it must be a list of layer indices")
        bad = [i for i in only if not 0 <= i < base.layers]
        if bad:
            raise ValueError(f"config.json: mlp_only_layers names layer {bad[0]}, outside 0..{base.layers - 1}")
        return cls(
            **{f: getattr(base, f) for f in base.__dataclass_fields__},
            experts=experts,
            top_k=top_k,
            moe_intermediate=config["moe_intermediate_size"],
            norm_topk_prob=norm,
            sparse_step=step,
            mlp_only_layers=tuple(sorted(set(only))),
        )

    def is_moe(self, i: int) -> bool:
        """transformers' rule for layer i (0-based)."""
        return i not in self.mlp_only_layers and self.experts > 0 and (i + 1) % self.sparse_step == 0

    def moe_layers(self) -> list[int]:
        return [i for i in range(self.layers) if self.is_moe(i)]

    def expert_shapes(self) -> dict[str, tuple[int, int]]:
        """{leaf: (out, in)} of one expert's three Linears."""
        m = self.moe_intermediate
        return {"gate_proj": (m, self.hidden), "up_proj": (m, self.hidden), "down_proj": (self.hidden, m)}

    def layer_shapes(self, i: int) -> dict[str, tuple[int, int]]:
        """{module suffix: (out, in)} of layer i's Linears in model order: attention, then the
        router and every expert (a sparse layer) or the dense MLP (a layer of mlp_only_layers)."""
        dense = Qwen3Arch.layer_linear_shapes(self)
        out = {n: dense[n] for n in LAYER_LINEARS[:4]}
        if not self.is_moe(i):
            out.update({n: dense[n] for n in LAYER_LINEARS[4:]})
            return out
        out[ROUTER] = (self.experts, self.hidden)
        per = self.expert_shapes()
        for e in range(self.experts):
            for leaf in EXPERT_LEAVES:
                out[f"mlp.experts.{e}.{leaf}"] = per[leaf]
        return out

    def layer_linear_shapes(self) -> dict[str, tuple[int, int]]:
        raise TypeError("a Qwen3-MoE layer's Linears depend on the layer: use layer_shapes(i)")

    def linear_shapes(self) -> dict[str, tuple[int, int]]:
        """Module name -> (out, in) of every decoder-layer Linear (routers included), in model order."""
        return {f"model.layers.{i}.{n}": s for i in range(self.layers) for n, s in self.layer_shapes(i).items()}

    def routers(self) -> list[str]:
        return [f"model.layers.{i}.{ROUTER}" for i in self.moe_layers()]


def arch_of(config: dict) -> Qwen3Arch:
    """The architecture description of a config.json: Qwen3MoeArch for model_type qwen3_moe,
    else Qwen3Arch (dense)."""
    return Qwen3MoeArch.from_config(config) if is_moe_config(config) else Qwen3Arch.from_config(config)
