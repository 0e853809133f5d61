"""Child processes started as a terminal starts a foreground command: SIGINT at its default.

A non-interactive shell starts a background job (`cmd &`, as some CI runners do) with SIGINT
ignored, Python keeps an inherited ignored SIGINT, and so does requant (an ignored signal stays
ignored: tests/requant/test_cli.py). Tests that send SIGINT set the terminal's condition
explicitly, so they test requant and not the runner that started pytest.
"""

import signal


def sigint_default() -> None:
    """preexec_fn: SIGINT back to its default disposition in the child, before exec."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
