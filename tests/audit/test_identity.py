"""The audit ties its report to the bytes it read and the code that ran, audits a converted
checkpoint as stored, and exits non-zero on an unpinned matrix.

Independent references: a manifest digest computed by hand (tests/digests.py: hashlib over
the files and the sha256sum line format); for "no second requantization", the stored scales
checked as powers of two with torch.frexp and requant.scales.arms.requantize(nearest) returning the
stored int8 weights and scales bit for bit."""

from __future__ import annotations

import copy
import json

import torch
import typer
from typer.testing import CliRunner

from requant import DEFAULT_CHECKPOINT
from requant.audit.report import markdown
from requant.checkpoint import open_checkpoint
from requant.commands.audit import audit
from requant.scales.arms import requantize
from tests.digests import manifest_digest_by_hand

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
app.command("audit")(audit)
app.command("noop")(lambda: None)
runner = CliRunner()


def test_report_carries_digest_version_commit(default_audit):
    from requant.evidence.buildinfo import build_info

    assert default_audit["manifest_digest"] == manifest_digest_by_hand(DEFAULT_CHECKPOINT)
    assert default_audit["manifest"] is None  # the embedded default has no SHA256SUMS: computed
    assert {k: default_audit[k] for k in ("tool_version", "git_commit")} == build_info()
    assert default_audit["converted"] is None
    assert default_audit["scorecard"]["matrix_sha256"]


def test_converted_checkpoint_is_audited_as_stored(audited_pow2):
    result = json.loads((audited_pow2 / "requant-audit.json").read_text())
    assert result["manifest_digest"] == manifest_digest_by_hand(audited_pow2)
    conv = result["converted"]
    assert conv["arm"] == "nearest" and conv["servable"] is True and conv["scales_all_power_of_two"] is True
    ck = open_checkpoint(audited_pow2)
    for lin in ck.quantized_linears:
        q, s = ck.weight_and_scale(lin)
        mantissa, _ = torch.frexp(s.to(torch.float64))
        assert bool((mantissa == 0.5).all()), lin
        q2, s2 = requantize(q, s, "nearest")  # what the pow2 regime computes: the stored bits again
        assert torch.equal(q2, q) and torch.equal(s2.view(torch.int16), s.view(torch.int16)), lin
    rows = {(r["name"], r["regime"]): r for r in result["per_layer"]}
    for lin in ck.quantized_linears:
        native, pow2 = rows[(lin, "native")], rows[(lin, "pow2")]
        assert {k: native[k] for k in ("bitwise_equal", "mismatches", "max_ulp")} == {
            k: pow2[k] for k in ("bitwise_equal", "mismatches", "max_ulp")
        }
    md = markdown(result)
    assert "Converted checkpoint, arm `nearest`" in md and result["manifest_digest"] in md


def test_manifest_mismatch_stops_the_audit_before_it_runs(tmp_path):
    import shutil

    from requant.evidence import manifest as mf

    ck = tmp_path / "ck"
    shutil.copytree(DEFAULT_CHECKPOINT, ck)
    mf.write(ck)
    (ck / "config.json").write_bytes((ck / "config.json").read_bytes() + b"\n")
    res = runner.invoke(app, ["audit", str(ck), "--prompts", "1"])
    assert res.exit_code == 2 and "config.json differs" in res.output and "Traceback" not in res.output
    assert "cells" not in res.output.split("config.json differs")[0].lower()  # nothing ran


def test_unpinned_matrix_exits_1(default_audit, monkeypatch):
    """The exit status follows the scorecard's matrix_pinned flag (a real result, the flag flipped)."""
    import requant.audit.suite as suite

    for pinned, code in ((True, 0), (False, 1)):
        result = copy.deepcopy(default_audit)
        result["scorecard"]["matrix_pinned"] = pinned
        monkeypatch.setattr(suite, "run_audit", lambda *a, _r=result, **k: _r)
        res = runner.invoke(app, ["audit", "--backends", "reference", "--prompts", "1"])
        assert res.exit_code == code, res.output
        assert ("NOT PINNED" in res.output) is (not pinned)
