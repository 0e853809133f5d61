"""A command run in-process (typer's CliRunner, or Python) hands torch's thread count back as its
caller had it (commands/_guards.py): `--threads`, 1 by default on a CPU device, is the command's own.
Reference: torch.get_num_threads() before and after."""

import torch

from tests.requant.commands.cli import invoke


def test_a_command_keeps_its_thread_count_to_itself(monkeypatch):
    seen = []
    real = torch.set_num_threads
    monkeypatch.setattr(torch, "set_num_threads", lambda n: (seen.append(n), real(n)))
    before = torch.get_num_threads()
    try:
        real(2 if before != 2 else 3)  # not the command's 1, so that its setting is a change
        want = torch.get_num_threads()
        res = invoke("conform", "--backend", "reference-triton-order", "--device", "cpu")
        assert res.exit_code == 0, res.output
        assert seen[0] == 1  # the command did run on one thread (the CPU default of set_threads)
        assert torch.get_num_threads() == want
    finally:
        real(before)
