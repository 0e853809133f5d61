"""The reports a card quotes, and how each is tied to the checkpoint's bytes.

Default locations (beside the checkpoint; none of them is covered by SHA256SUMS, since they
are written about those bytes):

    requant-audit.json         `requant audit CKPT --json CKPT/requant-audit.json`
    requant-eval.json          `requant eval CKPT --json CKPT/requant-eval.json`
    requant-determinism.json   `requant determinism CKPT --json CKPT/requant-determinism.json`
    requant-convert.json       written by `requant convert` into its output (the per-Linear statistics)

How a report is tied to bytes: docs/publishing.md#reports-carry-their-provenance.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from requant.io.inputs import load_json
from requant.publish import PublishError

DEFAULT_NAMES = {
    "audit": "requant-audit.json",
    "eval": "requant-eval.json",
    "determinism": "requant-determinism.json",
    "convert": "requant-convert.json",
}
# Kinds whose report may measure the source checkpoint instead of these bytes.
SOURCE_OK = {"eval", "determinism"}

_REQUIRED = {
    "audit": [
        "backends",
        "cells",
        "layers",
        "detection",
        "scorecard.false_positives",
        "scorecard.false_negatives",
        "scorecard.matrix_sha256",
        "scorecard.matrix_pinned",
        "per_layer_summary.line",
        "per_layer_summary.native.layers",
        "per_layer_summary.native.bitwise_equal",
        "per_layer_summary.pow2.layers",
        "per_layer_summary.pow2.bitwise_equal",
    ],
    "eval": ["arms"],
    "determinism": ["regimes"],
    "convert": [
        "arm",
        "totals.linears",
        "totals.channels",
        "totals.weights",
        "totals.scales_changed",
        "totals.exponent_shifts",
        "totals.weights_clipped",
        "totals.rel_weight_error",
    ],
}
_EVAL_ARM_KEYS = ("word_perplexity", "byte_perplexity", "bits_per_byte")
_DET_REGIME_KEYS = ("identical", "total")


@dataclass
class Report:
    kind: str
    path: Path
    data: dict
    tie: str  # this | source | untied | other
    explicit: bool


@dataclass
class Reports:
    found: dict[str, Report] = field(default_factory=dict)  # usable reports by kind
    missing: dict[str, str] = field(default_factory=dict)  # kind -> why it is not measured
    warnings: list[str] = field(default_factory=list)


def _get(data, dotted: str):
    cur = data
    for part in dotted.split("."):
        if not isinstance(cur, dict) or part not in cur:
            raise KeyError(dotted)
        cur = cur[part]
    return cur


def validate(kind: str, data, path: Path) -> None:
    """Raise PublishError naming the file and the first missing key."""
    if not isinstance(data, dict):
        raise PublishError(f"a {kind} report must be a JSON object", file=path)
    for key in _REQUIRED[kind]:
        try:
            _get(data, key)
        except KeyError:
            raise PublishError(f"not a requant {kind} report: missing key {key!r}", file=path) from None
    if kind == "eval":
        arms = data["arms"]
        if not isinstance(arms, dict) or not arms:
            raise PublishError("'arms' must be a non-empty object", file=path)
        for arm, row in arms.items():
            for key in _EVAL_ARM_KEYS:
                if not isinstance(row, dict) or key not in row:
                    raise PublishError(f"not a requant eval report: missing key 'arms.{arm}.{key}'", file=path)
            if arm != "native" and row.get("delta_pct") is not None:
                ci = row.get("ci90")
                if not (isinstance(ci, list) and len(ci) == 2):
                    raise PublishError(f"'arms.{arm}.ci90' must be [lo, hi] beside its delta_pct", file=path)
    if kind == "determinism":
        regimes = data["regimes"]
        if not isinstance(regimes, dict) or not regimes:
            raise PublishError("'regimes' must be a non-empty object", file=path)
        for regime, row in regimes.items():
            for key in _DET_REGIME_KEYS:
                if not isinstance(row, dict) or key not in row:
                    raise PublishError(
                        f"not a requant determinism report: missing key 'regimes.{regime}.{key}'", file=path
                    )


def tie_of(data: dict, this_digest: str, source_digest: str | None) -> str:
    d = data.get("manifest_digest")
    if d is None:
        return "untied"
    if d == this_digest:
        return "this"
    if source_digest is not None and d == source_digest:
        return "source"
    return "other"


def load_report(kind: str, path: Path, explicit: bool, this_digest: str, source_digest: str | None) -> Report:
    data = load_json(path, what=f"the {kind} report", error=PublishError)
    validate(kind, data, Path(path))
    return Report(kind, Path(path), data, tie_of(data, this_digest, source_digest), explicit)


def _acceptable(report: Report) -> bool:
    if report.tie in ("this", "untied"):
        return report.tie == "this" or report.kind != "audit"
    return report.tie == "source" and report.kind in SOURCE_OK


def collect(ckpt_dir: Path, explicit: dict[str, Path | None], this_digest: str, source_digest: str | None) -> Reports:
    """Every kind's report: the explicit path if given, else the default file beside the
    checkpoint if present. See the module doc for which are used."""
    out = Reports()
    for kind, name in DEFAULT_NAMES.items():
        given = explicit.get(kind)
        path = Path(given) if given is not None else Path(ckpt_dir) / name
        if given is None and not path.is_file():
            out.missing[kind] = f"no {name} beside the checkpoint"
            continue
        rep = load_report(kind, path, given is not None, this_digest, source_digest)
        if _acceptable(rep):
            out.found[kind] = rep
            continue
        got = rep.data.get("manifest_digest")
        why = (
            "carries no manifest digest, so it cannot be tied to these bytes"
            if got is None
            else f"measured other bytes (manifest digest {got}, this checkpoint's is {this_digest})"
        )
        if rep.explicit:
            raise PublishError(f"the {kind} report {why}", file=path)
        out.warnings.append(f"{path}: {why}; its section says not measured")
        out.missing[kind] = f"{name} beside the checkpoint {why}"
    return out
