"""Provenance of a converted checkpoint: what it was made from, and how.

One entry point, `record`, called by requant.convert once every shard is written and the
source's files are hashed. For a constrained arm it writes its provenance files into the output (which, and
what each proves: docs/checkpoints.md#output, docs/publishing.md#what-convert-writes).
"""

from __future__ import annotations

import json
from pathlib import Path

import requant
from requant.checkpoint import CONFIG, Checkpoint
from requant.errors import OutputError, os_reason
from requant.evidence import manifest as mf
from requant.io.output import write_bytes_atomic
from requant.scales import SERVABLE

PROVENANCE_KEY = "requant"
_HEX = frozenset("0123456789abcdef")


def provenance_for(arm: str, src_label: str, ckpt: Checkpoint, source_dir: str | None) -> dict:
    """config.json's "requant" key: short; the evidence lives in the manifests it names."""
    if ckpt.from_hub:  # a Hub id that snapshot_download resolved: the snapshot's folder is the commit
        commit = ckpt.path.name
        source = {"id": src_label, "revision": commit if len(commit) == 40 and set(commit) <= _HEX else None}
    else:
        source = {"path": src_label}
    prov = {
        "arm": arm,
        "servable": SERVABLE[arm],
        "version": requant.__version__,
        "source": source,
        "manifest": mf.MANIFEST,
        "source_manifest": mf.SOURCE_MANIFEST,
    }
    if source_dir is not None:
        prov["bf16_source"] = source_dir
    if arm == "probe":
        prov["warning"] = (
            "ABLATION ONLY, NOT SERVABLE: scales rewritten to the nearest power of two "
            "without requantizing the int8 weights (the flawed +157% perplexity construction)"
        )
    return prov


def _write_config(ckpt: Checkpoint, tmp: Path, provenance: dict) -> None:
    raw = (ckpt.path / CONFIG).read_bytes()
    cfg = json.loads(raw.decode("utf-8"))
    keys = list(cfg)
    was_sorted = keys == sorted(keys)
    cfg.pop(
        PROVENANCE_KEY, None
    )  # re-converting a converted checkpoint: the new one wins (the old is in SHA256SUMS.source)
    cfg[PROVENANCE_KEY] = provenance
    if was_sorted:
        cfg = dict(sorted(cfg.items()))
    (tmp / CONFIG).write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def record(
    ckpt: Checkpoint,
    tmp: Path,
    out: Path,
    *,
    arm: str,
    src_label: str,
    source_dir: str | None,
    source_entries: dict[str, mf.Entry],
) -> tuple[str, dict | None]:
    """(source digest, provenance dict or None) of one conversion of `ckpt` into the
    temporary output directory `tmp` (to become `out`). source_entries: the manifest
    entries of the source's files (requant.evidence.manifest.BackgroundHashes over ckpt.path).
    For a constrained arm, SHA256SUMS.source and config.json (with the provenance) are
    written into tmp; a plain unconstrained conversion has no provenance (with --source it
    is returned, for the report, but nothing is written)."""
    source_manifest = mf.render(source_entries)
    digest = mf.digest_of(source_manifest)
    if arm == "unconstrained" and source_dir is None:
        return digest, None
    prov = provenance_for(arm, src_label, ckpt, source_dir)
    if arm != "unconstrained":
        try:
            _write_config(ckpt, tmp, prov)
        except OSError as exc:
            raise OutputError(f"writing config.json failed: {os_reason(exc)}", file=out / CONFIG) from exc
        try:
            write_bytes_atomic(tmp / mf.SOURCE_MANIFEST, source_manifest)
        except OSError as exc:
            raise OutputError(
                f"writing {mf.SOURCE_MANIFEST} failed: {os_reason(exc)}", file=out / mf.SOURCE_MANIFEST
            ) from exc
    return digest, prov
