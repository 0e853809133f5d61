"""The `requant` command line: one typer app assembled from requant/commands/ (one module per
command group; requant/commands/_common.py holds what they share, the exit codes included)."""

from typing import Annotated

import typer

from requant import __version__
from requant.commands import audit, checkpoint, conform, determinism, eval, generate, publish, replay, tp_check

app = typer.Typer(
    name="requant",
    help="Power-of-two INT8 scales for deterministic W8A8 inference across GPU kernels.\n\n"
    "Exit codes: 0 done or check passed, 1 the check failed, 2 could not run, 130 interrupted.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        print(f"requant {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """Power-of-two INT8 scales for deterministic W8A8 inference across GPU kernels."""


app.command("convert")(checkpoint.convert)
app.command("inspect")(checkpoint.inspect)
app.command("verify")(checkpoint.verify)
app.command("audit")(audit.audit)
app.command("conform")(conform.conform)
app.command("determinism")(determinism.determinism)
app.command("eval")(eval.eval_command)
app.command("manifest")(publish.manifest)
app.command("card")(publish.card)
app.command("push")(publish.push)
app.command("tp-check")(tp_check.tp_check)
app.command("generate")(generate.generate)
app.command("replay")(replay.replay)

if __name__ == "__main__":
    app()
