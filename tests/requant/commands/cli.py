"""The command tests' way of running `requant` in-process (typer's CliRunner) and reading a refusal."""

from typer.testing import CliRunner

from requant.cli import app

runner = CliRunner()


def invoke(*args):
    """requant ARGS (each str()-ed); never a traceback, whatever the exit code."""
    res = runner.invoke(app, [str(a) for a in args])
    assert "Traceback" not in res.output, res.output
    return res


def refused(res, *words) -> str:
    """The one `error:` line of an exit-2 refusal, holding every word."""
    assert res.exit_code == 2, res.output
    (line,) = [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
    for w in words:
        assert w in line, line
    return line


def open_checkpoint_fails(monkeypatch, message: str) -> None:
    """requant.checkpoint.open_checkpoint raises AssertionError(message), however a module bound it:
    its first step (resolve_source, a global of requant.checkpoint looked up at each call) is
    replaced, so every binding of open_checkpoint reaches the stand-in."""
    import requant.checkpoint

    def reached(*args, **kwargs):
        raise AssertionError(message)

    monkeypatch.setattr(requant.checkpoint, "resolve_source", reached)
