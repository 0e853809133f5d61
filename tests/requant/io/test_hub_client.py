"""requant.io.hub_client against the loopback Hub made to hang and to drop: a Hub that never
answers ends the command in exit 2 with one line naming the URL, within the documented bound
(3 x REQUANT_HUB_TIMEOUT + 25 s); SIGTERM during a stalled download exits 130 promptly.
Deterministic: the server holds the stalled request until the test ends; the test waits for the
request to arrive (the server's log) before it signals."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from requant.io import hub_client
from tests.conftest import TOKEN
from tests.requant.commands.cli import invoke, refused

REPO = "requant-test/tiny-pow2"
T = 1.0  # REQUANT_HUB_TIMEOUT for these tests
BOUND = 3 * T + 25


@pytest.fixture
def fast_timeout(monkeypatch):
    monkeypatch.setenv(hub_client.ENV, str(T))
    yield
    monkeypatch.delenv(hub_client.ENV)
    hub_client.install()  # back to the default for later tests in this process


def _hub_repo(hub, ckpt):
    hub.create("org/micro")
    hub.commit("org/micro", "main", {p.name: p.read_bytes() for p in ckpt.iterdir() if p.is_file()}, "upload")


@pytest.mark.parametrize("kind", ["create", "commit"])
def test_push_to_a_hub_that_never_answers_ends_in_exit_2_naming_the_url(hub, pow2_copy, fast_timeout, kind):
    hub.stall("POST", kind)
    t0 = time.monotonic()
    res = invoke("push", pow2_copy, REPO)
    took = time.monotonic() - t0
    path = "/api/repos/create" if kind == "create" else f"/api/models/{REPO}/commit/main"
    line = refused(res, f"{hub.url}{path} did not answer within 1 s (REQUANT_HUB_TIMEOUT")
    assert TOKEN not in line and took < BOUND + 15  # the bound, and the push's own hashing on a shared CPU


def test_a_dropped_connection_is_one_line_naming_the_hub(hub, pow2_copy, fast_timeout):
    for _ in range(8):  # more than huggingface_hub's retries
        hub.drop("POST", "commit")
    res = invoke("push", pow2_copy, REPO)
    refused(res, "push failed", hub.url)


def test_fetching_from_a_hub_that_never_answers_names_the_url(hub, micro, fast_timeout, monkeypatch):
    _hub_repo(hub, micro)
    for _ in range(8):
        hub.stall("GET", "info")
    t0 = time.monotonic()
    res = invoke("inspect", "org/micro")
    assert time.monotonic() - t0 < BOUND + 5
    refused(res, "org/micro", f"{hub.url}/api/models/org/micro", "did not answer within 1 s")


def test_a_bad_timeout_value_names_the_variable(monkeypatch):
    monkeypatch.setenv(hub_client.ENV, "soon")
    with pytest.raises(Exception, match="REQUANT_HUB_TIMEOUT='soon': expected seconds"):
        hub_client.timeout_s()


def test_sigterm_during_a_stalled_download_exits_130_within_2_s(hub, micro, tmp_path):
    _hub_repo(hub, micro)
    hub.stall("GET", "resolve")
    env = {**os.environ, "REQUANT_HUB_TIMEOUT": "300", "HF_HUB_DOWNLOAD_TIMEOUT": "300", "HF_HUB_ETAG_TIMEOUT": "300"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "requant.cli", "convert", "org/micro", "-o", str(tmp_path / "out"), "--arm", "nearest"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not any(m == "GET" and "/resolve/" in p for m, p, _ in list(hub.requests)):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
        time.sleep(0.2)  # the request is being waited on
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert took < 2.5, took  # GRACE_S 1.5 s, with room for a shared CPU
    assert "interrupted" in err and "Traceback" not in err
