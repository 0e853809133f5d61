"""Shared fixtures: one tiny CPU training run and its packaging, written under tmp dirs."""

from __future__ import annotations

from pathlib import Path

import pytest

from training import train_default

# The CPU test run: the tiny model, 3 steps of 2 x 64-token windows, 4 validation windows.
TINY_ARGS = [
    "--device",
    "cpu",
    "--tiny",
    "--seed",
    "0",
    "--max-steps",
    "3",
    "--seq-len",
    "64",
    "--batch-size",
    "2",
    "--val-windows",
    "4",
    "--eval-every",
    "2",
    "--log-every",
    "1",
    "--warmup-steps",
    "2",
]


def train_tiny(out: Path, *extra: str) -> Path:
    rc = train_default.main(["--out", str(out), *TINY_ARGS, *extra])
    assert rc == 0
    return out


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory) -> Path:
    """train_default.py's output for the tiny CPU run (session-wide, never modified by tests)."""
    return train_tiny(tmp_path_factory.mktemp("tiny_run") / "out")


@pytest.fixture(scope="session")
def tiny_package(tiny_run, tmp_path_factory) -> Path:
    """package_default.py's output (default/ and default-bf16/) for the tiny run."""
    from training import package_default

    out = tmp_path_factory.mktemp("tiny_package") / "data"
    assert package_default.main([str(tiny_run), "--out-dir", str(out)]) == 0
    return out


def tree_bytes(root: Path) -> dict[str, bytes]:
    """Every file under root (relative path -> bytes)."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}
