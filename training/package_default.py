"""Package a trained default model as requant's embedded checkpoints (runs on the CPU).

    PYTHONPATH=. python3 training/package_default.py TRAIN_OUT [--out-dir requant/data] [--force]

TRAIN_OUT is train_default.py's output (model.safetensors in bf16 with transformers' names,
config.json). Two checkpoints are written into --out-dir:

  default-bf16/  the trained model as a plain Qwen3 checkpoint: config.json (transformers
                 Qwen3 keys, no quantization_config), model.safetensors (bf16), the tokenizer
                 files. It is the `--source` of `requant convert`.
  default/       the W8A8 compressed-tensors checkpoint: every decoder Linear quantized with
                 llm-compressor's RTN arithmetic (requant.scales.from_source.rtn_quantize: int8 [out,
                 in] weights that may hold -128, bf16 scales absmax/127.5 [out, 1]); lm_head
                 is tied to the embeddings and stays unquantized (ignore ["lm_head"]); the
                 embeddings and norms are the bf16 source's tensors, byte for byte; the real
                 compressed-tensors quantization_config (requant.checkpoint.scheme.quantization_config)
                 with the compression ratio computed as requant.checkpoint.synthetic.generate does.

Both are written the way requant.checkpoint.synthetic writes checkpoints: one model.safetensors made by
the safetensors library (`__metadata__` {"format": "pt"}; the library orders the data by
dtype and name, so the bytes depend only on the tensors), config.json with sorted keys and
indent 2, and here also tokenizer.json, tokenizer_config.json and generation_config.json
copied from training/tokenizer/ (sha256 checked), and a README.md (README_TEMPLATE: YAML front
matter with the license, Apache-2.0 as the project's, which `requant card` carries into the
cards of conversions; the model, its data and its recipe). README.md is not covered by a
manifest (requant.evidence.manifest), so it can be reworded without changing the checkpoints' digests.
Hence running this twice gives the same
bytes, and `requant convert OUT/default --source OUT/default-bf16 --arm unconstrained`
reproduces OUT/default byte for byte; the script checks both facts on what it wrote
(open_checkpoint, then that conversion) before anything is moved into place.

Size: both directories together at most 25 MB (25,000,000 bytes); the sizes are printed.
Output is atomic: everything is built in a temporary directory inside --out-dir and renamed
into place at the end; an existing default/ or default-bf16/ is replaced only with --force.
Exit status: 0 done, 1 bad input or a failed check (one line on stderr naming the file).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
import uuid
from pathlib import Path

import torch

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from requant.checkpoint.synthetic import model_config, plan, write_json  # noqa: E402
from requant.io.markdown import table  # noqa: E402
from requant.scales.from_source import rtn_quantize  # noqa: E402
from training import arch  # noqa: E402
from training.train_tokenizer import TOKENIZER_DIR, TOKENIZER_SHA256, sha256_file  # noqa: E402

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json")
MAX_BYTES = 25_000_000
NAMES = ("default", "default-bf16")
DEFAULT_OUT_DIR = Path(__file__).resolve().parent.parent / "requant" / "data"


README_TEMPLATE = """---
license: apache-2.0
language:
- en
library_name: transformers
pipeline_tag: text-generation
tags:
- qwen3
{tags}---

# requant's embedded default: a {params:,}-parameter Qwen3, {what}

A small Qwen3 (hidden {hidden}, {layers} layers, {heads} heads, {kv} KV heads, head_dim {head_dim},
intermediate {inter}, vocabulary {vocab}, tied embeddings) trained from scratch by
`training/train_default.py` in the requant repository on public-domain English: Jane Austen's
novels except *Sense and Sensibility* and the King James Bible (Project Gutenberg texts).
*Sense and Sensibility* is held out whole: it is the text of `requant eval`'s `requant-heldout`
task. The tokenizer is a byte-level BPE of 8,192 ids trained on the same training text.

{body}

It exists to make requant's commands mean something offline (perplexity, greedy generation,
the audit's real activations); it is not a useful language model.
"""
W8A8_BODY = """This is the W8A8 checkpoint in compressed-tensors format, as llm-compressor writes it: every
decoder Linear quantized by round-to-nearest with a per-channel bf16 scale absmax/127.5 (int8
weights that may hold -128), per-token dynamic int8 activations, lm_head and norms unquantized.
Its bf16 original is `default-bf16` beside it (`requant convert --source`)."""
BF16_BODY = """This is the bf16 original (a plain transformers Qwen3 checkpoint); `default` beside it is its
W8A8 quantization."""


class PackageError(Exception):
    """Bad input or a failed check: one line, exit status 1."""


def read_trained(train_out: Path):
    """(Preset, {name: bf16 tensor}) from train_default.py's output, every name, dtype and
    shape checked against the architecture its config.json describes."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    cfg_path, st_path = train_out / "config.json", train_out / "model.safetensors"
    for f in (cfg_path, st_path):
        if not f.is_file():
            raise PackageError(f"{f}: missing (expected train_default.py's output)")
    try:
        cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise PackageError(f"{cfg_path}: not JSON ({exc})") from None
    if not isinstance(cfg, dict):
        raise PackageError(f"{cfg_path}: not a JSON object")
    try:
        p = arch.preset_from_config(cfg, str(cfg_path))
    except ValueError as exc:
        raise PackageError(str(exc)) from None
    try:
        tensors = load_file(str(st_path))
    except (SafetensorError, OSError, ValueError) as exc:
        raise PackageError(f"{st_path}: not a readable safetensors file ({exc})") from None
    want = {}
    for name, kind, shape in plan(p):
        want[name + ".weight" if kind == "linear" else name] = shape
    extra = sorted(set(tensors) - set(want))
    if extra:
        raise PackageError(f"{st_path}: unexpected tensor {extra[0]} (a tied model stores no lm_head.weight)")
    for name, shape in want.items():
        t = tensors.get(name)
        if t is None:
            raise PackageError(f"{st_path}: tensor {name} is missing")
        if t.dtype != torch.bfloat16:
            raise PackageError(f"{st_path}: tensor {name} is {t.dtype}, expected torch.bfloat16")
        if tuple(t.shape) != tuple(shape):
            raise PackageError(f"{st_path}: tensor {name} has shape {list(t.shape)}, expected {list(shape)}")
        if not bool(torch.isfinite(t).all()):
            raise PackageError(f"{st_path}: tensor {name} has non-finite values")
    return p, tensors


def build(p, tensors: dict[str, torch.Tensor], bf16_dir: Path, w8a8_dir: Path) -> None:
    """Write both checkpoints (directories must exist and be empty)."""
    from safetensors.torch import save_file

    src: dict[str, torch.Tensor] = {}
    quant: dict[str, torch.Tensor] = {}
    for name, kind, _ in plan(p):
        if kind == "linear":
            w = tensors[name + ".weight"]
            try:
                q, s = rtn_quantize(w)
            except ValueError as exc:
                raise PackageError(f"tensor {name}.weight: {exc}") from None
            src[name + ".weight"] = w
            quant[name + ".weight"], quant[name + ".weight_scale"] = q, s
        else:  # embeddings and norms: the same tensor (the same bytes) in both checkpoints
            src[name] = quant[name] = tensors[name]
    save_file(src, str(bf16_dir / "model.safetensors"), metadata={"format": "pt"})
    save_file(quant, str(w8a8_dir / "model.safetensors"), metadata={"format": "pt"})

    def nbytes(d):
        return sum(t.numel() * t.element_size() for t in d.values())

    ratio = round(nbytes(src) / nbytes(quant), 4)  # as requant.checkpoint.synthetic.generate: bf16 bytes / W8A8 bytes
    write_json(bf16_dir / "config.json", model_config(p, quantized=False))
    write_json(w8a8_dir / "config.json", model_config(p, quantized=True, compression_ratio=ratio))
    for d in (bf16_dir, w8a8_dir):
        for f in TOKENIZER_FILES:
            shutil.copyfile(TOKENIZER_DIR / f, d / f)
    params = arch.parameter_count(p)
    for d, what, tags, body in (
        (bf16_dir, "bf16", "", BF16_BODY),
        (w8a8_dir, "INT8 W8A8", "- int8\n- w8a8\n- compressed-tensors\n", W8A8_BODY),
    ):
        (d / "README.md").write_text(
            README_TEMPLATE.format(
                params=params,
                what=what,
                tags=tags,
                body=body,
                hidden=p.hidden,
                layers=p.layers,
                heads=p.heads,
                kv=p.kv_heads,
                head_dim=p.head_dim,
                inter=p.intermediate,
                vocab=p.vocab,
            ),
            encoding="utf-8",
        )


def tree_bytes(root: Path) -> dict[str, bytes]:
    return {q.relative_to(root).as_posix(): q.read_bytes() for q in sorted(root.rglob("*")) if q.is_file()}


def self_check(bf16_dir: Path, w8a8_dir: Path, scratch: Path) -> None:
    """requant accepts the W8A8 checkpoint, and an unconstrained conversion from the bf16
    source reproduces it byte for byte."""
    from requant.checkpoint import open_checkpoint
    from requant.convert import convert
    from requant.errors import CheckpointError

    try:
        open_checkpoint(w8a8_dir)
        convert(w8a8_dir, scratch, "unconstrained", source=bf16_dir)
    except CheckpointError as exc:
        raise PackageError(f"self-check: {exc}") from None
    if tree_bytes(scratch) != tree_bytes(w8a8_dir):
        raise PackageError(
            f"self-check: requant convert --source {bf16_dir} --arm unconstrained does not reproduce {w8a8_dir}"
        )


def listing(dirs: dict[str, Path]) -> dict[str, dict]:
    """{"default/config.json": {"bytes", "sha256"}, ...}"""
    return {
        f"{name}/{rel}": {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        for name, d in dirs.items()
        for rel, data in tree_bytes(d).items()
    }


def package(train_out: Path, out_dir: Path, force: bool = False) -> dict:
    """Build, check and move both checkpoints into out_dir; returns the file list (bytes,
    sha256) and the total."""
    tok = TOKENIZER_DIR / "tokenizer.json"
    if sha256_file(tok) != TOKENIZER_SHA256:
        raise PackageError(f"{tok}: sha256 is not the pinned {TOKENIZER_SHA256}")
    p, tensors = read_trained(Path(train_out))
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    finals = {n: out_dir / n for n in NAMES}
    for n, f in finals.items():
        if (f.exists() or f.is_symlink()) and not force:
            raise PackageError(f"{f}: already exists; pass --force to replace it")
    tmp = Path(tempfile.mkdtemp(dir=out_dir, prefix=".package-tmp-"))
    moved_aside: dict[str, Path] = {}
    placed: list[str] = []
    try:
        built = {n: tmp / n for n in NAMES}
        for d in built.values():
            d.mkdir()
        build(p, tensors, built["default-bf16"], built["default"])
        self_check(built["default-bf16"], built["default"], tmp / "check")
        files = listing(built)
        total = sum(f["bytes"] for f in files.values())
        if total > MAX_BYTES:
            raise PackageError(f"{out_dir}: the two checkpoints take {total:,} bytes, over the {MAX_BYTES:,} limit")
        for n in NAMES:
            os.chmod(built[n], 0o755)
            for f in built[n].iterdir():
                os.chmod(f, 0o644)
        for n, f in finals.items():
            if f.exists() or f.is_symlink():
                aside = out_dir / f".{n}.package-old-{uuid.uuid4().hex[:12]}"
                os.rename(f, aside)
                moved_aside[n] = aside
            os.rename(built[n], f)
            placed.append(n)
    except BaseException:
        for n in placed:  # put back what was there before
            shutil.rmtree(finals[n], ignore_errors=True)
        for n, aside in moved_aside.items():
            if not finals[n].exists():
                os.rename(aside, finals[n])
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for aside in moved_aside.values():
        shutil.rmtree(aside, ignore_errors=True)
    shutil.rmtree(tmp, ignore_errors=True)
    return {"files": files, "total_bytes": total, "limit_bytes": MAX_BYTES, "parameters": arch.parameter_count(p)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("train_out", type=Path, help="train_default.py's --out directory")
    ap.add_argument(
        "--out-dir", type=Path, default=DEFAULT_OUT_DIR, help="where default/ and default-bf16/ go (requant/data)"
    )
    ap.add_argument("--force", action="store_true", help="replace existing default/ and default-bf16/")
    ap.add_argument("--json", action="store_true", help="print the result as JSON instead of a table")
    a = ap.parse_args(argv)
    try:
        res = package(a.train_out, a.out_dir, a.force)
    except PackageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if a.json:
        print(json.dumps(res, indent=2, sort_keys=True))
        return 0
    rows = [[name, f"{f['bytes']:,}", f["sha256"][:16]] for name, f in res["files"].items()]
    total = [
        f"**total** ({res['parameters']:,} parameters)",
        f"**{res['total_bytes']:,}**",
        f"limit {res['limit_bytes']:,}",
    ]
    print("\n".join(table([f"file in {a.out_dir}", "bytes", "sha256"], [*rows, total], align="lr")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
