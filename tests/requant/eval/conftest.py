"""Fixtures for the evaluation tests: offline Hub/datasets, small checkpoints under tmp_path."""

from pathlib import Path

import pytest

from requant.checkpoint.synthetic import generate

from ..conftest import MICRO


@pytest.fixture(autouse=True)
def offline(monkeypatch, tmp_path):
    """Every eval test runs as a user without network would, with caches under tmp_path."""
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-datasets-cache"))


@pytest.fixture(autouse=True)
def one_thread():
    """One torch thread, as `requant eval` uses on a CPU: the runtime's tensors are small, and
    on a shared 2-core machine intra-op threads spinning against other work are 3x slower."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture
def micro_with_source(tmp_path) -> tuple[Path, Path]:
    """The micro Qwen3 W8A8 checkpoint (max_position 128: cheap windows) and its bf16 original."""
    ckpt = generate(MICRO, tmp_path / "micro", seed=1, keep_source=tmp_path / "micro_bf16")
    return ckpt, tmp_path / "micro_bf16"
