"""The one `requant` command line.

Each sub-command lives next to the code it drives (requant/commands.py for the
checkpoint tools, audit/command.py for the audit, requant/eval/command.py for the evaluation,
requant/determinism_command.py for determinism, requant/publish/commands.py for manifest,
card and push); this file only assembles them
into a single typer app so that `requant --help` lists everything.
"""

import typer

from requant.audit.command import audit
from requant.commands import convert, inspect, verify
from requant.determinism_command import determinism
from requant.eval.command import eval_command
from requant.publish.commands import card, manifest, push

app = typer.Typer(
    name="requant",
    help="Power-of-two INT8 scales for deterministic W8A8 inference across GPU kernels.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.command("convert")(convert)
app.command("inspect")(inspect)
app.command("verify")(verify)
app.command("audit")(audit)
app.command("determinism")(determinism)
app.command("eval")(eval_command)
app.command("manifest")(manifest)
app.command("card")(card)
app.command("push")(push)


if __name__ == "__main__":
    app()
