"""What every `requant` command shares: consoles, the error line, exit codes, the atomic
JSON writer and the option types that repeat.

EXIT CODES (one policy for every command)
    0  done, or the check passed
    1  it ran and the check failed (verify differs, manifest mismatch, audit scorecard,
       determinism, push refused by its rules, conform: not a known legal formula)
    2  it could not run: a usage error, a missing or malformed input, a SHA256SUMS that
       does not match before a run. One line `error: ...` on stderr, no traceback.
    3  push only: the commit landed (its URL is printed first), then a local step failed
       (writing README.md/SHA256SUMS back, or reading the commit's hashes back): the line says
       "pushed to URL (commit C); ..." and what to do; the Hub holds the commit.
  130  interrupted (Ctrl-C or SIGTERM); what was being written is removed.

A stdout (or stderr) that nobody reads, closed or a pipe whose reader left (`| head`), is
discarded (guarded_std_streams): the command still does its work, writes its files and exits
with its verdict's code, with no error line and no traceback.

Messages are single lines whatever the terminal: the consoles soft-wrap (rich never
inserts a newline into a long line) and control characters in names are escaped.
Importing this module does not import torch (`requant --help` stays fast).
"""

from __future__ import annotations

import contextlib
import functools
import os
import shlex
import signal
import sys
import threading
from pathlib import Path
from typing import Annotated, Callable, NoReturn, Optional

import typer
from rich.console import Console
from rich.markup import escape

from requant.backends import triton_interpreter_on_cpu
from requant.commands._limits import check_threads
from requant.errors import CheckpointError, UsageError
from requant.io.links import shown
from requant.io.output import OutputInterrupted, report_target, write_json_atomic
from requant.io.output_guard import check_outputs as check
from requant.models.tokenizer import byte_ids_allowed

__all__ = [
    "EXIT_OK",
    "EXIT_FAILED",
    "EXIT_ERROR",
    "EXIT_INTERRUPTED",
    "EXIT_PUSHED",
    "UsageError",
    "out",
    "err",
    "fail",
    "debug_traceback",
    "warn",
    "plain",
    "cannot_run",
    "sigterm_as_interrupt",
    "write_json_atomic",
    "default_device",
    "check_device",
    "check_engine",
    "set_threads",
    "echo_command",
    "check_output_file",
    "check_output_dir",
    "check_not_inside",
    "check_outputs",
    "printable",
    "text_out",
    "byte_tokens_option",
    "CkptArg",
    "DeviceOpt",
    "ThreadsOpt",
    "BackendsOpt",
    "RevisionOpt",
    "JsonOpt",
    "ReportOpt",
    "ByteTokensOpt",
    "EngineOpt",
]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_ERROR = 2
EXIT_PUSHED = 3  # push: committed on the Hub, then a local step failed (the module docstring)
EXIT_INTERRUPTED = 130


# -- consoles and lines ------------------------------------------------------------------
def out() -> Console:
    """stdout for people: tables and summary lines. Lines are never hard-wrapped (soft_wrap); a
    table takes the terminal's width, or COLUMNS (else 80) when piped, and folds long cells."""
    return Console(file=sys.stdout, highlight=False, emoji=False, soft_wrap=True)


def err() -> Console:
    """stderr: progress bars, warnings and the error line."""
    return Console(file=sys.stderr, highlight=False, emoji=False, soft_wrap=True, log_path=False)


def _unprintable(c: str) -> bool:
    o = ord(c)
    return o < 32 or 127 <= o < 160 or 0xD800 <= o <= 0xDFFF or o in (0x2028, 0x2029)


def printable(text: object, keep: str = "") -> str:
    """`text` with every control character (C0, DEL, C1: an ESC would drive the terminal; a
    newline would split the line), line separator and lone surrogate shown as its Python escape,
    but those in `keep` (generate's text keeps "\n\t"). For print(); rich lines use plain()."""
    s = str(text)
    if any(_unprintable(c) and c not in keep for c in s):
        s = "".join(repr(c)[1:-1] if _unprintable(c) and c not in keep else c for c in s)
    return s


def plain(text: object) -> str:
    """`text` made safe for one rich line: markup escaped (a name like `[red]` or `[/]` is
    printed as written), control characters shown as escapes (printable)."""
    return escape(printable(text))


def text_out(text: str) -> str:
    """Generated (or prompt) text for stdout: exact when piped (the text is the product; a lone
    surrogate, which no encoding holds, excepted), with control characters but newline and tab
    escaped on a terminal (model output must not drive the terminal)."""
    if sys.stdout.isatty():
        return printable(text, keep="\n\t")
    if any(0xD800 <= ord(c) <= 0xDFFF for c in text):
        return "".join(repr(c)[1:-1] if 0xD800 <= ord(c) <= 0xDFFF else c for c in text)
    return text


def fail(msg: str, code: int = EXIT_ERROR) -> NoReturn:
    """Print `error: msg` as one line on stderr and exit with `code` (REQUANT_DEBUG=1: the
    traceback of the exception being handled first, see debug_traceback)."""
    debug_traceback()
    err().print(f"[bold red]error:[/] {plain(msg)}")
    raise typer.Exit(code)


def debug_traceback() -> None:
    """With REQUANT_DEBUG=1 in the environment (as HF_DEBUG for huggingface_hub), print the
    traceback of the exception being handled to stderr, above the one-line error; else nothing."""
    if os.environ.get("REQUANT_DEBUG", "") in ("", "0"):
        return
    import traceback

    exc = sys.exc_info()[1]
    if exc is not None:
        traceback.print_exception(exc, file=sys.stderr)


def warn(msg: str) -> None:
    err().print(f"[bold yellow]warning:[/] {plain(msg)}")


def _os_message(exc: OSError) -> str:
    if not exc.filename:
        return str(exc)
    from requant.io.space import full_reason

    return f"{exc.filename}: {full_reason(exc, exc.filename, exc.strerror or str(exc))}"


@contextlib.contextmanager
def cannot_run(interrupted: str = "interrupted; nothing was written"):
    """Refusals inside the block become the error line and exit 2; an interrupt exits 130.
    Anything else escaping is a bug in requant and keeps its traceback."""
    try:
        yield
    except KeyError as exc:  # a backend or name lookup: its message is the first argument
        fail(str(exc.args[0]) if exc.args else repr(exc))
    except (CheckpointError, UsageError, ValueError) as exc:
        fail(str(exc))
    except OSError as exc:
        fail(_os_message(exc))
    except OutputInterrupted as exc:  # after the output was renamed into place: say that it is complete
        fail(str(exc), EXIT_INTERRUPTED)
    except MemoryError:
        fail("out of memory (a value past what requant.commands._limits estimates, or other processes took the memory)")
    except RuntimeError as exc:  # torch's allocators; a thread the system would not start
        text = str(exc)
        if "can't start new thread" in text:
            fail("the system refused to start a thread (memory or process limits); try again with fewer running")
        if type(exc).__name__ != "OutOfMemoryError" and "can't allocate memory" not in text:
            raise
        fail(f"out of memory: {text.splitlines()[0] if text else type(exc).__name__}")
    except KeyboardInterrupt:
        fail(interrupted, EXIT_INTERRUPTED)


@contextlib.contextmanager
def sigterm_as_interrupt():
    """Treat SIGTERM like Ctrl-C inside the block, so cleanup code runs."""
    if threading.current_thread() is not threading.main_thread() or getattr(
        signal.getsignal(signal.SIGTERM), "honours_sigterm", False
    ):  # every command has it already (requant.commands._guards._signals_honoured, with its grace timer)
        yield
        return

    def handler(signum, frame):
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


# -- devices and threads -----------------------------------------------------------------
def progress_bar(console: Console, *middle, transient: bool = False):
    """The counting progress bar of the long commands (description, bar, done/total, `middle`
    columns, elapsed, remaining), on `console`."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    return Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        *middle,
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
        transient=transient,
    )


def default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def check_device(device: str) -> str:
    """`device` if torch can use it here; UsageError naming --device otherwise."""
    import torch

    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError):
        raise UsageError(f"--device {device!r}: not a torch device (cpu, cuda, cuda:N)") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise UsageError(f"--device {device}: no CUDA device here")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise UsageError(f"--device {device}: only {torch.cuda.device_count()} CUDA device(s) here")
    elif dev.type != "cpu":
        raise UsageError(f"--device {device}: requant runs on cpu or cuda")
    return device


def check_engine(engine: str, device: str) -> str:
    """--engine: one of requant.runtime's ENGINES, and "fast" only where its Triton kernels run
    (a CUDA device, or the CPU under TRITON_INTERPRET=1, which it sets there: triton_interpreter_on_cpu).
    "portable" runs anywhere (its Triton kernels on CUDA, its torch form on the CPU)."""
    engines = ("auto", "fast", "reference", "portable")
    if engine not in engines:
        raise UsageError(f"--engine must be one of {', '.join(engines)}, got {engine!r}")

    interpret = triton_interpreter_on_cpu(str(device), engine == "fast")
    if engine == "fast" and not str(device).startswith("cuda") and not interpret:
        raise UsageError("--engine fast needs a CUDA GPU (or TRITON_INTERPRET=1 on CPU); on CPU use --engine reference")
    if engine == "fast" and not str(device).startswith("cuda"):  # said before the wait, not after it
        warn(
            "--engine fast on a CPU runs its Triton kernels in the interpreter: minutes for a few tokens "
            "(143 s for 64 tokens of the embedded default); --engine reference is the CPU engine"
        )
    return engine


def set_threads(threads: Optional[int], device: str) -> None:
    """--threads: default 1 on a CPU device (the tensors are small; intra-op threads spinning
    against other load were measured 8-15x slower on a shared 2-core machine), torch's
    default otherwise; 0 means torch's default."""
    n = threads if threads is not None else (1 if str(device) == "cpu" else 0)
    if n < 0:
        raise UsageError("--threads must be >= 0")

    check_threads(n)  # before torch starts them: past the cap, thread creation fails mid-run
    if n:
        import torch

        torch.set_num_threads(n)


def _click_context():
    """The running click context (typer's vendored click, or click itself), or None."""
    try:
        from typer._click.core import ParameterSource
        from typer._click.globals import get_current_context
    except ImportError:  # pragma: no cover - an older typer uses click itself
        from click import get_current_context
        from click.core import ParameterSource
    return get_current_context(silent=True), ParameterSource


def echo_command(name: str, resolved: dict | None = None) -> str:
    """The `requant NAME ...` line a report records, built from what click parsed, so that it
    cannot go stale when an option or a default changes: the arguments given, in order, then
    every option given on the command line or through the environment, in declaration order
    (its long flag; a True flag bare, a False flag left out). `resolved` {flag: value} adds or
    replaces options whose default depends on the machine (the backend pair chosen for the
    device, say), so the line reruns the same thing elsewhere. Outside a click context (a
    command function called from Python) only `resolved` is known."""
    ctx, source = _click_context()
    resolved = dict(resolved or {})
    args: list[str] = []
    options: dict[str, object] = {}
    if ctx is not None:
        for param in ctx.command.params:
            if param.name not in ctx.params:  # --help and --version expose no value
                continue
            value = ctx.params[param.name]
            given = ctx.get_parameter_source(param.name) not in (source.DEFAULT, source.DEFAULT_MAP, None)
            if param.param_type_name == "argument":
                if value is not None and given:
                    args += [str(v) for v in value] if isinstance(value, (list, tuple)) else [str(value)]
                continue
            flag = max((o for o in param.opts if o.startswith("--")), key=len, default=param.opts[0])
            if given:
                off = [o for o in getattr(param, "secondary_opts", []) if o.startswith("--")]
                if value is False and off:  # --eos/--no-eos given as --no-eos: echo it
                    options[off[0]] = True
                else:
                    options[flag] = value
    options.update(resolved)
    for flag, value in options.items():
        value = getattr(value, "value", value)  # an Enum choice: its name on the command line
        if value is None or value is False:
            continue
        if isinstance(value, (list, tuple)):  # a repeatable option: the flag once per value
            for v in value:
                args += [flag, str(getattr(v, "value", v))]
            continue
        args += [flag] if value is True else [flag, str(value)]
    return " ".join([f"requant {name}"] + [shlex.quote(a) for a in args])


# -- output paths, checked before any work ------------------------------------------------
def _writable_place(path: Path, option: str, make_parents: bool = False) -> None:
    """The directory `path` goes into must exist (requant makes no directory the user did not
    name: a typo in a parent is refused, not created) and be writable. make_parents (convert's
    -o, created atomically and removed again on failure): the nearest existing one above."""
    d = path.parent
    if not make_parents and not (d.exists() or d.is_symlink()):
        raise UsageError(f"{option} {shown(path)}: the directory {shown(d)} does not exist")
    while not (d.exists() or d.is_symlink()) and d != d.parent:
        d = d.parent
    if not d.is_dir():
        raise UsageError(f"{option} {shown(path)}: {shown(d)} is not a directory")
    if not os.access(d, os.W_OK | os.X_OK):
        raise UsageError(f"{option} {shown(path)}: {shown(d)} is not writable")


def check_output_file(path: Optional[Path], option: str) -> None:
    """UsageError naming `option` unless a file can be written at `path` (None: nothing to
    check): absent or a regular file (a link followed only to one: requant.output.report_target),
    writable, in a writable place. Called before any work, so that a bad report path costs
    nothing and writes nothing."""
    if path is None:
        return
    path = Path(path)
    try:
        real = report_target(path)
    except CheckpointError as exc:
        raise UsageError(f"{option} {shown(path)}: {exc.detail}") from None
    if real.exists() and not os.access(real, os.W_OK):
        raise UsageError(f"{option} {shown(path)}: exists and is not writable")
    _writable_place(real, option)


def check_output_dir(
    path: Optional[Path], option: str, files: tuple[str, ...] = (), make_parents: bool = False
) -> None:
    """UsageError naming `option` unless `path` is (or can be made as) a writable directory
    in which each of `files` can be written (check_output_file). Only `path` itself is made,
    its parent must exist (make_parents: convert's -o, see _writable_place)."""
    if path is None:
        return
    path = Path(path)
    if path.exists() or path.is_symlink():
        if not path.is_dir():
            raise UsageError(f"{option} {shown(path)}: exists and is not a directory")
        if not os.access(path, os.W_OK | os.X_OK):
            raise UsageError(f"{option} {shown(path)}: is not writable")
        for name in files:
            check_output_file(path / name, option)
        return
    _writable_place(path, option, make_parents)


def check_not_inside(paths: dict[str, Optional[Path]], dirs: dict[str, Optional[Path]]) -> None:
    """UsageError unless every report path (option: path) lies outside each directory (what: dir):
    a report written into a checkpoint would change the bytes its manifest lists."""
    for option, path in paths.items():
        if path is None:
            continue
        real = Path(path).resolve()  # through any link: where the report would land
        for what, d in dirs.items():
            if d is None:
                continue
            top = Path(d).resolve()
            if top == real or top in real.parents:
                raise UsageError(
                    f"{option} {shown(path)}: inside {what} {shown(d)}; requant never writes reports there"
                )


def check_outputs(outputs: list, inputs: list) -> None:
    """requant.io.output_guard.check_outputs: no output on or inside an input, no two outputs one
    file (UsageError naming the option and the input)."""

    check(outputs, inputs)


def byte_tokens_option(command: Callable) -> Callable:
    """Decorate a command that has a `byte_tokens: ByteTokensOpt` parameter: with --byte-tokens,
    byte ids are used for a checkpoint without tokenizer.json for the duration of that command
    only (requant.tokenizer.byte_ids_allowed; nothing outlives it, in a test process either)."""

    @functools.wraps(command)  # typer reads the parameters through __wrapped__
    def run(*args, **kwargs):
        if not kwargs.get("byte_tokens"):
            return command(*args, **kwargs)

        with byte_ids_allowed():
            return command(*args, **kwargs)

    return run


# -- option types that repeat ------------------------------------------------------------
CkptArg = Annotated[
    Optional[str],
    typer.Argument(
        help="Checkpoint directory or Hub repo id (default: the embedded default).", show_default=False, metavar="CKPT"
    ),
]
DeviceOpt = Annotated[
    Optional[str], typer.Option("--device", help="Torch device (default: cuda if available, else cpu).")
]
ThreadsOpt = Annotated[
    Optional[int],
    typer.Option(
        "--threads",
        help="Torch CPU threads (default: 1 on a CPU device, torch's default otherwise; 0 = torch's default).",
    ),
]
BackendsOpt = Annotated[
    Optional[str],
    typer.Option(
        "--backends",
        help="Two scaled_mm backends 'A,B', or 'reference' (default: cutlass,triton on a GPU, else reference).",
    ),
]
RevisionOpt = Annotated[
    Optional[str], typer.Option("--revision", help="Hub revision when the checkpoint is a repo id.")
]
JsonOpt = Annotated[Optional[Path], typer.Option("--json", help="Write the JSON record here (atomically).")]
ReportOpt = Annotated[
    Optional[Path], typer.Option("--report", help="Write JSON, Markdown and PNG files into this directory.")
]
EngineOpt = Annotated[
    str,
    typer.Option(
        "--engine",
        help="Runtime engine: auto (the fast engine on CUDA, the reference one on CPU), fast, reference, "
        "or portable (the same bits on a GPU and a CPU).",
    ),
]
ByteTokensOpt = Annotated[
    bool,
    typer.Option(
        "--byte-tokens",
        help="Use UTF-8 byte values as token ids when the checkpoint has no tokenizer.json "
        "(needed only for a vocabulary larger than the byte-level 512 ids).",
    ),
]
