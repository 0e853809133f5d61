"""`requant tp-check` (requant/commands/tp_check.py) on the embedded default, through a typer
app holding the command as requant/cli.py registers it. References: the exit-code policy of
requant/commands/_common.py, the JSON fields the command documents, and requant.tp.compare's
result on the same launch (test_tp.py checks the launch itself against the runtime)."""

import json

import pytest
import typer
from typer.testing import CliRunner

from requant.commands.tp_check import parse_degrees, summary_line, tp_check
from requant.errors import UsageError

app = typer.Typer(pretty_exceptions_enable=False)


@app.callback()
def _group() -> None:
    """requant (the test's app)."""


app.command("tp-check")(tp_check)
runner = CliRunner()


def test_int32_identical_exit_0_and_json(tmp_path):
    out = tmp_path / "tp.json"
    res = runner.invoke(app, ["tp-check", "--tp", "2", "--prompts", "2", "--new-tokens", "4", "--json", str(out)])
    assert res.exit_code == 0, res.output
    assert res.output.strip().splitlines()[-1] == "tp 1,2: logits and tokens bitwise identical"
    rec = json.loads(out.read_text())
    assert rec["tp"] == [1, 2] and rec["reduce"] == "int32" and rec["identical"] is True
    assert [c["tp"] for c in rec["per_degree"]] == [1, 2]
    for c in rec["per_degree"]:
        assert c["identical"] and c["logits_first_diff"] is None and c["tokens_first_diff"] is None
        assert c["digest"] == rec["per_degree"][0]["digest"]
    assert rec["collectives"] == "gloo" and rec["backend"] == "reference-triton-order" and rec["new_tokens"] == 4
    assert rec["command"].startswith("requant tp-check --tp 2 ") and rec["manifest_digest"].startswith("sha256:")


def test_bf16_reduce_differs_exit_1(tmp_path):
    out = tmp_path / "tp.json"
    res = runner.invoke(
        app, ["tp-check", "--tp", "2", "--reduce", "bf16", "--prompts", "1", "--new-tokens", "2", "--json", str(out)]
    )
    assert res.exit_code == 1, res.output
    assert res.output.strip().splitlines()[-1] == "tp 1,2: NOT bitwise identical to tp 1 at tp 2"
    rec = json.loads(out.read_text())
    assert rec["reduce"] == "bf16" and rec["identical"] is False
    one, two = rec["per_degree"]
    assert one["identical"] and not two["identical"]
    # the first position whose logits differ, as documented (the double rounding reaches position 0)
    assert two["logits_first_diff"] == {"prompt": 0, "position": 0} and two["logits_differing"] > 0


@pytest.mark.parametrize(
    "args,what",
    [
        (["--tp", "3"], "--tp 3: "),
        (["--tp", "8"], "--tp 8: "),
        (["--tp", "two"], "--tp takes comma-separated positive integers"),
        (["--tp", "0,2"], "--tp takes comma-separated positive integers"),
        (["--backend", "cutlass"], "cutlass backend needs a CUDA GPU"),
        (["--backend", "nope"], "--backend: unknown backend 'nope'"),
        (["--reduce", "fp32"], "--reduce must be one of int32, bf16"),
        (["--regime", "ceiling"], "--regime must be one of native, pow2"),
        (["--new-tokens", "-1"], "--new-tokens must be >= 0"),
        (["--prompts", "17"], "--prompts at most 16"),
        (["--comm", "nccl"], "--comm must be gloo, or nccl on a CUDA device"),
        (["--comm", "mpi"], "--comm must be gloo, or nccl on a CUDA device"),
    ],
)
def test_usage_errors_exit_2_with_one_line(args, what):
    res = runner.invoke(app, ["tp-check", *args])
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and what in lines[0], res.output
    assert res.stdout == ""


@pytest.mark.parametrize(
    "args,what", [(["/nonexistent/requant-checkpoint"], "nonexistent"), (["--device", "banana"], "--device")]
)
def test_missing_checkpoint_or_bad_device_exit_2(args, what):
    res = runner.invoke(app, ["tp-check", *args])
    assert res.exit_code == 2 and "Traceback" not in res.output
    (line,) = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert line.startswith("error: ") and what in line


def test_parse_degrees_and_summary():
    assert parse_degrees("4,2") == (1, 2, 4) and parse_degrees("1") == (1,)
    with pytest.raises(UsageError):
        parse_degrees("")
    ok = {"identical": True}
    assert summary_line((1, 2), [{"tp": 1, **ok}, {"tp": 2, **ok}]) == "tp 1,2: logits and tokens bitwise identical"


def test_tp_check_shows_progress_while_it_runs():
    # never only the header while it works: a line at the start, when the ranks have read the
    # checkpoint, and when each degree is done (in that order), and the bar's count
    res = runner.invoke(app, ["tp-check", "--tp", "2", "--prompts", "1", "--new-tokens", "1"])
    assert res.exit_code == 0, res.output
    err = res.stderr
    marks = ["starting 2 process(es)", "checkpoint read", "tp 1: prefill and 1 greedy tokens done", "tp 2: prefill"]
    at = [err.find(m) for m in marks]
    assert all(i >= 0 for i in at) and at == sorted(at), err
    assert "3/3" in err and res.stdout.splitlines()[-1] == "tp 1,2: logits and tokens bitwise identical"


def test_tp_check_defaults_to_generate_and_evals_backend():
    from requant.backends import default_backend
    from requant.commands.generate import default_backend as generate_default
    from requant.eval.lm import default_backend as eval_default

    assert generate_default is eval_default is default_backend
    assert default_backend("cuda") == "triton" and default_backend("cuda:1") == "triton"
    assert default_backend("cpu") == "reference-triton-order"
    res = runner.invoke(app, ["tp-check", "--help"], env={"COLUMNS": "200"})
    assert "(default: triton on a GPU, reference-triton-order on CPU)" in res.stdout
