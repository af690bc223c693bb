"""Retrying a Delta write that lost to a concurrent commit (two queries MERGE into alerts), and
writes to different tables run side by side."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from pipeline.sinks import retry_on_conflict, side_by_side

CONFLICT = (
    "An error occurred while calling o412.execute.\n: io.delta.exceptions."
    "ConcurrentAppendException: [DELTA_CONCURRENT_APPEND.WITHOUT_HINT] Files were added to the "
    "root of the table by a concurrent update. Please try the operation again."
)


def flaky(failures: list[Exception]) -> tuple[list[int], Callable[[], None]]:
    calls: list[int] = []

    def write() -> None:
        calls.append(1)
        if failures:
            raise failures.pop(0)

    return calls, write


def test_a_conflicting_write_is_run_again_until_it_commits() -> None:
    calls, write = flaky([RuntimeError(CONFLICT), RuntimeError(CONFLICT)])
    retry_on_conflict(write, "alerts MERGE")
    assert len(calls) == 3


def test_other_errors_are_not_retried() -> None:
    calls, write = flaky([RuntimeError("[DELTA_MERGE_UNRESOLVED_EXPRESSION] cannot resolve")])
    with pytest.raises(RuntimeError, match="UNRESOLVED"):
        retry_on_conflict(write, "alerts MERGE")
    assert len(calls) == 1


def test_conflicts_that_persist_end_in_the_error() -> None:
    calls, write = flaky([RuntimeError(CONFLICT)] * 5)
    with pytest.raises(RuntimeError, match="DELTA_CONCURRENT_APPEND"):
        retry_on_conflict(write, "alerts MERGE", attempts=3)
    assert len(calls) == 3


def test_side_by_side_runs_the_writes_at_the_same_time() -> None:
    both_started = threading.Barrier(2, timeout=10)
    done: list[str] = []

    def write(name: str) -> Callable[[], None]:
        def run() -> None:
            both_started.wait()  # breaks (and fails the test) unless the other write runs too
            done.append(name)

        return run

    side_by_side(write("telemetry"), write("quarantine"))
    assert sorted(done) == ["quarantine", "telemetry"]


def test_side_by_side_raises_a_failure_only_after_every_write_finished() -> None:
    finished = threading.Event()

    def slow() -> None:
        time.sleep(0.3)
        finished.set()

    def failing() -> None:
        raise RuntimeError("DELTA_FAILED_TO_WRITE")

    with pytest.raises(RuntimeError, match="DELTA_FAILED_TO_WRITE"):
        side_by_side(failing, slow)
    assert finished.is_set()


def test_side_by_side_says_how_long_each_write_took() -> None:
    def slow() -> None:
        time.sleep(0.3)

    took = side_by_side(lambda: None, slow)
    assert len(took) == 2
    assert took[1] >= 0.3 > took[0]
