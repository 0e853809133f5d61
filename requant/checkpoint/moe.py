"""The Qwen3-MoE tensor layout, checked when a checkpoint is opened (after the generic checks).

A Qwen3-MoE checkpoint stores one Linear per expert, as llm-compressor and the Hub write them:
`model.layers.L.mlp.experts.E.{gate,up,down}_proj.weight` (+ `.weight_scale` when quantized),
and the router `model.layers.L.mlp.gate.weight` [num_experts, hidden], which W8A8 recipes keep
in bf16 (ignore `re:.*mlp.gate$`). Checked here, each fault one line naming the tensor: every
expert of every sparse layer present with its config shape; no expert index at or beyond
num_experts; no expert in a dense layer (mlp_only_layers, decoder_sparse_step) nor a dense MLP
in a sparse one; the router present, of its shape, and, when stored unquantized, ignored by
the quantization config (else the config says it is quantized and a server would misread it).
"""

from __future__ import annotations

import re

from requant.errors import LayoutError, TensorError
from requant.models.qwen3_moe import EXPERT_LEAVES, ROUTER, Qwen3MoeArch

_EXPERT = re.compile(r"^model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.([A-Za-z_]+)\.")
_DENSE_MLP = re.compile(r"^model\.layers\.(\d+)\.mlp\.(gate_proj|up_proj|down_proj)\.")
_ROUTER = re.compile(r"^model\.layers\.(\d+)\.mlp\.gate\.")


def check_moe_layout(ckpt) -> None:
    """Raise LayoutError (a tensor missing) or TensorError (a tensor wrong) naming file and tensor."""
    from requant.checkpoint import is_ignored

    arch = Qwen3MoeArch.from_config(ckpt.config)  # check_qwen3 validated it already
    names = ckpt.weight_map
    where = f"num_hidden_layers {arch.layers}, num_experts {arch.experts}"
    for tname in names:
        m = _EXPERT.match(tname) or _DENSE_MLP.match(tname) or _ROUTER.match(tname)
        if m is None:
            continue
        layer = int(m.group(1))
        f = ckpt.shard_of(tname).path
        if layer >= arch.layers:
            raise TensorError(f"layer {layer} does not exist ({where})", file=f, tensor=tname)
        sparse = arch.is_moe(layer)
        if m.re is _EXPERT:
            expert, leaf = int(m.group(2)), m.group(3)
            if not sparse:
                raise TensorError(_dense_layer(arch, layer) + ", but it holds expert tensors", file=f, tensor=tname)
            if expert >= arch.experts:
                raise TensorError(
                    f"expert {expert}, but config.json has num_experts {arch.experts}", file=f, tensor=tname
                )
            if leaf not in EXPERT_LEAVES:
                raise TensorError(
                    f"unknown expert Linear {leaf!r} (expected {', '.join(EXPERT_LEAVES)})", file=f, tensor=tname
                )
        elif m.re is _DENSE_MLP and sparse:
            raise TensorError(
                f"layer {layer} is sparse (experts) in config.json, but holds a dense MLP", file=f, tensor=tname
            )
        elif m.re is _ROUTER and not sparse:
            raise TensorError(_dense_layer(arch, layer) + ", but it holds a router", file=f, tensor=tname)
    quantized = set(ckpt.quantized_linears)
    for i in range(arch.layers):
        for suffix, shape in arch.layer_shapes(i).items():
            module = f"model.layers.{i}.{suffix}"
            tname = module + ".weight"
            if tname not in names:
                what = (
                    "the router of"
                    if suffix == ROUTER
                    else ("an expert Linear of" if ".experts." in suffix else "a Linear of")
                )
                raise LayoutError(f"missing {what} layer {i} ({where})", file=ckpt.path, tensor=tname)
            got = tuple(ckpt.info(tname).shape)
            if got != shape:
                raise TensorError(
                    f"shape {list(got)}, but config.json (hidden_size {arch.hidden}, moe_intermediate_size "
                    f"{arch.moe_intermediate}, intermediate_size {arch.intermediate}, num_experts {arch.experts}) "
                    f"gives {list(shape)}",
                    file=ckpt.shard_of(tname).path,
                    tensor=tname,
                )
            if suffix == ROUTER and module not in quantized and not is_ignored(module, ckpt.scheme.ignore):
                raise TensorError(
                    f"router stored as {ckpt.info(tname).dtype} without a weight_scale, but quantization_config "
                    "does not ignore it (W8A8 MoE recipes ignore 're:.*mlp.gate$')",
                    file=ckpt.shard_of(tname).path,
                    tensor=tname,
                )


def _dense_layer(arch: Qwen3MoeArch, layer: int) -> str:
    why = "in mlp_only_layers" if layer in arch.mlp_only_layers else f"by decoder_sparse_step {arch.sparse_step}"
    return f"layer {layer} is dense ({why})"
