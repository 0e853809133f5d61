"""The checkpoint commands (requant/commands/checkpoint.py) through the assembled app
(requant.cli.app). Reference for values: the library functions (requant.convert.convert,
requant.checkpoint.inspect, requant.evidence.verify) and the input files."""

import json
import signal
import subprocess
import sys
import time

import pytest
from typer.testing import CliRunner

from requant import DEFAULT_CHECKPOINT
from requant.cli import app
from tests.interrupts import sigint_default
from tests.requant.conftest import tree_bytes

runner = CliRunner()


def test_convert_default_with_json(tmp_path):
    out, report = tmp_path / "out", tmp_path / "report.json"
    before = tree_bytes(DEFAULT_CHECKPOINT)
    res = runner.invoke(app, ["convert", "-o", str(out), "--json", str(report), "--plot", str(tmp_path / "p.png")])
    assert res.exit_code == 0, res.output
    rep = json.loads(report.read_text())
    assert rep["arm"] == "nearest" and rep["servable"] is True
    assert len(rep["layers"]) == 42 and rep["totals"]["linears"] == 42
    for st in rep["layers"].values():
        assert set(st) >= {"scales_changed", "exponent_shifts", "weights_clipped", "rel_weight_error"}
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "42 quantized Linears" in res.output
    assert tree_bytes(DEFAULT_CHECKPOINT) == before  # the source is untouched
    res = runner.invoke(app, ["convert", "-o", str(out)])
    assert res.exit_code == 2 and "--force" in res.output
    res = runner.invoke(app, ["convert", "-o", str(out), "--force", "--arm", "ceiling", "-q"])
    assert res.exit_code == 0, res.output


def test_inspect_json(tmp_path):
    res = runner.invoke(app, ["inspect", str(DEFAULT_CHECKPOINT), "--json"])
    assert res.exit_code == 0, res.output
    info = json.loads(res.output)
    assert info["architecture"] == "Qwen3ForCausalLM" and info["quantized_linears"] == 42
    assert info["scale_dtypes"] == {"BF16": 42} and info["all_scales_power_of_two"] is False
    assert info["int8_range"] == [-128, 127] and info["int8_min128_count"] > 0
    runner.invoke(app, ["convert", "-o", str(tmp_path / "p2"), "--arm", "ceiling"])
    info = json.loads(runner.invoke(app, ["inspect", str(tmp_path / "p2"), "--json"]).output)
    assert info["all_scales_power_of_two"] is True and info["provenance"]["arm"] == "ceiling"
    res = runner.invoke(app, ["inspect", str(tmp_path / "p2")])
    assert res.exit_code == 0 and "Qwen3ForCausalLM" in res.output


def test_verify(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    assert runner.invoke(app, ["convert", "-o", str(a), "--arm", "unconstrained"]).exit_code == 0
    res = runner.invoke(app, ["verify", str(a), str(DEFAULT_CHECKPOINT)])
    assert res.exit_code == 0 and "identical" in res.output
    assert runner.invoke(app, ["convert", "-o", str(b), "--arm", "nearest"]).exit_code == 0
    res = runner.invoke(app, ["verify", str(a), str(b)])
    assert res.exit_code == 1
    assert "model.layers.0.self_attn.q_proj.weight_scale" in res.output and "config.json" in res.output
    rep = json.loads(runner.invoke(app, ["verify", str(a), str(b), "--json"]).output)
    # README.md: a constrained arm writes a stub in place of the source's card
    assert rep["identical"] is False and rep["differing_files"] == ["README.md", "config.json", "model.safetensors"]
    assert rep["only_in_b"] == ["SHA256SUMS", "SHA256SUMS.source", "requant-convert.json"]
    names = {d["tensor"] for d in rep["tensors"]}
    assert "model.embed_tokens.weight" not in names and "model.layers.3.mlp.down_proj.weight" in names
    (b / "extra.txt").write_text("x")
    rep = json.loads(runner.invoke(app, ["verify", str(a), str(b), "--json"]).output)
    assert rep["only_in_b"] == ["SHA256SUMS", "SHA256SUMS.source", "extra.txt", "requant-convert.json"]


def test_probe_is_labelled(tmp_path):
    res = runner.invoke(app, ["convert", "-o", str(tmp_path / "p"), "--arm", "probe"])
    assert res.exit_code == 0 and "NOT servable" in res.output
    cfg = json.loads((tmp_path / "p" / "config.json").read_text())
    assert cfg["requant"]["servable"] is False and "NOT SERVABLE" in cfg["requant"]["warning"]


def test_bad_arm_and_missing_source(tmp_path):
    res = runner.invoke(app, ["convert", "-o", str(tmp_path / "o"), "--arm", "floor"])
    assert res.exit_code != 0
    res = runner.invoke(app, ["convert", str(tmp_path / "nope"), "-o", str(tmp_path / "o")])
    assert res.exit_code == 2 and "no such directory" in res.output and "Traceback" not in res.output


SLOW_CONVERT = r"""
import sys, time, typer
import requant.scales.arms
real = requant.scales.arms.Requantizer.rows
def slow(self, *a, **k):
    time.sleep(0.05)
    return real(self, *a, **k)
requant.scales.arms.Requantizer.rows = slow
from requant.commands.checkpoint import convert
app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
app.command("convert")(convert)
app.command("noop")(lambda: None)
app()
"""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_mid_convert_leaves_nothing(tmp_path, micro, sig):
    """A real interrupt of the CLI process half way: exit 130, no OUT, no temp dir."""
    out = tmp_path / "outs" / "out"
    proc = subprocess.Popen(
        [sys.executable, "-c", SLOW_CONVERT, "convert", str(micro), "-o", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=sigint_default,
    )
    deadline = time.time() + 60
    while time.time() < deadline and not (
        out.parent.exists() and any(p.name.startswith(".out.requant-tmp") for p in out.parent.iterdir())
    ):
        time.sleep(0.02)
    time.sleep(0.2)  # a few Linears in
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err
    assert not out.parent.exists() or list(out.parent.iterdir()) == []
