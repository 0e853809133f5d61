"""`requant card CKPT`: the model card (CKPT/README.md) that carries the evidence for these bytes.

The card is rendered from model_cards/requant_w8a8.md.j2 (installed as requant.model_cards)
with Jinja2 (StrictUndefined: a context key the template needs and the code forgot is an
error, not an empty cell). Its YAML front matter is made by huggingface_hub.ModelCardData and
checked by parsing the rendered card back with huggingface_hub.ModelCard before anything is
written: the metadata must round-trip exactly.

Front matter, tags as claims, and the marker: docs/publishing.md#the-card.
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

import torch

from requant.checkpoint import open_checkpoint
from requant.evidence import manifest as mf
from requant.io.output import write_bytes_atomic
from requant.model_cards import template_path
from requant.publish import PublishError
from requant.publish.reports import Reports, collect
from requant.regime import REGIMES

LIBRARY_NAME = "transformers"
PIPELINE_TAG = "text-generation"
BASE_TAGS = ["int8", "w8a8", "compressed-tensors", "requant"]
MARKER = re.compile(r"<!-- requant-card v1: manifest (sha256:[0-9a-f]{64}), repo (\S+)\.")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


# -- the checkpoint ------------------------------------------------------------------------
@dataclass
class Facts:
    """What the card says about the checkpoint itself (no report needed)."""

    path: Path
    config: dict
    provenance: dict | None
    entries: dict[str, mf.Entry]
    manifest_digest: str
    manifest_stored: bool
    source_digest: str | None
    linears: int
    channels: int
    pow2_channels: int
    front_matter: dict = field(default_factory=dict)  # of the README.md beside it (source's or an earlier card)

    @property
    def all_pow2(self) -> bool:
        return self.channels > 0 and self.pow2_channels == self.channels

    @property
    def arm(self) -> str | None:
        return (self.provenance or {}).get("arm")

    @property
    def servable(self) -> bool:
        return (self.provenance or {}).get("servable", True) is not False


def _front_matter(readme: Path) -> dict:
    if not readme.is_file():
        return {}
    import yaml
    from huggingface_hub import ModelCard

    try:
        return ModelCard.load(readme).data.to_dict()
    except (yaml.YAMLError, ValueError, TypeError, UnicodeDecodeError, OSError) as exc:  # YAML the hub library rejects
        print(
            f"warning: {readme}: front matter unreadable ({type(exc).__name__}); license and base model not taken from it",
            file=sys.stderr,
        )
        return {}


def _moe_rows(config: dict) -> list[list[str]]:
    """The experts row of a Qwen3-MoE checkpoint's card (none for a dense one)."""
    from requant.models.qwen3_moe import Qwen3MoeArch, is_moe_config

    if not is_moe_config(config):
        return []
    a = Qwen3MoeArch.from_config(config)
    return [
        [
            "architecture",
            f"Qwen3-MoE (`Qwen3MoeForCausalLM`): {a.experts} experts in each of {len(a.moe_layers())} sparse layers, "
            f"top {a.top_k}; the routers (`mlp.gate`) unquantized, copied byte for byte",
        ]
    ]


def checkpoint_facts(ckpt_dir: str | Path, progress=None) -> Facts:
    """Open and validate a local checkpoint, check its SHA256SUMS (if any) and count its
    power-of-two scales."""

    path = Path(ckpt_dir)
    if not path.is_dir():
        raise PublishError("not a checkpoint directory (card and push take a local directory)", file=path)
    ckpt = open_checkpoint(path)
    if (path / mf.MANIFEST).exists():
        check = mf.verify(path, progress=progress)
        if not check.ok:
            raise PublishError(
                check.describe() + "; restore the files or re-record with `requant manifest DIR --write`", file=path
            )
        entries, digest, stored = check.entries, check.digest, True
    else:
        entries = mf.compute(path, progress=progress)
        digest, stored = mf.digest_of(mf.render(entries)), False
    src = mf.read(path, mf.SOURCE_MANIFEST)
    source_digest = mf.digest_of(src[1]) if src is not None else None
    channels = pow2 = 0
    for lin in ckpt.quantized_linears:
        s = ckpt.tensor(lin + ".weight_scale").to(torch.float64).reshape(-1)
        mantissa, _ = torch.frexp(s)
        channels += s.numel()
        pow2 += int((mantissa == 0.5).sum())
    prov = ckpt.config.get("requant")
    return Facts(
        path,
        ckpt.config,
        prov if isinstance(prov, dict) else None,
        entries,
        digest,
        stored,
        source_digest,
        len(ckpt.quantized_linears),
        channels,
        pow2,
        _front_matter(path / mf.CARD),
    )


# -- license and base model ----------------------------------------------------------------
@dataclass
class License:
    license: str
    name: str | None
    link: str | None
    origin: str
    warning: str | None = None


def _identify(text: str) -> str | None:
    t = " ".join(text.split())
    if "Apache License" in t and "Version 2.0" in t:
        return "apache-2.0"
    if "MIT License" in t or "Permission is hereby granted, free of charge" in t:
        return "mit"
    return None


def find_license(facts: Facts) -> License:
    fm = facts.front_matter
    lic = fm.get("license")
    if isinstance(lic, str) and lic:
        return License(
            lic, fm.get("license_name"), fm.get("license_link"), "the README.md front matter beside the checkpoint"
        )
    files = sorted(p for p in facts.path.iterdir() if p.is_file() and re.match(r"^LICEN[CS]E", p.name, re.I))
    if files:
        f = files[0]
        known = _identify(f.read_text(encoding="utf-8", errors="replace"))
        if known:
            return License(known, None, None, f"{f.name} (recognised by its text)")
        return License("other", "license-file", f.name, f"{f.name} (not recognised: linked as is)")
    return License(
        "other",
        "unknown",
        None,
        "nowhere",
        warning="no license found (no license in README.md front matter, no LICENSE file): the card says "
        "'license: other' (unknown); check the source's terms before publishing",
    )


def base_model(facts: Facts) -> str | None:
    src = (facts.provenance or {}).get("source") or {}
    if isinstance(src, dict):
        hub = src.get("id")
        if hub is None and src.get("resolved") and isinstance(src.get("checkpoint"), str):
            hub = src["checkpoint"]  # the provenance format before SHA256SUMS
        if isinstance(hub, str) and _HUB_ID.match(hub):
            return hub
    bm = facts.front_matter.get("base_model")
    if isinstance(bm, str) and _HUB_ID.match(bm):
        return bm
    return None


# -- sections ------------------------------------------------------------------------------
def _n(x) -> str:
    return f"{x:,}" if isinstance(x, int) else str(x)


def _made_by(d: dict) -> str:
    """' Made by requant V at `commit`.' from a report's build keys (requant.evidence.identity), or ''."""
    if not d.get("tool_version"):
        return ""
    return f" Made by requant {d['tool_version']}" + (f" at `{d['git_commit']}`" if d.get("git_commit") else "") + "."


def _tie_note(rep, what: str) -> str:
    if rep.tie == "this":
        return f"Measured on these bytes ({what} `{rep.path.name}`, manifest digest `{rep.data['manifest_digest']}`)."
    if rep.tie == "source":
        return (
            f"Measured on the checkpoint this one was converted from ({what} `{rep.path.name}`, manifest digest "
            f"`{rep.data['manifest_digest']}` = the digest of SHA256SUMS.source), every arm made from it by the converter."
        )
    return (
        f"**From `{rep.path.name}`, which records no manifest digest: not tied to these bytes by the report itself.**"
    )


def _conversion(facts: Facts, reports: Reports) -> tuple[dict | None, str | None]:
    if facts.provenance is None:
        return None, (
            "This checkpoint was not converted by requant (config.json has no `requant` key): its scales are "
            f"as its maker wrote them ({_n(facts.pow2_channels)} of {_n(facts.channels)} weight scales are powers of two)."
        )
    arm = facts.arm
    rep = reports.found.get("convert")
    servable = (
        "" if facts.servable else " **NOT servable: an ablation (scales rewritten without requantizing the weights).**"
    )
    text = (
        f"`requant convert --arm {arm}` rewrote every weight scale s of the {_n(facts.linears)} quantized Linears to a "
        f"power of two s' and requantized the int8 weights under it, q' = clamp(round_half_even(q·s/s'), -128, 127) "
        f"(exact).{servable} {_n(facts.pow2_channels)} of {_n(facts.channels)} weight scales are now powers of two."
    )
    if arm == "probe":
        text = (
            f"`requant convert --arm probe` rewrote every weight scale to the nearest power of two **without** "
            f"requantizing the int8 weights.{servable}"
        )
    if rep is None:
        return {
            "text": text,
            "rows": [["statistics", "not recorded: " + reports.missing.get("convert", "no report")]],
            "source_note": "",
        }, None
    t = rep.data["totals"]
    shifts = (
        ", ".join(f"{int(k):+d}: {_n(v)}" for k, v in sorted(t["exponent_shifts"].items(), key=lambda kv: int(kv[0])))
        or "-"
    )
    rows = [
        ["quantized Linears", _n(t["linears"])],
        ["scales changed", f"{_n(t['scales_changed'])} of {_n(t['channels'])}"],
        ["exponent shifts e' - ceil(log2 s) (channels)", shifts],
        ["weights clipped", f"{_n(t['weights_clipped'])} of {_n(t['weights'])}"],
        ["relative weight error ‖W' - W‖/‖W‖", f"{t['rel_weight_error']:.3e}"],
    ]
    return {"text": text, "rows": rows, "source_note": _tie_note(rep, "conversion report")}, None


def _audit(reports: Reports, fault_titles: Mapping[str, str]) -> tuple[dict | None, str | None]:
    rep = reports.found.get("audit")
    if rep is None:
        return None, (
            f"**Not measured.** No audit of these bytes ({reports.missing.get('audit')}). "
            "Run `requant audit CKPT --json CKPT/requant-audit.json`, then render the card again."
        )
    d = rep.data
    s, card = d["per_layer_summary"], d["scorecard"]
    per_layer = [
        [r, f"{s[r]['bitwise_equal']}/{s[r]['layers']}", _n(s[r].get("mismatches", "-")), _n(s[r].get("max_ulp", "-"))]
        for r in ("pow2", "native")
        if r in s
    ]
    dec = d.get("decode")
    if dec:  # decode beside prefill: one row per regime and decode batch size
        per_layer = [[f"{r[0]}, prefill", *r[1:]] for r in per_layer]
        for b, sb in dec["per_layer_summary"]["by_batch"].items():
            per_layer += [
                [
                    f"{r}, decode M={b}",
                    f"{sb[r]['bitwise_equal']}/{sb[r]['layers']}",
                    _n(sb[r]["mismatches"]),
                    _n(sb[r]["max_ulp"]),
                ]
                for r in ("pow2", "native")
            ]
    fams: dict[str, dict[str, list[int]]] = {}
    for row in d["detection"]:
        cell = fams.setdefault(row["fault"], {}).setdefault(row["regime"], [0, 0])
        cell[0] += row["detected"]
        cell[1] += row["observable"]
    detection = [
        [f, fault_titles.get(f, ""), *(f"{v[r][0]}/{v[r][1]}" if r in v else "-" for r in REGIMES)]
        for f, v in sorted(fams.items())
    ]
    pinned = card["matrix_pinned"]
    conv = d.get("converted")
    emulated = emulated_backends(d)
    kinds = (
        "PyTorch emulations of the CUTLASS and Triton epilogue orders, not the kernels themselves"
        if emulated
        else "the two epilogue orders of CUTLASS and Triton"
    )
    intro = (
        f"`requant audit` ran every quantized Linear on real activations with `{d['backends'][0]}` and "
        f"`{d['backends'][1]}` ({kinds}), under the stored scales (native) "
        f"and under power-of-two scales (pow2). {_tie_note(rep, 'audit report')}"
    )
    if emulated:
        intro += (
            " An audit by emulations proves the arithmetic, not the kernels that serve the model, so this card "
            "does not carry the `deterministic` tag: run `requant audit CKPT --backends cutlass,triton` on a GPU "
            "for that."
        )
    if conv:
        intro += (
            f" This is a converted checkpoint (arm `{conv.get('arm')}`): native = pow2 = the stored scales, so the "
            "bitwise check C5 applies under native too, where the matrix expects it not to (counted as applicability "
            "mismatches, which are neither false positives nor false negatives)."
        )
    reading = (
        "Under real-valued scales a one-spacing kernel fault hides inside the legal CUTLASS/Triton difference; "
        "under power-of-two scales the two orders must agree bit for bit, so the check C5 (bitwise equality) "
        "catches even the output-truncation fault F4."
    )
    env = d.get("environment") or {}
    where = env.get("gpu") or env.get("cpu") or d.get("device", "")
    environment = (
        f" on {where} (torch {env.get('torch', '?')}), requant {d.get('tool_version', '?')}"
        + (f" at `{d['git_commit']}`" if d.get("git_commit") else "")
        + "."
    )
    return {
        "intro": intro,
        "line": s["line"]
        + "".join(
            f"; decode M={b}: {sb['line']}" for b, sb in (dec["per_layer_summary"]["by_batch"].items() if dec else ())
        ),
        "per_layer": per_layer,
        "scorecard": [
            ["false positives", card["false_positives"]],
            ["false negatives", card["false_negatives"]],
            ["applicability mismatches", card.get("applicability_mismatches", "-")],
            ["fault cells", _n(d["cells"])],
            *(
                [
                    [
                        f"decode fault cells (M = {', '.join(map(str, dec['batches']))}, {dec['steps']} steps)",
                        _n(dec["cells"]),
                    ],
                    [
                        "decode false positives / negatives",
                        f"{dec['scorecard']['false_positives']} / {dec['scorecard']['false_negatives']}",
                    ],
                ]
                if dec
                else []
            ),
            ["prediction matrix", "pinned" if pinned else "**NOT the pinned matrix**"],
        ],
        "matrix": card["matrix_sha256"],
        "matrix_state": "the pinned one" if pinned else "**not the pinned one**",
        "detection": detection,
        "reading": reading,
        "command": d.get("command", "requant audit"),
        "environment": environment,
    }, None


def _determinism(reports: Reports) -> tuple[dict | None, str | None]:
    rep = reports.found.get("determinism")
    if rep is None:
        return None, (
            f"**Not measured.** No determinism report ({reports.missing.get('determinism')}). "
            "Run `requant determinism CKPT --json CKPT/requant-determinism.json`."
        )
    d = rep.data
    backends = d.get("backends")
    pair = " and ".join(f"`{b}`" for b in backends) if isinstance(backends, list) and backends else "the two kernels"
    intro = (
        f"Greedy decoding of the same prompts with {pair}, token ids compared. {_tie_note(rep, 'determinism report')}"
        + _made_by(d)
    )
    rows, parts = [], []
    for regime in sorted(d["regimes"], key=lambda r: (r != "pow2", r)):
        r = d["regimes"][regime]
        firsts = sorted(
            p["first_divergence"]
            for p in r.get("prompts", [])
            if isinstance(p, dict) and p.get("first_divergence") is not None
        )
        rows.append([regime, f"{r['identical']}/{r['total']}", ", ".join(map(str, firsts)) if firsts else "-"])
        parts.append(f"{regime}: {r['identical']}/{r['total']} identical")
    note = None
    if "new_tokens" in d:
        note = f"{d['new_tokens']} new tokens per prompt."
    return {"intro": intro, "line": "; ".join(parts), "rows": rows, "note": note}, None


def _fmt(x, spec: str) -> str:
    return format(x, spec) if isinstance(x, (int, float)) and not (isinstance(x, float) and math.isnan(x)) else "-"


def _eval(reports: Reports, arm: str | None) -> tuple[dict | None, str | None]:
    rep = reports.found.get("eval")
    if rep is None:
        return None, (
            f"**Not measured.** No perplexity report ({reports.missing.get('eval')}). "
            "Run `requant eval CKPT --json CKPT/requant-eval.json`."
        )
    d = rep.data
    rows = []
    for name, r in d["arms"].items():
        ci = r.get("ci90")
        label = f"**{name}** (this checkpoint)" if name == arm else name
        rows.append(
            [
                label,
                _fmt(r["word_perplexity"], ".4f"),
                _fmt(r["byte_perplexity"], ".4f"),
                _fmt(r["bits_per_byte"], ".4f"),
                "-" if r.get("delta_pct") is None else f"{r['delta_pct']:+.3f}%",
                f"[{ci[0]:+.3f}%, {ci[1]:+.3f}%]" if isinstance(ci, list) and len(ci) == 2 else "-",
            ]
        )
    boot = d.get("bootstrap") or {}
    tasks = d.get("tasks")
    intro = (
        f"Perplexity through lm-eval {d.get('lm_eval_version', '?')}"
        + (f" on {', '.join(tasks) if isinstance(tasks, list) else tasks}" if tasks else "")
        + (f", {d['documents']} documents" if "documents" in d else "")
        + (f", backend `{d['backend']}`" if "backend" in d else "")
        + ". Changes are against native, with a 90% interval from a paired bootstrap over documents"
        + (f" ({boot.get('replicates')} replicates, seed {boot.get('seed')})" if boot else "")
        + f". {_tie_note(rep, 'eval report')}"
        + _made_by(d)
    )
    share = (d.get("decomposition") or {}).get("probe_mismatch_share")
    decomposition = (
        "Decomposition: the weight/scale mismatch explains "
        f"{share * 100:.1f}% of the probe arm's damage ((ppl_probe - ppl_nearest) / (ppl_probe - ppl_native))."
        if isinstance(share, (int, float))
        else "Decomposition: not in the report."
    )
    return {"intro": intro, "rows": rows, "decomposition": decomposition, "note": None}, None


# -- assembly ------------------------------------------------------------------------------
def card_data(facts: Facts, lic: License, reports: Reports):
    """The front matter (huggingface_hub.ModelCardData)."""
    from huggingface_hub import ModelCardData

    tags = list(BASE_TAGS)
    if facts.all_pow2:
        tags.append("power-of-two-scales")
        audit = reports.found.get("audit")
        if audit is not None and audit_ok(audit.data) is None and not emulated_backends(audit.data):
            tags.append("deterministic")
    bm = base_model(facts)
    extra = {"base_model_relation": "quantized"} if bm else {}
    return ModelCardData(
        base_model=bm,
        license=lic.license,
        license_name=lic.name,
        license_link=lic.link,
        library_name=LIBRARY_NAME,
        pipeline_tag=PIPELINE_TAG,
        tags=tags,
        **extra,
    )


def emulated_backends(data: dict) -> list[str]:
    """The backends of an audit report that are not real kernels (the reference-* emulations;
    a report naming no pair counts as emulated: no claim without its evidence)."""
    backends = data.get("backends")
    if not (isinstance(backends, list) and len(backends) == 2 and all(isinstance(b, str) for b in backends)):
        return ["(no backends recorded)"]
    return [b for b in backends if b.startswith("reference")]


def audit_ok(data: dict) -> str | None:
    """None when an audit report is clean (pinned matrix, no false positive or negative, every
    pow2 layer bitwise equal); else the reasons, in words."""
    card, pow2 = data["scorecard"], data["per_layer_summary"]["pow2"]
    bad = []
    if not card["matrix_pinned"]:
        bad.append(f"it was scored against an unpinned prediction matrix ({card['matrix_sha256']})")
    if card["false_positives"] or card["false_negatives"]:
        bad.append(f"{card['false_positives']} false positives and {card['false_negatives']} false negatives")
    if pow2["bitwise_equal"] != pow2["layers"]:
        bad.append(f"only {pow2['bitwise_equal']}/{pow2['layers']} pow2 layers are bitwise equal")
    dec = data.get("decode")
    if dec:
        dc, dp = dec["scorecard"], dec["per_layer_summary"]["pow2"]
        if not dc["matrix_pinned"] or dc["false_positives"] or dc["false_negatives"]:
            bad.append(f"decode: {dc['false_positives']} false positives and {dc['false_negatives']} false negatives")
        if dp["bitwise_equal"] != dp["layers"]:
            bad.append(f"decode: only {dp['bitwise_equal']}/{dp['layers']} pow2 layer-steps are bitwise equal")
    # a kernel that breaks its declared order is not scored as false positives (docs/audit.md, "The verdict")
    faults = (card.get("kernel_faults") or 0) + ((dec or {}).get("scorecard", {}).get("kernel_faults") or 0)
    if faults:
        bad.append(f"a kernel breaks its declared order in {faults} layers ({data.get('verdict')})")
    return "; ".join(bad) or None


@dataclass
class RenderedCard:
    text: str
    metadata: dict
    warnings: list[str]
    reports: Reports


def render(
    ckpt_dir: str | Path,
    *,
    audit: Path | None = None,
    eval: Path | None = None,
    determinism: Path | None = None,
    convert: Path | None = None,
    repo_id: str | None = None,
    facts: Facts | None = None,
    fault_titles: Mapping[str, str] = MappingProxyType({}),
) -> RenderedCard:
    """Render the card of a checkpoint (nothing written). fault_titles: the audit's fault family
    titles (requant.audit.catalogue.faults.FAMILY_TITLES, given by the command: the core imports no audit)."""
    import jinja2
    from huggingface_hub import ModelCard

    facts = facts if facts is not None else checkpoint_facts(ckpt_dir)
    reports = collect(
        facts.path,
        {"audit": audit, "eval": eval, "determinism": determinism, "convert": convert},
        facts.manifest_digest,
        facts.source_digest,
    )
    lic = find_license(facts)
    warnings = list(reports.warnings) + ([lic.warning] if lic.warning else [])
    data = card_data(facts, lic, reports)
    conversion, conversion_missing = _conversion(facts, reports)
    audit_ctx, audit_missing = _audit(reports, fault_titles)
    det_ctx, det_missing = _determinism(reports)
    eval_ctx, eval_missing = _eval(reports, facts.arm)
    target = repo_id or "path/to/this/checkpoint"
    title = repo_id.split("/")[-1] if repo_id else facts.path.resolve().name
    arm_txt = f"requant arm `{facts.arm}`" if facts.arm else "not converted by requant"
    intro = (
        "An INT8 W8A8 checkpoint (compressed-tensors, as llm-compressor writes it and vLLM serves it)"
        + (
            f", converted from [{base_model(facts)}](https://huggingface.co/{base_model(facts)})"
            if base_model(facts)
            else ""
        )
        + (
            ", whose every weight scale is a power of two, so that the CUTLASS and Triton W8A8 GEMMs, which apply the "
            "activation and weight scales in different orders, give the same bits."
            if facts.all_pow2
            else f". {_n(facts.pow2_channels)} of {_n(facts.channels)} weight scales are powers of two: kernels that apply "
            "the scales in different orders may differ by one bf16 spacing."
        )
    )
    audit_rep = reports.found.get("audit")
    facts_rows = [
        ["base model", f"`{base_model(facts)}`" if base_model(facts) else "unknown"],
        *_moe_rows(facts.config),
        ["conversion", arm_txt + ("" if facts.servable else " (**NOT servable**)")],
        ["power-of-two weight scales", f"{_n(facts.pow2_channels)} of {_n(facts.channels)}"],
        [
            "audit",
            (
                audit_rep.data["per_layer_summary"]["line"]
                + (
                    " (emulated kernels: " + ", ".join(f"`{b}`" for b in audit_rep.data.get("backends") or []) + ")"
                    if emulated_backends(audit_rep.data)
                    else ""
                )
            )
            if audit_rep
            else "not measured",
        ],
        ["manifest digest", f"`{facts.manifest_digest}` (`{mf.MANIFEST}`)"],
    ]
    prov = facts.provenance or {}
    src = prov.get("source") if isinstance(prov.get("source"), dict) else {}
    provenance = [
        f"requant {prov.get('version', '?')} made this checkpoint" if prov else "Not made by requant convert."
    ]
    if src.get("id"):
        provenance.append(
            f"source: `{src['id']}`" + (f" at revision `{src['revision']}`" if src.get("revision") else "")
        )
    elif src.get("path") or src.get("checkpoint"):
        provenance.append(f"source: a local checkpoint (`{Path(str(src.get('path') or src.get('checkpoint'))).name}`)")
    if facts.source_digest:
        provenance.append(f"the source's files are listed in `{mf.SOURCE_MANIFEST}` (digest `{facts.source_digest}`)")
    files = [[f"`{e.path}`", _n(e.size), f"`{e.sha256}`"] for e in facts.entries.values()]
    where = "DIR" if repo_id else "path/to/this/checkpoint"
    check = "\n".join(
        ([f"hf download {repo_id} --local-dir DIR"] if repo_id else [])
        + [
            f"cd {where} && sha256sum -c {mf.MANIFEST}   # every file against its line",
            f"sha256sum {mf.MANIFEST}                    # the manifest digest quoted in this card",
            "requant manifest .                       # the same check with requant",
            f"requant audit {target if repo_id else '.'}"
            + ("   # re-run the audit on the bytes you download" if repo_id else "   # re-run the audit"),
        ]
    )
    if lic.warning:
        license_text = (
            "License: `other` (unknown). The source carried none (no license in a README.md front matter, no "
            "LICENSE file): check the source's terms before using or redistributing this checkpoint."
        )
    else:
        license_text = (
            f"License: `{lic.license}`"
            + (f" ({lic.name}" + (f", [{lic.link}]({lic.link})" if lic.link else "") + ")" if lic.name else "")
            + f", carried from {lic.origin}."
        )
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(template_path().parent)),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )
    text = env.get_template(template_path().name).render(
        front_matter=data.to_yaml(),
        manifest_digest=facts.manifest_digest,
        card_repo=repo_id or "-",
        manifest_name=mf.MANIFEST,
        title=title,
        intro=intro,
        facts=facts_rows,
        conversion=conversion,
        conversion_missing=conversion_missing,
        audit=audit_ctx,
        audit_missing=audit_missing,
        determinism=det_ctx,
        determinism_missing=det_missing,
        eval=eval_ctx,
        eval_missing=eval_missing,
        target=target,
        check_commands=check,
        files=files,
        license_text=license_text,
        provenance=provenance,
    )
    text = re.sub(r"\n{3,}", "\n\n", text)
    metadata = data.to_dict()
    parsed = ModelCard(text).data.to_dict()
    if parsed != metadata:  # the template broke the front matter: never write such a card
        raise PublishError(f"internal: the rendered card's metadata does not round-trip ({parsed} != {metadata})")
    return RenderedCard(text, metadata, warnings, reports)


def card_marker(text: str) -> tuple[str, str | None] | None:
    """(manifest digest, repo id or None) a requant card was rendered for; None: not a requant card."""
    m = MARKER.search(text)
    return (m.group(1), None if m.group(2) == "-" else m.group(2)) if m else None


def write_card(ckpt_dir: str | Path, card: RenderedCard) -> Path:
    """Write CKPT/README.md atomically."""
    try:
        return write_bytes_atomic(Path(ckpt_dir) / mf.CARD, card.text.encode("utf-8"))
    except OSError as exc:
        raise PublishError(f"writing the card failed: {exc.strerror or exc}", file=Path(ckpt_dir) / mf.CARD) from None


__all__ = ["render", "write_card", "checkpoint_facts", "card_marker", "audit_ok"]
