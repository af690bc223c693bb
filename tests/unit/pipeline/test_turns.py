"""The live queries nobody waits for within seconds (``job.TAKE_TURNS``) run their batches one at
a time (``pipeline.sinks.Turns``): Spark starts their triggers in the same second. The ingest and
detection never wait for them, and a catch-up runs everything side by side."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from pipeline import job
from pipeline.settings import PipelineSettings
from pipeline.sinks import Turns

Writer = Callable[[Any, int], None]


class Overlaps:
    """Writers that record how many of them run at once."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.running = 0
        self.most = 0

    def writer(self, seconds: float = 0.2) -> Writer:
        def write(batch: Any, batch_id: int) -> None:
            with self.lock:
                self.running += 1
                self.most = max(self.most, self.running)
            time.sleep(seconds)
            with self.lock:
                self.running -= 1

        return write


def at_once(*writers: Writer) -> None:
    """Call each writer with a batch from a thread of its own, all at the same moment."""
    go = threading.Barrier(len(writers), timeout=10)

    def run(write: Writer) -> None:
        go.wait()
        write(None, 7)

    threads = [threading.Thread(target=run, args=(w,)) for w in writers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)


def test_batches_that_take_turns_run_one_at_a_time_and_each_runs() -> None:
    turns, seen = Turns(), Overlaps()
    ran: list[str] = []

    def named(name: str) -> Writer:
        write = seen.writer()

        def run(batch: Any, batch_id: int) -> None:
            write(batch, batch_id)
            ran.append(f"{name} {batch_id}")

        return turns.take(name, run)

    at_once(named("silence"), named("firmware"), named("fast_log"))
    assert seen.most == 1
    assert sorted(ran) == ["fast_log 7", "firmware 7", "silence 7"]


def test_a_failed_batch_gives_up_its_turn() -> None:
    turns = Turns()

    def failing(batch: Any, batch_id: int) -> None:
        raise RuntimeError("DELTA_FAILED_TO_WRITE")

    with pytest.raises(RuntimeError, match="DELTA_FAILED_TO_WRITE"):
        turns.take("silence", failing)(None, 1)
    ran: list[int] = []
    firmware = turns.take("firmware", lambda batch, batch_id: ran.append(batch_id))
    later = threading.Thread(target=firmware, args=(None, 2))
    later.start()
    later.join(timeout=5)
    assert ran == [2]


class Stream:
    """The DataStreamWriter calls ``Pipeline._start`` makes; keeps the foreachBatch writer."""

    def __init__(self, started: dict[str, Writer]) -> None:
        self.started = started
        self.name = ""

    def queryName(self, name: str) -> Stream:  # noqa: N802 (pyspark's name)
        self.name = name
        return self

    def option(self, *args: Any) -> Stream:
        return self

    def trigger(self, **kwargs: Any) -> Stream:
        return self

    def outputMode(self, mode: str) -> Stream:  # noqa: N802 (pyspark's name)
        return self

    def foreachBatch(self, writer: Writer) -> Stream:  # noqa: N802 (pyspark's name)
        self.started[self.name] = writer
        return self

    def start(self) -> object:
        return object()


class Frame:
    def __init__(self, started: dict[str, Writer]) -> None:
        self.writeStream = Stream(started)


def started_writers(
    monkeypatch: pytest.MonkeyPatch, trigger: str, seen: Overlaps
) -> dict[str, Writer]:
    """Each query's foreachBatch as ``Pipeline._start`` hands it to Spark."""
    monkeypatch.setattr(job, "discard_unstarted_batch", lambda spark, path: [])
    pipeline = job.Pipeline(None, PipelineSettings(trigger=trigger), None)  # type: ignore[arg-type]
    started: dict[str, Writer] = {}
    for name in (job.INGEST, job.DETECTION, *job.TAKE_TURNS):
        pipeline._start(Frame(started), name, seen.writer())  # type: ignore[arg-type]
    return started


def test_live_the_slow_queries_take_turns_and_never_hold_up_ingest_or_detection(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert set(job.TAKE_TURNS) == {job.SILENCE, job.FIRMWARE_INGEST, job.FIRMWARE, job.FAST_LOG}
    seen = Overlaps()
    started = started_writers(monkeypatch, "processing", seen)
    at_once(*(started[name] for name in job.TAKE_TURNS))
    assert seen.most == 1
    # Ingest and detection run beside one of them, and beside each other.
    at_once(started[job.INGEST], started[job.DETECTION], started[job.SILENCE])
    assert seen.most == 3


def test_a_catch_up_runs_its_queries_side_by_side(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = Overlaps()
    started = started_writers(monkeypatch, "available_now", seen)
    at_once(started[job.SILENCE], started[job.FIRMWARE_INGEST])
    assert seen.most == 2
