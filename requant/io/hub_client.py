"""Bounded waits on the Hugging Face Hub: every request huggingface_hub makes for requant has a
connect and a read timeout, and its retries stop within a bounded total time.

    REQUANT_HUB_TIMEOUT   seconds (default 30): the connect timeout (at most 10 s) and the read
                          and write timeout (the longest silence within one request) of every
                          Hub request. A request retried by huggingface_hub (a timeout, a 5xx) is
                          not started again once 2x this time has passed since its first attempt.

A Hub that accepts a connection and never answers therefore ends a command within about
3 x REQUANT_HUB_TIMEOUT + 25 s (115 s at the default; huggingface_hub waits 1+2+4+8+8 s between its retries), in exit 2 with one line naming the URL
that did not answer. A long download is not cut: the read timeout is per silence, not per file.

How: huggingface_hub 1.x/2.x send every request through one shared httpx client made by a factory
(huggingface_hub.set_client_factory); ours is the library's default client with a timeout and one
more request hook (the retry deadline). Calls that pass their own timeout (the library's etag and
download timeouts, 10 s by default) keep it.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time

from requant.errors import UsageError

ENV = "REQUANT_HUB_TIMEOUT"
DEFAULT_S = 30.0
MAX_CONNECT_S = 10.0

_installed: float | None = None
_first: dict[tuple[str, str], float] = {}
_lock = threading.Lock()


def timeout_s() -> float:
    """REQUANT_HUB_TIMEOUT as seconds (UsageError naming the variable for a bad value)."""
    raw = os.environ.get(ENV, "").strip()
    if not raw:
        return DEFAULT_S
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not (0 < value <= 86400):
        raise UsageError(f"{ENV}={raw!r}: expected seconds, a number above 0 (default {DEFAULT_S:g})")
    return value


def _httpx():
    try:
        import httpx2 as httpx  # huggingface_hub 2.x
    except ImportError:
        import httpx
    return httpx


def _retry_deadline(request) -> None:
    """A request hook: a request (method and URL) first sent more than 2 x the timeout ago, and not
    answered since (_answered), is not sent again: huggingface_hub's retries end there."""
    t = _installed or DEFAULT_S
    # huggingface_hub passes timeout=None explicitly on some calls (repo_info: "no timeout"): never unbounded
    limits = dict(request.extensions.get("timeout") or {})
    for k in ("connect", "read", "write", "pool"):
        if limits.get(k) is None:
            limits[k] = min(t, MAX_CONNECT_S) if k in ("connect", "pool") else t
    request.extensions["timeout"] = limits
    key = (request.method, str(request.url))
    now = time.monotonic()
    with _lock:
        first = _first.setdefault(key, now)
    if now - first > 2 * t:
        raise _httpx().ReadTimeout(f"no answer within {2 * t:g} s of retries", request=request)


def _answered(response) -> None:
    """A response hook: an answer that is not retried (below 500, not 429) ends its request's retry clock."""
    if response.status_code < 500 and response.status_code != 429:
        with _lock:
            _first.pop((response.request.method, str(response.request.url)), None)


def install() -> float:
    """Point huggingface_hub at a client with requant's timeouts (idempotent); the timeout in seconds."""
    global _installed
    t = timeout_s()
    if _installed == t:
        return t
    from huggingface_hub.utils import _http

    httpx = _httpx()
    hooks = [h for h in [getattr(_http, "hf_request_event_hook", None), _retry_deadline] if h is not None]

    def factory():
        return httpx.Client(
            event_hooks={"request": hooks, "response": [_answered]},
            follow_redirects=True,
            timeout=httpx.Timeout(t, connect=min(t, MAX_CONNECT_S)),
        )

    _http.set_client_factory(factory)
    _installed = t
    return t


_in_transfer = 0  # > 0 while the main thread waits on a Hub call (transfer())


@contextlib.contextmanager
def transfer():
    """Around a Hub call that may wait on threads blocked in a socket read (huggingface_hub joins its
    download threads): an interrupt inside it may end the process once cleanup had its grace
    (requant.commands._guards._signals_honoured)."""
    global _in_transfer
    _in_transfer += 1
    try:
        yield
    finally:
        _in_transfer -= 1


def in_transfer() -> bool:
    return _in_transfer > 0


def timed_out(exc: BaseException) -> str | None:
    """'URL did not answer within N s (REQUANT_HUB_TIMEOUT)' when exc (or its cause) is a Hub timeout."""
    httpx = _httpx()
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, httpx.TimeoutException):
            try:
                url = str(exc.request.url)
            except (RuntimeError, AttributeError):
                url = "the Hub"
            return f"{url} did not answer within {_installed or timeout_s():g} s ({ENV}; its default is {DEFAULT_S:g})"
        exc = exc.__cause__ or exc.__context__
    return None
