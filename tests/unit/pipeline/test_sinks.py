"""Retrying a Delta write that lost to a concurrent commit (two queries MERGE into alerts)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from pipeline.sinks import retry_on_conflict

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
