"""``Pipeline.wait_until_running``: the pipeline says it runs (and writes its ready file) once
every micro-batch query has ended its first trigger; a stop or the time limit ends the wait
sooner. The real queries' statuses are tested in ``tests/integration/test_pipeline_ingest.py``
and the e2e demo test."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

from pipeline import job
from pipeline.settings import PipelineSettings

FIRST_TRIGGER = "Processing new data"  # Spark's status while a micro-batch runs


@dataclass
class Query:
    """What ``wait_until_running`` reads of a StreamingQuery."""

    name: str
    message: str = FIRST_TRIGGER
    isActive: bool = True  # noqa: N815 (StreamingQuery's name)
    lastProgress: dict[str, Any] | None = None  # noqa: N815 (StreamingQuery's name)

    @property
    def status(self) -> dict[str, Any]:
        return {"message": self.message}

    def ends_first_trigger(self, message: str = "Waiting for next trigger") -> None:
        self.message = message


def pipeline_of(*queries: Query) -> job.Pipeline:
    return job.Pipeline(None, PipelineSettings(), None, queries=list(queries))  # type: ignore[arg-type]


def later(seconds: float, action: Any) -> None:
    threading.Timer(seconds, action).start()


def test_it_returns_once_every_query_has_ended_its_first_trigger() -> None:
    ingest, detection = Query(job.INGEST), Query(job.DETECTION)
    later(0.3, ingest.ends_first_trigger)
    # A restart with nothing new to read: the first trigger ends without a batch.
    later(0.6, lambda: detection.ends_first_trigger("Waiting for data to arrive"))
    started = time.monotonic()
    assert pipeline_of(ingest, detection).wait_until_running(timeout_s=30) == []
    assert 0.6 <= time.monotonic() - started < 5


def test_a_query_that_runs_batch_after_batch_has_ended_its_first_trigger() -> None:
    # Under load the next batch starts as soon as one ends: the status never says "Waiting",
    # and the batch's progress is what tells that the first trigger has ended.
    busy = Query(job.DETECTION)
    later(0.3, lambda: setattr(busy, "lastProgress", {"batchId": 0}))
    started = time.monotonic()
    assert pipeline_of(busy).wait_until_running(timeout_s=30) == []
    assert 0.3 <= time.monotonic() - started < 5


def test_the_fast_path_and_a_stopped_query_are_not_waited_for() -> None:
    # The fast path's Real-time Mode batch lasts a checkpoint interval; a failed query is
    # reported by ``failures``, not waited for.
    failed = Query(job.SILENCE)
    failed.isActive = False
    started = time.monotonic()
    assert pipeline_of(Query(job.FAST_PATH), failed).wait_until_running(timeout_s=30) == []
    assert time.monotonic() - started < 5


def test_a_stop_ends_the_wait_with_the_queries_still_starting() -> None:
    stop = threading.Event()
    later(0.3, stop.set)
    started = time.monotonic()
    waited = pipeline_of(Query(job.INGEST), Query(job.DETECTION, "Waiting for next trigger"))
    assert waited.wait_until_running(stop, timeout_s=30) == [job.INGEST]
    assert time.monotonic() - started < 5


def test_the_time_limit_ends_the_wait_with_the_queries_still_starting() -> None:
    started = time.monotonic()
    assert pipeline_of(Query(job.SILENCE)).wait_until_running(timeout_s=0.5) == [job.SILENCE]
    assert 0.5 <= time.monotonic() - started < 5
