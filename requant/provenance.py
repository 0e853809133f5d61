"""Provenance of a converted checkpoint: what it was made from, and how.

One entry point, `record`, called by requant.convert once every shard is written: it
computes the source digest, builds the provenance dict, and (for a constrained arm) writes
config.json into the output with that dict under the "requant" key, leaving
quantization_config as it was, so compressed-tensors and vLLM load the result unchanged.
The unconstrained arm writes nothing here: its config.json is the input's, copied byte for
byte.

The source digest ("sha256:<hex>") covers every byte of the source checkpoint and costs no
extra pass over the shards: sha256 over `sha256sum`-style lines ("<hex>  <file>\\n", sorted
by file) for config.json and the index (their plain sha256) and every shard (its hash
tree, shard_digest: sha256 of the header's sha256 followed by the sha256 of each segment,
the units requant.streaming hashes while it converts them).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import requant
from requant.checkpoint import CONFIG, Checkpoint
from requant.errors import OutputError
from requant.requantizer import SERVABLE
from requant.safetensors_io import os_reason

PROVENANCE_KEY = "requant"


def shard_digest(prefix: bytes, segment_digests: list[bytes]) -> str:
    """sha256 over sha256(header bytes) followed by the sha256 of every segment, in order:
    a hash tree over every byte of the shard, computed while the segments are converted."""
    h = hashlib.sha256(hashlib.sha256(prefix).digest())
    for d in segment_digests:
        h.update(d)
    return h.hexdigest()


def source_digest(file_digests: dict[str, str]) -> str:
    """sha256 over `sha256sum`-style lines ("<hex>  <file>\\n", sorted by file): config.json
    and the index by their sha256, every shard by its hash tree (shard_digest). One number
    for the source checkpoint, covering every byte of it."""
    lines = "".join(f"{d}  {n}\n" for n, d in sorted(file_digests.items()))
    return "sha256:" + hashlib.sha256(lines.encode()).hexdigest()


def provenance_for(arm: str, src_label: str, digest: str, ckpt: Checkpoint, source_dir: str | None) -> dict:
    prov = {
        "arm": arm,
        "servable": SERVABLE[arm],
        "scales": "power of two" if arm != "unconstrained" else "unchanged",
        "weights": "requantized" if arm not in ("probe", "unconstrained") else "unchanged",
        "tool": "requant",
        "version": requant.__version__,
        "source": {"checkpoint": src_label, "digest": digest},
    }
    if ckpt.from_hub:  # a Hub id that snapshot_download resolved: record the snapshot
        prov["source"]["resolved"] = str(ckpt.path)
    prior = ckpt.config.get(PROVENANCE_KEY)
    if prior is not None:
        prov["source"]["requant"] = prior
    if source_dir is not None:
        prov["source"]["bf16_weights"] = source_dir
    if arm == "probe":
        prov["warning"] = ("ABLATION ONLY, NOT SERVABLE: scales rewritten to the nearest power of two "
                           "without requantizing the int8 weights (the flawed +157% perplexity construction)")
    return prov


def _write_config(ckpt: Checkpoint, tmp: Path, provenance: dict) -> None:
    raw = (ckpt.path / CONFIG).read_bytes()
    cfg = json.loads(raw.decode("utf-8"))
    keys = list(cfg)
    was_sorted = keys == sorted(keys)
    cfg.pop(PROVENANCE_KEY, None)  # re-converting a converted checkpoint: the new one wins
    cfg[PROVENANCE_KEY] = provenance
    if was_sorted:
        cfg = dict(sorted(cfg.items()))
    (tmp / CONFIG).write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def record(ckpt: Checkpoint, tmp: Path, out: Path, *, arm: str, src_label: str, source_dir: str | None,
           segment_digests: dict[str, list[bytes]]) -> tuple[str, dict | None]:
    """(source digest, provenance dict or None) of one conversion of `ckpt` into the
    temporary output directory `tmp` (to become `out`). segment_digests: per shard, the
    sha256 of each of its segments in order (requant.streaming). For a constrained arm the
    provenance is written into tmp/config.json; a plain unconstrained conversion has none
    (with --source it is returned, for the report, but config.json stays the input's)."""
    files = {CONFIG: _file_sha256(ckpt.path / CONFIG)}
    if ckpt.index_file is not None:
        files[ckpt.index_file.name] = _file_sha256(ckpt.index_file)
    for name, f in ckpt.shards.items():
        files[name] = shard_digest(f.prefix, segment_digests[name])
    digest = source_digest(files)
    if arm == "unconstrained" and source_dir is None:
        return digest, None
    prov = provenance_for(arm, src_label, digest, ckpt, source_dir)
    if arm != "unconstrained":
        try:
            _write_config(ckpt, tmp, prov)
        except OSError as exc:
            raise OutputError(f"writing config.json failed: {os_reason(exc)}", file=out / CONFIG) from exc
    return digest, prov
