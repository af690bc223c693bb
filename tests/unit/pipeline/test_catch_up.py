"""A catch-up run (``run_available_now``) runs the queries of a stage side by side: when one fails,
or cannot start, the others are stopped before the error is raised, so that no query keeps
running in the session after a failed catch-up."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest

from pipeline import job
from pipeline.settings import PipelineSettings


@dataclass
class Query:
    """What ``_run_stage`` uses of a StreamingQuery; a failed one raises when awaited."""

    name: str
    error: Exception | None = None
    isActive: bool = True  # noqa: N815 (StreamingQuery's name)
    stopped: bool = False

    def awaitTermination(self) -> None:  # noqa: N802
        if self.error is not None:
            self.isActive = False
            raise self.error

    def stop(self) -> None:
        self.isActive, self.stopped = False, True


def starting(pipeline: job.Pipeline, query: Query) -> Callable[[], Query]:
    def start() -> Query:
        pipeline.queries.append(query)  # type: ignore[arg-type]
        return query

    return start


def test_a_failed_query_stops_the_others_and_its_error_is_raised() -> None:
    pipeline = job.Pipeline(None, PipelineSettings(), None)  # type: ignore[arg-type]
    failed, other = Query(job.INGEST, RuntimeError("bad offsets")), Query(job.SILENCE)
    with pytest.raises(RuntimeError, match="bad offsets"):
        job._run_stage(pipeline, [starting(pipeline, failed), starting(pipeline, other)])  # type: ignore[list-item]
    assert other.stopped and not other.isActive


def test_a_start_that_fails_stops_the_queries_started_before_it() -> None:
    pipeline = job.Pipeline(None, PipelineSettings(), None)  # type: ignore[arg-type]
    started = Query(job.INGEST)

    def cannot_start() -> Query:
        raise ValueError("no such topic")

    with pytest.raises(ValueError, match="no such topic"):
        job._run_stage(pipeline, [starting(pipeline, started), cannot_start])  # type: ignore[list-item]
    assert started.stopped


def test_queries_that_end_leave_nothing_to_stop() -> None:
    pipeline = job.Pipeline(None, PipelineSettings(), None)  # type: ignore[arg-type]
    queries = [Query(job.INGEST), Query(job.SILENCE)]
    job._run_stage(pipeline, [starting(pipeline, q) for q in queries])  # type: ignore[misc]
    assert [q.stopped for q in queries] == [False, False]
