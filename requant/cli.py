"""The `requant` command line: one typer app assembled from requant/commands/ (one module per
command group; requant/commands/_common.py holds what they share, the exit codes included).

What holds for every command is decided here, once, in `RequantGroup`: a usage error is one
`error: ...` line on stderr and exit 2 (click's "did you mean" hint kept on that line);
SIGTERM is treated as Ctrl-C for the whole run, so every command's cleanup runs and it exits
130 with the interrupt line; REQUANT_DEBUG=1 prints the traceback behind an error line.
Before that, from the first line of this module on, Ctrl-C or SIGTERM while the app loads (the
imports, typer building the command) exits 130 with the same line: nothing is written yet.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import threading
from typing import Annotated


def _exit_interrupted(signum, frame):
    """A signal before RequantGroup.main: nothing has started, so the line and 130, at once (an
    exception here would surface as a traceback from whichever import it interrupted)."""
    os.write(2, b"error: interrupted\n")
    os._exit(130)


def _handle(handlers: dict) -> dict:
    """Install {signal: handler} (main thread only; a signal the caller ignores stays ignored, as
    `nohup` and a shell's background jobs ask); {signal: the previous handler} of those installed."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {sig: signal.signal(sig, h) for sig, h in handlers.items() if signal.getsignal(sig) != signal.SIG_IGN}


def _exit_on_interrupt() -> dict:
    """Ctrl-C and SIGTERM exit 130 from here on; {signal: the previous handler}."""
    return _handle({signal.SIGINT: _exit_interrupted, signal.SIGTERM: _exit_interrupted})


def _restore(old: dict) -> None:
    for sig, handler in old.items():
        signal.signal(sig, handler)


_LOADING = _exit_on_interrupt()  # first, before the imports that take most of the start-up

import typer  # noqa: E402
from typer.core import TyperGroup  # noqa: E402

try:  # typer >= 0.24 vendors click (typer._click); older typers use click itself
    from typer._click.exceptions import NoArgsIsHelpError, UsageError
    from typer.exceptions import Abort
except ImportError:  # pragma: no cover - depends on the installed typer
    from click.exceptions import Abort, NoArgsIsHelpError, UsageError

from requant import __version__  # noqa: E402
from requant.commands import (  # noqa: E402
    audit,
    checkpoint,
    conform,
    determinism,
    evaluate,
    generate,
    publish,
    replay,
    tp_check,
)
from requant.commands._common import EXIT_ERROR, EXIT_INTERRUPTED, debug_traceback, err, plain  # noqa: E402
from requant.commands._guards import RequantCommand, guarded_std_streams  # noqa: E402

__all__ = ["app", "RequantGroup"]


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


class RequantGroup(TyperGroup):
    """The app's group: the promises every command keeps, in one place."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        # the run's handlers: an interrupt is a KeyboardInterrupt, so every cleanup runs
        old = _handle({signal.SIGTERM: _raise_interrupt, signal.SIGINT: signal.default_int_handler})
        try:
            try:
                with guarded_std_streams():  # stdout nobody reads: the work and the exit code stand
                    rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
            except NoArgsIsHelpError as exc:  # `requant` alone: the help, exit 2 as click does
                print(exc.ctx.get_help() if exc.ctx else str(exc), file=sys.stderr)
                rv = EXIT_ERROR
            except UsageError as exc:
                rv = _usage_error(exc)
            except Abort:
                debug_traceback()
                err().print(f"[bold red]error:[/] {plain('interrupted')}")
                rv = EXIT_INTERRUPTED
        finally:
            _restore(old)
        if not standalone_mode:
            return rv
        sys.exit(rv if isinstance(rv, int) else 0)

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:  # outside a command's own handler: the line, then 130
            debug_traceback()
            err().print(f"[bold red]error:[/] {plain('interrupted')}")
            raise typer.Exit(EXIT_INTERRUPTED) from None


def _usage_error(exc: UsageError) -> int:
    debug_traceback()
    msg = " ".join(exc.format_message().split())  # one line whatever click put in it
    msg = msg.replace("Value error, ", "")
    msg = re.sub(
        r"\(Possible options?: ([^)]*)\)", lambda m: f"(did you mean {m.group(1).replace(', ', ' or ')}?)", msg
    )
    where = exc.ctx.command_path if exc.ctx is not None else "requant"
    err().print(f"[bold red]error:[/] {plain(msg)} (see {plain(where)} --help)")
    return EXIT_ERROR


class RequantTyper(typer.Typer):
    """The app: `app()` (the `requant` script, `python -m requant.cli`) exits 130 on an interrupt
    until RequantGroup.main takes over (typer builds the command first), its caller's handlers
    restored when it returns."""

    def __call__(self, *args, **kwargs):
        old = _exit_on_interrupt()
        try:
            return super().__call__(*args, **kwargs)
        finally:
            _restore(old)


app = RequantTyper(
    name="requant",
    cls=RequantGroup,
    help="Power-of-two INT8 scales for deterministic W8A8 inference across GPU kernels.\n\n"
    "Exit codes: 0 done or check passed, 1 the check failed, 2 could not run, 130 interrupted.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
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


# short_help: the one-line summary in `requant --help` (click would cut the docstring's first
# sentence at the terminal's width, mid-sentence)
_COMMANDS = (
    ("convert", checkpoint.convert, "Requantize every weight scale to a power of two."),
    ("inspect", checkpoint.inspect, "Describe a W8A8 checkpoint."),
    ("verify", checkpoint.verify, "Compare two checkpoints byte for byte."),
    ("audit", audit.audit, "Per-layer kernel comparison and the fault suite."),
    ("conform", conform.conform, "Name the epilogue formula a kernel implements."),
    ("determinism", determinism.determinism, "Greedy generations with each kernel."),
    ("eval", evaluate.eval_command, "Perplexity of each scale arm, paired intervals."),
    ("manifest", publish.manifest, "Check (or write) SHA256SUMS."),
    ("card", publish.card, "Render the model card from the reports."),
    ("push", publish.push, "Upload an audited checkpoint in one commit."),
    ("tp-check", tp_check.tp_check, "Tensor-parallel degrees bitwise against TP 1."),
    ("generate", generate.generate, "Generate text, greedy or seeded sampling; record it."),
    ("replay", replay.replay, "Re-run a generation record and compare it bit for bit."),
)
for _name, _fn, _short in _COMMANDS:
    app.command(_name, short_help=_short, cls=RequantCommand)(_fn)
_restore(_LOADING)  # loaded: whoever imported this module keeps its own handlers

if __name__ == "__main__":
    app()
