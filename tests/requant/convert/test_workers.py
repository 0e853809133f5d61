"""requant.convert._workers: the reported failure is the first failing unit in unit order, whatever
the timing. The timings are forced with events (a later unit fails first; earlier units
keep running and fail or finish afterwards), so each test decides one interleaving
deterministically. Reference: the units' own records of what they saw and did."""

import threading

import pytest

from requant.convert._workers import Aborted, run_units

WAIT = 20  # seconds; only reached if the code under test deadlocks


class UnitError(Exception):
    pass


def test_results_in_unit_order_and_on_done_per_unit():
    done = []
    out = run_units(lambda u, stop: u * 10, list(range(7)), workers=3, on_done=done.append)
    assert out == [0, 10, 20, 30, 40, 50, 60]
    assert sorted(done) == list(range(7))


@pytest.mark.parametrize("workers", [4, 6])
def test_a_later_failure_does_not_stop_earlier_units(workers):
    """Unit 3 fails first. Units 1 and 2 (before it) are not told to stop and finish;
    unit 0 then fails on its own: that is the error raised (not unit 3's). Units after the
    first failure stop (Aborted) or never start."""
    failed3 = threading.Event()
    finished = {1: threading.Event(), 2: threading.Event()}
    seen = {}

    def unit(i, stop):
        if i == 3:
            try:
                raise UnitError("unit 3")
            finally:
                failed3.set()
        if i in (0, 1, 2):
            assert failed3.wait(WAIT)
            seen[i] = stop()
            if i == 0:
                for e in finished.values():
                    assert e.wait(WAIT)
                raise UnitError("unit 0")
            finished[i].set()
            return i
        if stop():
            raise Aborted()
        return i

    with pytest.raises(UnitError, match="unit 0"):
        run_units(unit, list(range(8)), workers=workers)
    assert seen == {0: False, 1: False, 2: False}


def test_only_the_first_failure_is_reported_and_only_after_every_worker_stopped():
    """Unit 1 fails at once, unit 0 fails later: unit 0's error, raised only after the
    slow unit 0 has returned (no worker still running)."""
    running = set()
    lock = threading.Lock()
    go = threading.Event()

    def unit(i, stop):
        with lock:
            running.add(i)
        try:
            if i == 1:
                go.set()
                raise UnitError("unit 1")
            if i == 0:
                assert go.wait(WAIT)
                raise UnitError("unit 0")
            return i
        finally:
            with lock:
                running.discard(i)

    with pytest.raises(UnitError) as ei:
        run_units(unit, [0, 1, 2, 3], workers=4)
    assert str(ei.value) == "unit 0" and running == set()


def test_an_interrupt_stops_every_unit():
    """A KeyboardInterrupt in unit 2: units before it are told to stop too."""
    interrupted = threading.Event()
    seen = {}

    def unit(i, stop):
        if i == 2:
            try:
                raise KeyboardInterrupt
            finally:
                interrupted.set()
        if i in (0, 1):
            assert interrupted.wait(WAIT)
            seen[i] = stop()
            if seen[i]:
                raise Aborted()
        return i

    with pytest.raises(KeyboardInterrupt):
        run_units(unit, [0, 1, 2, 3], workers=4)
    assert seen == {0: True, 1: True}


def test_a_unit_told_to_stop_is_not_reported():
    """Aborted units never mask the real failure, even when they finish first."""

    def unit(i, stop):
        if i == 0:
            raise UnitError("unit 0")
        raise Aborted()

    with pytest.raises(UnitError, match="unit 0"):
        run_units(unit, [0, 1, 2], workers=1)
