"""A bounded thread pool for units of work in file order, with a deterministic failure.

The converter cuts its work into units (segments of shards, requant.convert._streaming) and runs
them in threads: numpy, hashing and file I/O release the GIL. What a user is told when
something fails must not depend on which thread got there first, so:

  * Units are numbered in file order. When unit i fails, only the units AFTER it are told
    to stop (they see it within one piece of work and raise Aborted); units before it
    run on, to completion or to their own failure. Every unit before the first failing one
    therefore runs exactly as in a sequential run, and the first failing unit in file
    order is the same whatever the number of workers or the timing.
  * The error raised is that unit's, alone, and only once every worker has stopped (the
    output files a unit writes must outlive it; the caller then cleans up).
  * An interrupt (Ctrl-C in the main thread, or a KeyboardInterrupt/SystemExit inside a
    unit) stops every unit, and is raised again once the workers are gone.
"""

from __future__ import annotations

import concurrent.futures as cf
import threading
from typing import Callable, Sequence, TypeVar

T = TypeVar("T")
U = TypeVar("U")


class Aborted(Exception):
    """Raised inside a unit that was told to stop; never reported to the user."""


class StopPlan:
    """Who must stop: the units after the first failed one (in unit order), or everyone
    after an interrupt. Read by the workers between pieces of work."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.first_failed: int | None = None
        self.interrupted = False

    def failed(self, i: int) -> None:
        with self._lock:
            if self.first_failed is None or i < self.first_failed:
                self.first_failed = i

    def interrupt(self) -> None:
        self.interrupted = True

    def should_stop(self, i: int) -> bool:
        first = self.first_failed
        return self.interrupted or (first is not None and i > first)

    @property
    def any(self) -> bool:
        return self.interrupted or self.first_failed is not None


def shutdown(pool: cf.ThreadPoolExecutor, plan: StopPlan | None = None) -> None:
    """Wait until every worker of `pool` has stopped, even through a Ctrl-C, which stops
    every unit (workers see it within one piece) and is raised again once the workers are
    gone."""
    interrupted = None
    while True:
        try:
            pool.shutdown(wait=True, cancel_futures=True)
            break
        except KeyboardInterrupt as exc:
            if plan is not None:
                plan.interrupt()
            interrupted = exc
    if interrupted is not None:
        raise interrupted


def run_units(
    fn: Callable[[U, Callable[[], bool]], T],
    units: Sequence[U],
    workers: int,
    on_done: Callable[[int], None] | None = None,
    name: str = "requant-convert",
) -> list[T]:
    """Run fn(unit, should_stop) for every unit in a pool of `workers` threads; return the
    results in unit order. fn polls should_stop() between pieces of work and raises
    Aborted when it says so. on_done(i) runs in the calling thread as unit i succeeds,
    unless something has failed. On failure: see the module docstring."""
    plan = StopPlan()

    def run(i: int, unit: U) -> T:
        def should_stop() -> bool:
            return plan.should_stop(i)

        if should_stop():
            raise Aborted()
        try:
            return fn(unit, should_stop)
        except Aborted:
            raise
        except Exception:
            plan.failed(i)
            raise
        except BaseException:  # KeyboardInterrupt, SystemExit: everybody stops
            plan.interrupt()
            raise

    pool = cf.ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name)
    futures: list[cf.Future] = []
    try:
        futures = [pool.submit(run, i, u) for i, u in enumerate(units)]
        index = {f: i for i, f in enumerate(futures)}
        pending = set(futures)
        while pending:  # a timeout, so that a Ctrl-C reaches this thread promptly
            done, pending = cf.wait(pending, timeout=0.2)
            for f in sorted(done, key=index.__getitem__):
                if on_done is not None and not plan.any and f.exception() is None:
                    on_done(index[f])
    except BaseException:
        plan.interrupt()
        raise
    finally:
        shutdown(pool, plan)
    failures = [(i, f.exception()) for i, f in enumerate(futures) if not f.cancelled() and f.exception() is not None]
    real = [(i, e) for i, e in failures if not isinstance(e, Aborted)]
    if real:
        raise real[0][1]  # the first failing unit in unit (file) order
    if failures:  # only stopped units: cannot happen without a failure above; never hide it
        raise failures[0][1]
    return [f.result() for f in futures]
