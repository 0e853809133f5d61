"""Usage errors are exit 2 with one line naming the option at fault, never a traceback, a wrong
code or a run that should not happen. References: the option names of each command's --help
and huggingface_hub's own repo id validator (the rule push applies)."""

import pytest
from typer.testing import CliRunner

from requant.cli import app

runner = CliRunner()


def _usage_error(res, *words):
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output
    errors = [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1, res.stderr
    for w in words:
        assert w in errors[0], errors[0]
    return errors[0]


@pytest.mark.parametrize(
    "command",
    [
        ["audit", "--backends", "reference"],
        ["determinism", "--backends", "reference"],
        ["eval", "--arms", "native", "--limit", "1"],
    ],
)
def test_a_device_that_is_not_one(command):
    _usage_error(runner.invoke(app, command + ["--device", "banana"]), "--device", "banana")


@pytest.mark.parametrize("command", ["audit", "determinism"])
def test_the_same_backend_twice_is_refused(command):
    res = runner.invoke(app, [command, "--backends", "reference-triton-order,reference-triton-order", "--prompts", "1"])
    _usage_error(res, "--backends", "twice")


def test_card_validates_the_repo_id_as_push_does(pow2_copy):
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    with pytest.raises(HFValidationError):
        validate_repo_id("bad id!!")
    before = (pow2_copy / "README.md").read_bytes()
    _usage_error(runner.invoke(app, ["card", str(pow2_copy), "--repo-id", "bad id!!"]), "--repo-id", "bad id!!")
    assert (pow2_copy / "README.md").read_bytes() == before  # nothing written


def test_act_backend_triton_on_cpu_names_act_backend(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    line = _usage_error(
        runner.invoke(app, ["determinism", "--backends", "reference", "--act-backend", "triton", "--device", "cpu"]),
        "--act-backend",
    )
    assert "--backends" not in line
    _usage_error(
        runner.invoke(app, ["eval", "--arms", "native", "--limit", "1", "--act-backend", "triton", "--device", "cpu"]),
        "--act-backend",
    )
    _usage_error(
        runner.invoke(app, ["eval", "--arms", "native", "--limit", "1", "--backend", "cutlass", "--device", "cpu"]),
        "--backend",
        "cutlass",
    )


@pytest.mark.parametrize("jobs", ["0", "-3"])
def test_convert_jobs_must_be_positive(tmp_path, jobs):
    _usage_error(runner.invoke(app, ["convert", "-o", str(tmp_path / "out"), "--jobs", jobs]), "--jobs")
    assert not (tmp_path / "out").exists()
