"""Fixtures shared across test folders: the loopback Hub, and an audited power-of-two checkpoint."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

import pytest

from tests.hubserver import FakeHub

# A token-shaped marker: it must reach the Hub (as a Bearer header) and appear nowhere else.
TOKEN = "hf_requantTESTtokenMARKER0123456789"


def point_hub_library_at(monkeypatch, env: dict[str, str]) -> None:
    """Set the environment a user would set (HF_ENDPOINT, HF_HOME, HF_TOKEN; HF_HUB_OFFLINE
    unset) and make the already-imported huggingface_hub see it: a fresh copy of
    huggingface_hub.constants is executed under that environment and every constant that
    differs is patched into the loaded module (undone at the end of the test)."""
    import huggingface_hub.constants as constants

    for k in (
        "HF_HUB_OFFLINE",
        "TRANSFORMERS_OFFLINE",
        "HF_HUB_CACHE",
        "HUGGINGFACE_HUB_CACHE",
        "HF_TOKEN_PATH",
        "HF_STORED_TOKENS_PATH",
        "HF_XET_CACHE",
        "HF_ASSETS_CACHE",
        "HUGGING_FACE_HUB_TOKEN",
        "HF_TOKEN",
        "HF_ENDPOINT",
    ):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    spec = importlib.util.find_spec("huggingface_hub.constants")
    fresh = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fresh)
    changed = {
        name: (getattr(constants, name, None), getattr(fresh, name))
        for name in dir(fresh)
        if name.isupper() and getattr(fresh, name) != getattr(constants, name, object())
    }
    for name, (_, value) in changed.items():
        monkeypatch.setattr(constants, name, value)
    # huggingface_hub < 1.0 also copies some constants into other modules at import
    # (file_download's HUGGINGFACE_CO_URL_TEMPLATE): patch those copies as well
    for modname, mod in list(sys.modules.items()):
        if mod is None or mod is constants or not modname.startswith("huggingface_hub."):
            continue
        for name, (old, value) in changed.items():
            if name in vars(mod) and vars(mod)[name] == old:
                monkeypatch.setattr(mod, name, value)


@pytest.fixture(autouse=True)
def _torch_threads_restored():
    """Each test ends with torch's intra-op thread count as it began, so that no test's speed
    depends on the tests before it. (The GPU suite in reversed order once ran the exhaustive exp
    test's CPU side on one thread after an in-process `replay --device cpu`; commands now hand the
    count back themselves, tests/requant/commands/test_threads.py, and this guards every test.)"""
    import torch

    n = torch.get_num_threads()
    yield
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """A FakeHub on 127.0.0.1 (free port) that wants TOKEN for writes; huggingface_hub pointed
    at it with HF_HOME under tmp_path (nothing touches ~/.cache); stopped at the end."""
    h = FakeHub(token=TOKEN).start()
    point_hub_library_at(monkeypatch, {"HF_ENDPOINT": h.url, "HF_HOME": str(tmp_path / "hf_home"), "HF_TOKEN": TOKEN})
    try:
        yield h
    finally:
        h.stop()


@pytest.fixture(scope="session")
def audited_pow2(tmp_path_factory) -> Path:
    """The embedded default converted with --arm nearest, with a real audit of exactly these
    bytes (reference pair, 1 prompt) beside it as requant-audit.json. Read-only: copy it."""
    import torch

    from requant import DEFAULT_CHECKPOINT
    from requant.audit.report import write_json
    from requant.audit.suite import run_audit
    from requant.backends import REFERENCE_PAIR
    from requant.checkpoint import open_checkpoint
    from requant.convert import convert

    out = tmp_path_factory.mktemp("audited") / "pow2"
    convert(DEFAULT_CHECKPOINT, out, "nearest")
    n = torch.get_num_threads()
    torch.set_num_threads(1)  # the audit's tensors are small; see tests/audit/conftest.py
    try:
        result = run_audit(open_checkpoint(out), REFERENCE_PAIR, 1, "cpu", keep_cells=False)
    finally:
        torch.set_num_threads(n)
    result["command"] = f"requant audit {out} --backends reference --prompts 1"
    write_json(result, out / "requant-audit.json")
    return out


@pytest.fixture
def pow2_copy(tmp_path, audited_pow2) -> Path:
    """A private copy of audited_pow2."""
    dst = tmp_path / "pow2"
    shutil.copytree(audited_pow2, dst)
    return dst
