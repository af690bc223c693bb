"""A query that failed for a reason that says nothing of the data or the set-up starts again from
its checkpoint, once per RESTART_AFTER_S; any other failure stops the pipeline (``failures``)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from pipeline import job
from pipeline.settings import PipelineSettings

TIMEOUT = "Python worker failed to connect back."


@dataclass
class Query:
    """What ``Pipeline`` reads of a StreamingQuery."""

    name: str
    error: str | None = None

    def exception(self) -> str | None:
        return self.error


def pipeline_with(monkeypatch: pytest.MonkeyPatch, *queries: Query) -> job.Pipeline:
    pipeline = job.Pipeline(None, PipelineSettings(), None, queries=list(queries))  # type: ignore[arg-type]

    def start_silence() -> Query:
        started = Query(job.SILENCE)
        pipeline.queries.append(started)  # type: ignore[arg-type]
        return started

    monkeypatch.setattr(pipeline, "start_silence", start_silence)
    return pipeline


def test_a_silence_query_whose_python_worker_timed_out_starts_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    failed = Query(job.SILENCE, f"[PYTHON_WORKER] {TIMEOUT}\nat org.apache.spark...")
    pipeline = pipeline_with(monkeypatch, Query(job.INGEST), failed)
    assert pipeline.restart_transient(now=100.0) == [job.SILENCE]
    assert [(q.name, q.exception()) for q in pipeline.queries] == [
        (job.INGEST, None),
        (job.SILENCE, None),
    ]
    assert pipeline.failures() == []


def test_the_same_failure_again_soon_after_stops_the_pipeline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pipeline = pipeline_with(monkeypatch, Query(job.SILENCE, TIMEOUT))
    pipeline.restart_transient(now=100.0)
    pipeline.queries[0].error = TIMEOUT  # type: ignore[attr-defined]
    assert pipeline.restart_transient(now=100.0 + job.RESTART_AFTER_S - 1) == []
    assert pipeline.failures() == [f"{job.SILENCE}: {TIMEOUT}"]
    # Later than that, it is transient again.
    assert pipeline.restart_transient(now=100.0 + job.RESTART_AFTER_S) == [job.SILENCE]


def test_other_failures_and_other_queries_are_not_restarted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pipeline = pipeline_with(
        monkeypatch, Query(job.SILENCE, "DELTA_CONCURRENT_APPEND"), Query(job.DETECTION, TIMEOUT)
    )
    assert pipeline.restart_transient(now=100.0) == []
    assert len(pipeline.failures()) == 2
