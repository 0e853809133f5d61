"""What requant/cli.py enforces for every command, whatever the command does:

* RequantCommand (the class of every command): before the command's body runs, each output
  option (OUTPUT_OPTIONS) is checked against every input parameter (requant.io.output_guard: no
  output on or inside an input, no two outputs one file). Parameters are classified from click's
  own list, so a new command's --json is checked without a line of its own.
* guarded_std_streams (RequantGroup.main): a stdout or stderr that nobody reads is discarded; the
  command's files and its exit code stand (the policy in requant/commands/_common.py).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from pathlib import Path

import click
import typer
from typer.core import TyperCommand

from requant import DEFAULT_CHECKPOINT
from requant.commands._common import cannot_run, check_outputs
from requant.evidence.manifest import REPORTS
from requant.io import snapshot

__all__ = ["OUTPUT_OPTIONS", "RequantCommand", "command_paths", "guarded_std_streams", "input_params", "output_params"]


# -- outputs never land on inputs: one check for every command, before its body runs ------
# Options that name what a command writes: a file (None) or a directory (the module and name of
# the tuple of files it writes there; () when it is a checkpoint directory: convert's -o).
OUTPUT_OPTIONS: dict[str, object] = {"--json": None, "--plot": None, "--output": (), "--report": {}, "--export": {}}
DIR_FILES = {
    ("audit", "--report"): ("requant.audit.report", "REPORT_FILES"),
    ("eval", "--report"): ("requant.eval.report", "REPORT_FILES"),
    ("conform", "--export"): ("requant.audit.conform.vectors", "EXPORT_FILES"),
}
# Parameters (str: a local directory or a Hub id) that name a checkpoint the command reads.
CHECKPOINT_PARAMS = ("ckpt", "src", "checkpoint")


def _long_flag(param) -> str:
    return max((o for o in param.opts if o.startswith("--")), key=len, default=param.opts[0])


def _is_path(param) -> bool:
    """A parameter whose value is a pathlib.Path (or a list of them)."""
    kind = getattr(param, "type", None)
    if kind is not None:  # click itself (an older typer)
        return getattr(kind, "name", "") == "path"
    ann = getattr(getattr(param, "type_descriptor", None), "annotation", None)
    return ann is Path or (getattr(ann, "__args__", None) or (None,))[0] is Path


def output_params(command) -> dict[str, object]:
    """{long flag: param} of the options of a click command that name an output path."""
    return {
        _long_flag(p): p
        for p in command.params
        if p.param_type_name == "option" and _is_path(p) and _long_flag(p) in OUTPUT_OPTIONS
    }


def input_params(command) -> dict[str, object]:
    """{label: param} of a command's parameters that name something it reads: every other path
    parameter, and a checkpoint given as a string (a directory or a Hub id)."""
    found = {}
    for p in command.params:
        if p.param_type_name == "option" and _long_flag(p) in output_params(command):
            continue
        if _is_path(p) or p.name in CHECKPOINT_PARAMS:
            found[
                _long_flag(p) if p.param_type_name == "option" else (getattr(p, "metavar", None) or p.name.upper())
            ] = p
    return found


def command_paths(command, params: dict, name: str) -> tuple[list, list]:
    """(outputs, inputs) of one parsed invocation, for requant.io.output_guard.check_outputs. A
    command with a checkpoint parameter left out reads the embedded default."""
    import importlib

    outputs = []
    for flag, p in output_params(command).items():
        value = params.get(p.name)
        if value is None:
            continue
        files = OUTPUT_OPTIONS[flag]
        if isinstance(files, dict):  # a report directory: the files the command writes there
            module, attr = DIR_FILES.get((name, flag), (None, None))
            files = tuple(getattr(importlib.import_module(module), attr)) if module else ()
        outputs.append((flag, Path(value), files))
    inputs = []
    for label, p in input_params(command).items():
        value = params.get(p.name)
        checkpoint = p.name in CHECKPOINT_PARAMS
        if value is None and checkpoint and p.param_type_name == "argument":
            inputs.append(("the embedded default checkpoint", DEFAULT_CHECKPOINT, ()))
            continue
        for v in value if isinstance(value, (list, tuple)) else [value]:
            if v is not None:
                what = ("the source" if p.name == "src" else "the checkpoint") if checkpoint else label
                inputs.append((what, Path(v), REPORTS if checkpoint else ()))
    return outputs, inputs


class RequantCommand(TyperCommand):
    """Every command's class (requant/cli.py): its output options are checked against its
    inputs before its body runs (command_paths, check_outputs), so a command cannot skip it."""

    def invoke(self, ctx):
        with cannot_run():
            check_outputs(*command_paths(ctx.command, ctx.params, ctx.info_name))
        with _torch_threads_kept(), snapshot.watching(), _sweep_notes(), _signals_honoured():
            try:
                result = super().invoke(ctx)
            except (click.exceptions.Exit, typer.Exit) as exc:
                if exc.exit_code in (0, 1):  # a verdict: void if an input changed under it
                    with cannot_run():
                        snapshot.check_at_end()
                raise
            with cannot_run():
                snapshot.check_at_end()
            return result


GRACE_S = 1.5  # after SIGINT/SIGTERM, cleanup may take this long before the process exits 130 regardless


@contextlib.contextmanager
def _signals_honoured():
    """SIGINT and SIGTERM end the command promptly with exit 130: the signal is a KeyboardInterrupt
    in the main thread (cleanup runs: cannot_run's line, the atomic outputs' removal, a user
    kernel's child stopped). During a Hub transfer (requant.io.hub_client.transfer) a timer also
    ends the process with 130 once GRACE_S passed: huggingface_hub's main thread then waits on
    download threads blocked in a socket read, which no interrupt reaches. What that leaves is
    swept by the next run (requant.io.leftovers)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    timers: list[threading.Timer] = []

    def handler(signum, frame):
        from requant.io import hub_client

        if hub_client.in_transfer():
            timer = threading.Timer(GRACE_S, _exit_now, args=(signum,))
            timer.daemon = True
            timer.start()
            timers.append(timer)
        raise KeyboardInterrupt

    handler.honours_sigterm = True  # sigterm_as_interrupt leaves it in place
    old = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, h in old.items():
            signal.signal(sig, h)
        for timer in timers:
            timer.cancel()
        if timers and any(
            t.is_alive() and not t.daemon for t in threading.enumerate() if t is not threading.main_thread()
        ):
            sys.stderr.flush()  # a thread still blocked (a stalled download) would hold the exit: not wait for it
            os._exit(130)


def _exit_now(signum: int) -> None:
    name = signal.Signals(signum).name
    os.write(2, f"error: interrupted ({name}); cleanup did not end within {GRACE_S:g} s, exiting now\n".encode())
    os._exit(130)


@contextlib.contextmanager
def _sweep_notes():
    """A killed run's leftovers swept during the command are said on the warning line (requant.io.leftovers)."""
    from requant.commands._common import warn
    from requant.io import leftovers

    old, leftovers.note = leftovers.note, warn
    try:
        yield
    finally:
        leftovers.note = old


@contextlib.contextmanager
def _torch_threads_kept():
    """torch's intra-op thread count as the caller had it once the command ends: `--threads`
    (set_threads) is the command's own setting, not its caller's (a command run in-process, by
    typer's CliRunner or from Python, left every later torch call on its count)."""
    torch = sys.modules.get("torch")  # not imported: nothing to keep (and no import for it)
    n = torch.get_num_threads() if torch is not None else None
    try:
        yield
    finally:
        if n is not None and torch.get_num_threads() != n:
            torch.set_num_threads(n)


# -- stdout nobody reads ------------------------------------------------------------------
class _Discarding:
    """A standard stream that, once its reader is gone (a closed stdout, `| head` exiting: EPIPE,
    EBADF, a closed file), discards what is written instead of raising: the command still does
    its work, writes its files and exits with its verdict's code (the policy in the module
    docstring). The descriptor is pointed at /dev/null then, so that nothing (the interpreter's
    flush at exit included) fails on it again."""

    def __init__(self, stream, fd: int):
        self._fd, self.lost = fd, stream is None  # None: the descriptor was closed when Python started
        self._stream = stream if stream is not None else open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115

    def _drop(self) -> None:
        self.lost = True
        try:
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, self._fd)
            os.close(null)
        except OSError:
            pass

    def write(self, text):
        if not self.lost:
            try:
                return self._stream.write(text)
            except (BrokenPipeError, OSError):
                self._drop()
            except ValueError:  # a closed file; anything else (an encoding error) is a bug to see
                if not getattr(self._stream, "closed", False):
                    raise
                self._drop()
        return len(text)

    def flush(self):
        if not self.lost:
            try:
                self._stream.flush()
            except (BrokenPipeError, OSError):
                self._drop()
            except ValueError:
                if not getattr(self._stream, "closed", False):
                    raise
                self._drop()

    def isatty(self) -> bool:
        try:
            return not self.lost and self._stream.isatty()
        except (ValueError, OSError):
            return False

    def __getattr__(self, name):
        return getattr(self._stream, name)


@contextlib.contextmanager
def guarded_std_streams():
    """Inside the block stdout and stderr are _Discarding streams, and a standard descriptor
    that was closed when requant started is /dev/null (so that no output file can get fd 1 or
    2 and receive what is printed)."""
    for fd in (1, 2):
        try:
            os.fstat(fd)
        except OSError:
            try:
                null = os.open(os.devnull, os.O_WRONLY)
                if null != fd:
                    os.dup2(null, fd)
                    os.close(null)
            except OSError:
                pass
    old = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _Discarding(sys.stdout, 1), _Discarding(sys.stderr, 2)
    try:
        yield
    finally:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        sys.stdout, sys.stderr = old
        for fd, stream in ((1, old[0]), (2, old[1])):
            try:
                if stream is not None:
                    stream.flush()
            except (BrokenPipeError, ValueError, OSError):
                try:
                    null = os.open(os.devnull, os.O_WRONLY)
                    os.dup2(null, fd)
                    os.close(null)
                except OSError:
                    pass
