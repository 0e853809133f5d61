"""requant/cli.py: an interrupt at any point of `requant`'s start-up exits 130 with the one
`error: interrupted` line, never a traceback or death by the signal (-2, -15).

Deterministic, not a race: the process sends the signal to itself at a chosen point of its own
start-up (an import hook fires on the named module's first import; "get_command" is typer building
the command, after the module is loaded and before RequantGroup.main), then runs what the
`requant` script runs (from requant.cli import app; sys.exit(app()))."""

import subprocess
import sys

import pytest

from tests.interrupts import sigint_default

SCRIPT = """
import importlib.abc, os, signal, sys
sig, at = getattr(signal, sys.argv[1]), sys.argv[2]

class Hook(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == at:
            sys.meta_path.remove(self)
            os.kill(os.getpid(), sig)
        return None

if at != "get_command":
    sys.meta_path.insert(0, Hook())
sys.argv = ["requant", "generate", "--prompt", "a", "--max-new-tokens", "1"]
from requant.cli import app
if at == "get_command":
    import typer.main
    build = typer.main.get_command
    typer.main.get_command = lambda a: (os.kill(os.getpid(), sig), build(a))[1]
sys.exit(app())
"""

# the imports while requant.cli loads (typer first, a command module late), typer building the
# command, and torch: imported inside the command's body (the command's own interrupt line)
POINTS = ["typer", "requant.commands.generate", "get_command", "torch"]


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("at", POINTS)
def test_an_interrupt_during_start_up_exits_130_with_one_line(sig, at, tmp_path):
    res = subprocess.run(
        [sys.executable, "-c", SCRIPT, sig, at],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
        preexec_fn=sigint_default,
    )
    assert res.returncode == 130, (res.returncode, res.stderr)
    assert "Traceback" not in res.stderr and res.stdout == "", res.stderr
    (line,) = res.stderr.splitlines()
    assert line.startswith("error: interrupted"), line


def test_importing_the_app_leaves_the_callers_handlers_and_an_ignored_signal_ignored():
    code = (
        "import signal, sys\n"
        "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
        "mine = lambda s, f: None\n"
        "signal.signal(signal.SIGTERM, mine)\n"
        "import requant.cli\n"
        "assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN and signal.getsignal(signal.SIGTERM) is mine\n"
        "print('kept')\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and res.stdout == "kept\n", res.stderr
