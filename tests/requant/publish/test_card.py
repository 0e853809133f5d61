"""`requant card`: the model card's front matter round-trips through huggingface_hub, every
report is quoted or named as not measured, and the license travels.

Independent references: huggingface_hub.ModelCard / ModelCardData (the Hub library's own
parser) for the front matter, the metadata written literally here, the numbers of the
hand-written eval/determinism reports (tests/requant/publish/conftest.py) and of the real
audit, eval and determinism JSON read back with json and formatted here, and manifest
digests by hand (tests/digests.py, hashlib)."""

from __future__ import annotations

import hashlib
import json
import re
import shutil

from huggingface_hub import ModelCard, ModelCardData
from typer.testing import CliRunner

from requant.cli import app
from requant.evidence import manifest as mf
from tests.digests import manifest_digest_by_hand

from .conftest import determinism_report, eval_report, write

runner = CliRunner()
APACHE = "                                 Apache License\n                           Version 2.0, January 2004\n"


def _card(ckpt, *args):
    res = runner.invoke(app, ["card", str(ckpt), *args])
    return res, (ckpt / "README.md").read_text() if (ckpt / "README.md").exists() else None


def test_card_with_every_report_round_trips(pow2_copy):
    ck = pow2_copy
    digest = mf.identity(ck)["manifest_digest"]
    write(ck / "requant-eval.json", eval_report(digest))
    write(ck / "requant-determinism.json", determinism_report(digest))
    (ck / "README.md").write_text("---\nlicense: apache-2.0\nbase_model: Qwen/Qwen3-0.6B\n---\n# the source's card\n")
    res, text = _card(ck, "--repo-id", "someone/tiny-pow2")
    assert res.exit_code == 0, res.output
    expected = {
        "base_model": "Qwen/Qwen3-0.6B",
        "base_model_relation": "quantized",
        "license": "apache-2.0",
        "library_name": "transformers",
        "pipeline_tag": "text-generation",
        # no deterministic: the fixture's audit is by the reference emulations (test_card_trust.py)
        "tags": ["int8", "w8a8", "compressed-tensors", "requant", "power-of-two-scales"],
    }
    data = ModelCard.load(ck / "README.md").data.to_dict()
    assert data == expected
    assert ModelCardData(**data).to_dict() == data
    front = text.split("---\n")[1].strip()
    assert front == ModelCardData(**data).to_yaml()
    # the audit, quoted from its JSON
    audit = json.loads((ck / "requant-audit.json").read_text())
    assert f"**{audit['per_layer_summary']['line']}**" in text and audit["scorecard"]["matrix_sha256"] in text
    assert "arm `nearest`" in text
    # the eval and determinism numbers, formatted
    assert "| **nearest** (this checkpoint) | 72.0100 | 2.2236 | 1.1529 | +0.125% | [+0.031%, +0.219%] |" in text
    assert "| native | 71.9200 | 2.2231 | 1.1526 | - | - |" in text
    assert "99.6% of the probe arm's damage" in text
    assert "**pow2: 8/8 identical; native: 5/8 identical**" in text and "| native | 5/8 | 3, 17, 40 |" in text
    assert "Not measured" not in text
    # the files and the manifest (written by convert), listed in the card with the conversion's statistics
    assert mf.verify(ck).ok and mf.verify(ck).digest == digest
    stats = json.loads((ck / "requant-convert.json").read_text())["totals"]
    assert f"| scales changed | {stats['scales_changed']:,} of {stats['channels']:,} |" in text
    assert (
        re.search(r"<!-- requant-card v1: manifest (sha256:[0-9a-f]{64}), repo someone/tiny-pow2\.", text).group(1)
        == digest
    )
    for line in (ck / "SHA256SUMS").read_text().splitlines():
        sha, rel = line.split("  ")
        assert f"| `{rel}` | {(ck / rel).stat().st_size:,} | `{sha}` |" in text
    assert "vllm serve someone/tiny-pow2" in text and "requant audit someone/tiny-pow2" in text
    # the same inputs render the same bytes, and nothing is left behind
    again, text2 = _card(ck, "--repo-id", "someone/tiny-pow2")
    assert again.exit_code == 0 and text2 == text
    assert not [p.name for p in ck.iterdir() if "requant-tmp" in p.name]


def test_missing_reports_are_named_not_measured(pow2_copy):
    ck = pow2_copy
    (ck / "requant-audit.json").unlink()
    # the embedded default's README (copied by convert) carries a license: without it, none is found
    (ck / "README.md").unlink()
    res, text = _card(ck)
    assert res.exit_code == 0, res.output
    for section in ("## Audit", "## Determinism", "## Perplexity"):
        body = text.split(section, 1)[1].split("\n## ", 1)[0]
        assert "**Not measured.**" in body, section
    data = ModelCard.load(ck / "README.md").data.to_dict()
    assert "deterministic" not in data["tags"] and "power-of-two-scales" in data["tags"]  # no audit, no claim
    assert data["license"] == "other" and data["license_name"] == "unknown"
    assert "base_model" not in data and "base_model_relation" not in data
    assert "no license found" in res.stderr


def test_license_file_travels(pow2_copy):
    ck = pow2_copy
    (ck / "LICENSE").write_text(APACHE + "\nTERMS AND CONDITIONS FOR USE ...\n")
    res, _ = _card(ck)  # LICENSE is not in SHA256SUMS: refused, naming it
    assert res.exit_code == 2 and "LICENSE not listed" in res.stderr
    mf.write(ck)  # what `requant manifest CKPT --write` does
    res, _ = _card(ck)
    assert res.exit_code == 0 and ModelCard.load(ck / "README.md").data.license == "apache-2.0"
    assert "no license found" not in res.stderr
    (ck / "LICENSE").write_text("The Qwen Research License\n...")
    (ck / "README.md").unlink()
    res, _ = _card(ck)
    assert res.exit_code == 2 and "LICENSE differs" in res.stderr and not (ck / "README.md").exists()
    (ck / "SHA256SUMS").unlink()  # no manifest: the card computes one and writes it
    res, _ = _card(ck)
    assert res.exit_code == 0 and mf.verify(ck).ok
    data = ModelCard.load(ck / "README.md").data.to_dict()
    assert (data["license"], data["license_name"], data["license_link"]) == ("other", "license-file", "LICENSE")


def test_base_model_from_the_provenance(pow2_copy):
    ck = pow2_copy
    cfg = json.loads((ck / "config.json").read_text())
    cfg["requant"]["source"] = {"id": "org/Qwen3-1.7B-W8A8", "revision": "0123456789abcdef0123456789abcdef01234567"}
    (ck / "config.json").write_text(json.dumps(cfg, indent=2))
    mf.write(ck)
    res, text = _card(ck)
    assert res.exit_code == 0, res.output
    data = ModelCard.load(ck / "README.md").data.to_dict()
    assert data["base_model"] == "org/Qwen3-1.7B-W8A8" and data["base_model_relation"] == "quantized"
    assert "at revision `0123456789abcdef0123456789abcdef01234567`" in text
    # config.json changed, so the audit beside it measured other bytes: set aside, said so
    assert "measured other bytes" in res.stderr and "## Audit" in text
    assert "**Not measured.**" in text.split("## Audit", 1)[1].split("\n## ", 1)[0]
    assert "deterministic" not in data["tags"]


def test_source_and_untied_reports(pow2_copy):
    """An eval of the source checkpoint (digest of SHA256SUMS.source) is quoted as such; a
    report with no digest is quoted and marked as not tied to these bytes."""
    ck = pow2_copy
    source_digest = mf.digest_of((ck / mf.SOURCE_MANIFEST).read_bytes())  # written by convert
    write(ck / "requant-eval.json", eval_report(source_digest))
    write(ck / "requant-determinism.json", determinism_report(None))
    res, text = _card(ck)
    assert res.exit_code == 0, res.output
    assert "Measured on the checkpoint this one was converted from" in text.split("## Perplexity", 1)[1]
    assert "not tied to these bytes" in text.split("## Determinism", 1)[1].split("\n## ", 1)[0]


def test_explicit_report_for_other_bytes_is_an_error(pow2_copy, tmp_path):
    ck = pow2_copy
    other = write(tmp_path / "eval.json", eval_report("sha256:" + "0" * 64))
    readme = (ck / "README.md").read_text()  # the source's README, copied by convert
    res, text = _card(ck, "--eval", str(other))
    assert res.exit_code == 2 and text == readme  # nothing written
    assert "eval.json" in res.stderr and "measured other bytes" in res.stderr and "Traceback" not in res.output
    assert len([ln for ln in res.stderr.splitlines() if ln.startswith("error:")]) == 1


def test_report_missing_a_key_is_an_error(pow2_copy):
    ck = pow2_copy
    rep = eval_report(None)
    del rep["arms"]["ceiling"]["bits_per_byte"]
    write(ck / "requant-eval.json", rep)
    readme = (ck / "README.md").read_text()
    res, text = _card(ck)
    assert res.exit_code == 2 and text == readme  # nothing written
    assert "requant-eval.json" in res.stderr and "'arms.ceiling.bits_per_byte'" in res.stderr


def _section(text: str, title: str) -> str:
    return text.split(title, 1)[1].split("\n## ", 1)[0]


def test_card_quotes_the_real_eval_and_determinism_reports(micro_reported, tmp_path):
    """Reports made by `requant eval` (of the source) and `requant determinism` (of these
    bytes) themselves (conftest.micro_reported): each is tied by its manifest digest and
    its numbers are quoted, with the version and commit that made them."""
    ck = tmp_path / "pow2"
    shutil.copytree(micro_reported, ck)
    ev = json.loads((ck / "requant-eval.json").read_text())
    det = json.loads((ck / "requant-determinism.json").read_text())
    # the hand-written fixtures use the real reports' keys
    assert set(eval_report("sha256:x")) <= set(ev) and set(determinism_report("sha256:x")) <= set(det)
    # eval measured the source (no SHA256SUMS there: computed), determinism these bytes (their SHA256SUMS)
    assert ev["manifest"] is None
    assert (
        ev["manifest_digest"]
        == manifest_digest_by_hand(micro_reported.parent / "micro")
        == "sha256:" + hashlib.sha256((ck / "SHA256SUMS.source").read_bytes()).hexdigest()
    )
    assert det["manifest"] == "SHA256SUMS"
    assert det["manifest_digest"] == "sha256:" + hashlib.sha256((ck / "SHA256SUMS").read_bytes()).hexdigest()
    res, text = _card(ck)
    assert res.exit_code == 0, res.output
    made_by = f"Made by requant {ev['tool_version']}" + (f" at `{ev['git_commit']}`" if ev["git_commit"] else "") + "."
    perp = _section(text, "## Perplexity")
    assert "Measured on the checkpoint this one was converted from" in perp and ev["manifest_digest"] in perp
    assert made_by in perp and f"{ev['documents']} documents" in perp
    assert list(ev["arms"]) == ["native", "nearest", "probe"]
    for name, a in ev["arms"].items():
        label = "**nearest** (this checkpoint)" if name == "nearest" else name
        delta = "-" if a.get("delta_pct") is None else f"{a['delta_pct']:+.3f}%"
        ci = "-" if a.get("ci90") is None else f"[{a['ci90'][0]:+.3f}%, {a['ci90'][1]:+.3f}%]"
        assert (
            f"| {label} | {a['word_perplexity']:.4f} | {a['byte_perplexity']:.4f} | {a['bits_per_byte']:.4f} | {delta} | {ci} |"
            in perp
        )
    assert f"{ev['decomposition']['probe_mismatch_share'] * 100:.1f}% of the probe arm's damage" in perp
    dsec = _section(text, "## Determinism")
    assert "Measured on these bytes" in dsec and det["manifest_digest"] in dsec and made_by in dsec
    line = "; ".join(
        f"{r}: {det['regimes'][r]['identical']}/{det['regimes'][r]['total']} identical" for r in ("pow2", "native")
    )
    assert f"**{line}**" in dsec and f"{det['new_tokens']} new tokens per prompt." in dsec
    assert "Not measured" not in perp + dsec
