"""Commands that run a user's kernel do the work in a child process, and the parent gives the verdict.

A MODULE:FUNCTION kernel (audit and determinism `--backends`, conform `--kernel`) is arbitrary
code: requant.user_kernel turns whatever Python can catch (an exception, sys.exit, a wrong
return) into exit 2, but os._exit(0), a C-level exit or a crash would end the process with
a status that reads as a verdict. So the command re-executes itself (`python -m requant.cli
COMMAND ...`, the same options, the parent's import path) in a child, which imports and runs
the kernel, writes the outputs and, as its very last step, writes its verdict (0 or 1) to a
pipe only it and the parent share (deliver). The parent imports no user code; it exits
  0 / 1  only when the child wrote that verdict to the pipe,
  2      when the child refused the request (its error line is on stderr), or ended without a
         verdict (any exit status, a signal): one error line saying so,
  130    when the parent or the child was interrupted (SIGINT / SIGTERM; the child is asked to
         stop, and its atomic outputs leave nothing behind).
A kernel that deliberately writes a verdict to that pipe is not defended against: the guard is
against a user kernel ending the run, not against forgery by code that runs as the user.
"""

from __future__ import annotations

import io
import os
import shlex
import signal
import subprocess
import sys
from typing import NoReturn, Optional

import typer

from requant.commands._common import EXIT_ERROR, EXIT_INTERRUPTED, echo_command, fail

__all__ = ["ENV", "needs_child", "run_in_child", "deliver"]

ENV = "REQUANT_VERDICT_FD"
# An interrupt ends the command within 2 s (the README's promise), the user's kernel included: a
# terminal's Ctrl-C reaches the child too, so it gets a moment to stop by itself, then SIGTERM (its
# Ctrl-C), then SIGKILL for a kernel that ignores both (a temporary it leaves is swept by the next run,
# requant/io/leftovers.py).
_GRACE_S = 0.5
_STOP_S = 1.0


_verdict_fd: list[int] = []  # in the child: the pipe to the parent, taken out of the environment


def needs_child(user_code: bool) -> bool:
    """True in the parent of a command that will run user code. In the child (ENV set) the pipe
    is taken from the environment, so that the user's code and its subprocesses do not see it."""
    fd = os.environ.pop(ENV, None)
    if fd is not None:
        try:
            _verdict_fd.append(int(fd))
        except ValueError:
            pass
        return False
    return user_code and not _verdict_fd


def deliver(code: int) -> typer.Exit:
    """In the child: write the verdict `code` (0 or 1) to the parent's pipe (nothing outside a
    child, or when that descriptor is not a pipe), and return the typer.Exit to raise with it."""
    import stat

    while _verdict_fd:
        fd = _verdict_fd.pop()
        try:
            if stat.S_ISFIFO(os.fstat(fd).st_mode):
                os.write(fd, f"verdict {code}\n".encode())
            os.close(fd)
        except OSError:
            pass  # no pipe: the parent reports "no verdict" (exit 2), never a pass
    return typer.Exit(code)


def _stream(f) -> Optional[int]:
    """The file descriptor behind sys.stdout / sys.stderr, or None (an in-memory stream)."""
    try:
        f.flush()
        return f.fileno()
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        return None


def _stop(proc: subprocess.Popen) -> int:
    try:
        return proc.wait(_GRACE_S)
    except subprocess.TimeoutExpired:
        pass
    proc.send_signal(signal.SIGTERM)  # the child treats it as Ctrl-C: 130, nothing written
    try:
        return proc.wait(_STOP_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


def run_in_child(command: str) -> NoReturn:
    """Re-run the running click command (`requant COMMAND ...` as echo_command rebuilds it) in a
    child process and exit with its verdict (module docstring). Call it before importing any
    user code."""

    args = shlex.split(echo_command(command))[1:]
    read_fd, write_fd = os.pipe()
    env = dict(os.environ)
    env[ENV] = str(write_fd)
    # the child imports the kernel's module the way this process would
    env["PYTHONPATH"] = os.pathsep.join([os.path.abspath(p) for p in sys.path if p] + [os.getcwd()])
    outs = [_stream(sys.stdout), _stream(sys.stderr)]
    pipe = subprocess.PIPE
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "requant.cli", *args],
            env=env,
            pass_fds=(write_fd,),
            stdout=pipe if outs[0] is None else None,
            stderr=pipe if outs[1] is None else None,
        )
    except OSError as exc:
        os.close(read_fd)
        os.close(write_fd)
        fail(f"cannot start the child process that runs the user kernel: {exc.strerror or exc}")
    os.close(write_fd)
    try:
        try:
            got_out, got_err = proc.communicate()
        except KeyboardInterrupt:
            rc = _stop(proc)
            if rc != EXIT_INTERRUPTED:  # the child printed its own interrupt line otherwise
                fail("interrupted; nothing was written", EXIT_INTERRUPTED)
            raise typer.Exit(EXIT_INTERRUPTED) from None
        if got_out:
            sys.stdout.write(got_out.decode("utf-8", "replace"))
            sys.stdout.flush()
        if got_err:
            sys.stderr.write(got_err.decode("utf-8", "replace"))
            sys.stderr.flush()
        with os.fdopen(read_fd, "rb", closefd=False) as f:
            said = f.read(64).decode("ascii", "replace").strip()
    finally:
        os.close(read_fd)
    rc = proc.returncode
    if said in ("verdict 0", "verdict 1"):
        raise typer.Exit(int(said[-1]))
    if rc in (EXIT_ERROR, EXIT_INTERRUPTED):
        raise typer.Exit(rc)  # the child said why on stderr
    how = f"was killed by signal {-rc}" if rc < 0 else f"exited with status {rc}"
    fail(f"the run of the user kernel {how} without giving a verdict (a kernel that ended its process?); no result")
