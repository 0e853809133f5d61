"""Seeded synthetic Qwen3 W8A8 checkpoints, made with llm-compressor's RTN arithmetic.

Files that look exactly like llm-compressor's output (the real Qwen3 tensor names and shapes,
int8 weights, bf16 per-channel scales, shards with an index, a compressed-tensors
quantization_config), quantized by `requant.scales.from_source.rtn_quantize`.
Presets: tiny (the old random default: 4 layers, byte-level vocab 512), qwen3-0.6b, qwen3-1.7b,
qwen3-8b, qwen3-14b, qwen3-32b (the real configs), and the Qwen3-MoE ones (tiny-moe,
qwen3-30b-a3b, qwen3-235b-a22b: requant/checkpoint/synthetic_moe.py). The files are reproducible bit for bit from
the seed and the device, independent of the sharding.

Usage: python -m requant.checkpoint.synthetic PRESET OUT [--seed N] [--shard-size BYTES] [--device DEV]
                                           [--no-outliers] [--keep-source DIR] [--force]
       python -m requant.checkpoint.synthetic PRESET --plan   (a Qwen3-MoE preset's bytes and Linears, nothing written)

Output is written atomically; a non-empty OUT (or --keep-source DIR) is refused without --force,
which replaces only a checkpoint or an empty directory.

Why, the arithmetic, the weights drawn, --device cuda: docs/checkpoints.md#synthetic-checkpoints.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from requant.checkpoint.scheme import quantization_config
from requant.checkpoint.synthetic_moe import MOE_IGNORE, MOE_PRESETS, moe_config_fields, moe_plan
from requant.errors import CheckpointError, OutputError
from requant.io.output import AtomicOutput, file_mode, output_path, refuse_unless_replaceable
from requant.models.qwen3 import Qwen3Arch
from requant.models.qwen3_moe import Qwen3MoeArch
from requant.scales.from_source import rtn_quantize

LINEAR_STD = 0.02


@dataclass(frozen=True)
class Preset(Qwen3Arch):
    """A Qwen3 architecture plus what only a generated config.json needs."""

    max_position: int
    bos: int
    eos: int


PRESETS: dict[str, Preset] = {
    # Byte-level vocabulary: token id = UTF-8 byte value; 256.. are specials (bos 256, eos 257).
    "tiny": Preset(256, 768, 4, 4, 2, 64, 512, False, 2048, 256, 257),
    "qwen3-0.6b": Preset(1024, 3072, 28, 16, 8, 128, 151936, True, 40960, 151643, 151645),
    "qwen3-1.7b": Preset(2048, 6144, 28, 16, 8, 128, 151936, True, 40960, 151643, 151645),
    "qwen3-8b": Preset(4096, 12288, 36, 32, 8, 128, 151936, False, 40960, 151643, 151645),
    "qwen3-14b": Preset(5120, 17408, 40, 40, 8, 128, 151936, False, 40960, 151643, 151645),
    "qwen3-32b": Preset(5120, 25600, 64, 64, 8, 128, 151936, False, 40960, 151643, 151645),
    **MOE_PRESETS,  # tiny-moe, qwen3-30b-a3b, qwen3-235b-a22b (requant/checkpoint/synthetic_moe.py)
}


def plan(p: Preset) -> list[tuple[str, str, tuple[int, ...]]]:
    """(module-or-tensor name, kind, shape) in model order. kind: embed, norm, linear, head
    (and router, for a Qwen3-MoE preset)."""
    if isinstance(p, Qwen3MoeArch):
        return moe_plan(p)
    out: list[tuple[str, str, tuple[int, ...]]] = [("model.embed_tokens.weight", "embed", (p.vocab, p.hidden))]
    lin = p.layer_linear_shapes()
    for i in range(p.layers):
        pre = f"model.layers.{i}."
        out.append((pre + "input_layernorm.weight", "norm", (p.hidden,)))
        for leaf in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj"):
            out.append((pre + leaf, "linear", lin[leaf]))
        out.append((pre + "self_attn.q_norm.weight", "norm", (p.head_dim,)))
        out.append((pre + "self_attn.k_norm.weight", "norm", (p.head_dim,)))
        out.append((pre + "post_attention_layernorm.weight", "norm", (p.hidden,)))
        for leaf in ("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"):
            out.append((pre + leaf, "linear", lin[leaf]))
    out.append(("model.norm.weight", "norm", (p.hidden,)))
    if not p.tie:
        out.append(("lm_head.weight", "head", (p.vocab, p.hidden)))
    return out


def _bf16_weight(gen: torch.Generator, shape, outliers: bool) -> torch.Tensor:
    dev = gen.device
    w = torch.randn(shape, generator=gen, dtype=torch.float32, device=dev).mul_(LINEAR_STD)
    if outliers:
        out, inp = shape
        # ~2% of output channels scaled by 4..16 (outlier channels: a wide spread of scales)
        n_rows = max(1, out // 50)
        rows = torch.randperm(out, generator=gen, device=dev)[:n_rows]
        factors = 4.0 + 12.0 * torch.rand(n_rows, 1, generator=gen, device=dev)
        w[rows] *= factors
        # ~5% of channels get one outlier weight (x6): heavy tails, where clipping pays
        n_el = max(1, out // 20)
        r = torch.randint(0, out, (n_el,), generator=gen, device=dev)
        c = torch.randint(0, inp, (n_el,), generator=gen, device=dev)
        w[r, c] *= 6.0
    return w.to(torch.bfloat16)


def _tensors_for(gen: torch.Generator, name: str, kind: str, shape, outliers: bool):
    """Yield (tensor name, quantized tensor, bf16 original or None) for one plan entry, on the
    host (drawn on the generator's device)."""
    if kind == "norm":
        t = torch.ones(shape, dtype=torch.bfloat16)
        yield name, t, t
    elif kind in ("embed", "head", "router"):
        t = torch.randn(shape, generator=gen, dtype=torch.float32, device=gen.device).mul_(LINEAR_STD)
        t = t.to(torch.bfloat16).cpu()
        yield name, t, t
    else:
        w = _bf16_weight(gen, shape, outliers)
        q, s = rtn_quantize(w)
        w = w.cpu()
        yield name + ".weight", q.cpu(), w
        yield name + ".weight_scale", s.cpu(), None


def _nbytes(kind: str, shape) -> tuple[int, int]:
    """(bytes in the W8A8 checkpoint, bytes in the bf16 original)."""
    n = math.prod(shape)
    if kind == "linear":
        return n + 2 * shape[0], 2 * n
    return 2 * n, 2 * n


def _shard_groups(entries, sizes: list[int], shard_size: int | None) -> list[list[int]]:
    """transformers-style: fill shards in model order, start a new one past shard_size."""
    if not shard_size:
        return [list(range(len(entries)))]
    groups: list[list[int]] = [[]]
    acc = 0
    for i, size in enumerate(sizes):
        if groups[-1] and acc + size > shard_size:
            groups.append([])
            acc = 0
        groups[-1].append(i)
        acc += size
    return groups


def model_config(p: Preset, *, quantized: bool, compression_ratio: float | None = None) -> dict:
    cfg = {
        "architectures": ["Qwen3ForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": p.bos,
        "eos_token_id": p.eos,
        "head_dim": p.head_dim,
        "hidden_act": "silu",
        "hidden_size": p.hidden,
        "initializer_range": LINEAR_STD,
        "intermediate_size": p.intermediate,
        "max_position_embeddings": p.max_position,
        "max_window_layers": p.layers,
        "model_type": "qwen3",
        "num_attention_heads": p.heads,
        "num_hidden_layers": p.layers,
        "num_key_value_heads": p.kv_heads,
        "rms_norm_eps": p.eps,
        "rope_scaling": None,
        "rope_theta": p.rope_theta,
        "sliding_window": None,
        "tie_word_embeddings": p.tie,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.51.3",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": p.vocab,
    }
    ignore = ("lm_head",)
    if isinstance(p, Qwen3MoeArch):
        cfg.update(moe_config_fields(p))
        ignore = MOE_IGNORE
    if quantized:
        cfg["quantization_config"] = quantization_config(ignore=ignore, compression_ratio=compression_ratio)
    return cfg


def write_json(path: Path, obj) -> None:
    """transformers' formatting: indent 2, sorted keys, trailing newline."""
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _check_target(path: Path, force: bool) -> None:
    if not (path.exists() or path.is_symlink()):
        return
    if path.is_dir() and not path.is_symlink() and not any(path.iterdir()):
        return
    if not force:
        raise OutputError("already exists and is not empty; pass --force to replace it", file=path)
    refuse_unless_replaceable(path, output_path(path))


def generate(
    preset: str | Preset,
    out: str | os.PathLike,
    *,
    seed: int = 0,
    shard_size: int | None = None,
    outliers: bool = True,
    keep_source: str | os.PathLike | None = None,
    force: bool = False,
    device: str = "cpu",
) -> Path:
    """Write a W8A8 checkpoint (and optionally its bf16 original) and return its path (see the
    module docstring for what may be replaced). OutputError when out or keep_source may not be."""
    p = PRESETS[preset] if isinstance(preset, str) else preset
    out = Path(out)
    src_dir = Path(keep_source) if keep_source else None
    for d in (out, src_dir):
        if d is not None:
            _check_target(d, force)
    with contextlib.ExitStack() as stack:
        dest = stack.enter_context(AtomicOutput(out, force=True))  # refused above unless empty or replaceable
        src = stack.enter_context(AtomicOutput(src_dir, force=True)) if src_dir is not None else None
        _write(p, dest.tmp, None if src is None else src.tmp, seed, shard_size, outliers, device)
        if src is not None:
            src.commit(synced=set())
        dest.commit(synced=set())
    return out


def _write(
    p: Preset, out: Path, src_dir: Path | None, seed: int, shard_size: int | None, outliers: bool, device: str = "cpu"
) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from safetensors.torch import save_file

    entries = plan(p)
    q_sizes = [_nbytes(k, s)[0] for _, k, s in entries]
    b_sizes = [_nbytes(k, s)[1] for _, k, s in entries]
    groups = _shard_groups(entries, q_sizes, shard_size)
    gen = torch.Generator(device=device).manual_seed(seed)
    n = len(groups)
    names = [f"model-{i + 1:05d}-of-{n:05d}.safetensors" if n > 1 else "model.safetensors" for i in range(n)]
    weight_map: dict[str, str] = {}

    def save(tensors, originals, fname):
        save_file(tensors, str(out / fname), metadata={"format": "pt"})
        os.chmod(out / fname, file_mode())  # safetensors writes 0600; others may read a checkpoint, as after cp
        if src_dir is not None:  # the bf16 originals, sharded alike
            save_file(originals, str(src_dir / fname), metadata={"format": "pt"})
            os.chmod(src_dir / fname, file_mode())

    # One writer thread: shard i is written while shard i + 1 is drawn (at most two in memory).
    writer = ThreadPoolExecutor(max_workers=1)
    written = None
    for fname, group in zip(names, groups):
        tensors: dict[str, torch.Tensor] = {}
        originals: dict[str, torch.Tensor] = {}
        for i in group:
            name, kind, shape = entries[i]
            for tname, t, orig in _tensors_for(gen, name, kind, shape, outliers):
                tensors[tname] = t
                weight_map[tname] = fname
                if src_dir is not None and orig is not None:
                    originals[tname] = orig
        if written is not None:
            written.result()
        written = writer.submit(save, tensors, originals, fname)
        del tensors, originals
    if written is not None:
        written.result()
    writer.shutdown()
    if n > 1:
        write_json(
            out / "model.safetensors.index.json",
            {"metadata": {"total_size": sum(q_sizes)}, "weight_map": dict(sorted(weight_map.items()))},
        )
    ratio = round(sum(b_sizes) / sum(q_sizes), 4)
    write_json(out / "config.json", model_config(p, quantized=True, compression_ratio=ratio))
    if src_dir is not None:
        if n > 1:
            src_map = {t: f for t, f in weight_map.items() if not t.endswith("_scale")}
            write_json(
                src_dir / "model.safetensors.index.json",
                {"metadata": {"total_size": sum(b_sizes)}, "weight_map": dict(sorted(src_map.items()))},
            )
        write_json(src_dir / "config.json", model_config(p, quantized=False))


def _print_plan(ap: argparse.ArgumentParser, a) -> int:
    from requant.checkpoint.synthetic_moe import plan_summary

    p = PRESETS[a.preset]
    if not a.plan:
        ap.error("OUT is required (or --plan)")
    if not isinstance(p, Qwen3MoeArch):
        ap.error("--plan describes the Qwen3-MoE presets")
    print(json.dumps(plan_summary(p), indent=2))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m requant.checkpoint.synthetic", description=__doc__.split("\n\n")[0])
    ap.add_argument("preset", choices=sorted(PRESETS))
    ap.add_argument("out", nargs="?", help="output directory (not with --plan)")
    ap.add_argument("--plan", action="store_true", help="print a Qwen3-MoE preset's sizes as JSON, write nothing")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--shard-size", type=int, default=None, help="max bytes per shard (default: one file)")
    ap.add_argument("--device", default="cpu", help="draw the tensors on this torch device (cuda: fast, other bytes)")
    ap.add_argument("--no-outliers", action="store_true")
    ap.add_argument("--keep-source", default=None, help="also write the bf16 originals here (for convert --source)")
    ap.add_argument(
        "--force", action="store_true", help="replace a non-empty OUT (only a checkpoint or an empty directory)"
    )
    ap.add_argument("--layers", type=int, default=None, help="only the first LAYERS decoder layers (widths unchanged)")
    a = ap.parse_args(argv)
    if a.plan or a.out is None:
        return _print_plan(ap, a)
    preset = PRESETS[a.preset]
    if a.layers is not None:
        if not 1 <= a.layers <= preset.layers:
            ap.error(f"--layers must be 1 to {preset.layers} for {a.preset}, got {a.layers}")
        preset = dataclasses.replace(preset, layers=a.layers)
    try:
        path = generate(
            preset,
            a.out,
            seed=a.seed,
            shard_size=a.shard_size,
            outliers=not a.no_outliers,
            keep_source=a.keep_source,
            force=a.force,
            device=a.device,
        )
    except CheckpointError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
