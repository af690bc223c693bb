"""The pipeline's once-only warning about queries that keep falling behind (issue 23): a Kafka
backlog that keeps growing, not micro-batches longer than their trigger."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

from pipeline.metrics import BACKLOG, Backlog
from pipeline.progress import FallingBehind

START = datetime(2026, 12, 4, 23, 0, tzinfo=timezone.utc)


def query(
    took: Callable[[int], float],
    rate: Callable[[int], float] = lambda _batch: 500.0,
    most: int | None = None,
) -> Iterator[dict[str, Any]]:
    """The ``MetricsListener.latest`` rows of a query that takes the messages waiting when it
    plans a batch (at most ``most``, maxOffsetsPerTrigger): a batch of n messages takes
    ``took(n)`` seconds, while ``rate(k)`` messages a second arrive during batch k."""
    at, latest, start = START, 0, 0
    for batch_id in range(60):
        waiting = latest - start
        yield {"query_name": "ingest", "batch_id": batch_id, "timestamp": at,
               BACKLOG: Backlog(latest, waiting)}  # fmt: skip
        taken = waiting if most is None else min(waiting, most)
        seconds = took(taken)
        start += taken
        latest += round(rate(batch_id) * seconds)
        at += timedelta(seconds=seconds)


def said(behind: FallingBehind, rows: Iterator[dict[str, Any]], name: str = "ingest") -> list[str]:
    return [w for row in rows if (w := behind.observe({**row, "query_name": name})) is not None]


def test_batches_longer_than_their_trigger_that_keep_up_are_not_falling_behind() -> None:
    # What two cores give: a 1 s trigger, batches of 3-7 s, some longer as windows close.
    durations = [3.0, 4.0, 3.5, 5.0, 4.2, 6.9, 4.8, 3.1, 3.3, 3.9, 4.4, 5.5, 7.0, 3.0]

    spell = iter(durations * 5)

    def took(_messages: int) -> float:
        return next(spell)

    assert said(FallingBehind(), query(took)) == []


def falling(messages: int) -> float:
    """2 s a batch plus 450 messages a second, against 500 arriving: each batch finds more."""
    return 2.0 + max(messages, 1000) / 450


def warned_at(behind: FallingBehind, rows: list[dict[str, Any]]) -> list[int]:
    return [row["batch_id"] for row in rows if behind.observe(row) is not None]


def test_a_backlog_that_keeps_growing_is_reported_once() -> None:
    behind = FallingBehind(log_file="/logs/x.log")

    warnings = said(behind, query(falling), "detection")

    assert warnings == [
        "falling behind: the detection query's Kafka backlog grew 8 micro-batches in a row, "
        "from 4.2 s to 33.6 s of input (16,813 messages), so results come later and later; more "
        "cores (IOT_SPARK_MASTER) or less input help; Spark's warnings: /logs/x.log (said once)"
    ]


def test_a_backlog_that_grows_beyond_what_a_batch_may_take_is_reported() -> None:
    # Batches capped at 2,000 messages take 6.4 s, while 3,200 arrive: the batches stay as
    # long, and the backlog grows by 1,200 messages each time.
    rows = list(query(falling, most=2000))

    assert {round(falling(2000), 1)} == {round(falling(min(r[BACKLOG].waiting, 2000)), 1)
                                         for r in rows[3:]}  # fmt: skip
    assert warned_at(FallingBehind(), rows) == [12]
    # Told the bound, the warning names it: more cores would not help.
    assert said(FallingBehind(bounds={"ingest": 2000}), iter(rows)) == [
        "falling behind: the ingest query's Kafka backlog grew 11 micro-batches in a row, from "
        "4.2 s to 31.1 s of input (15,553 messages), so results come later and later; its batches "
        "take at most 2,000 messages, fewer than arrive while one runs: raise "
        "IOT_PIPELINE_MAX_OFFSETS_PER_TRIGGER (said once)"
    ]
    # A bound its batches do not reach is not the cause.
    uncapped = said(FallingBehind(bounds={"ingest": 1_000_000}), query(falling))
    assert len(uncapped) == 1 and "more cores" in uncapped[0] and "at most" not in uncapped[0]


def test_a_fleet_that_sends_more_and_more_is_not_falling_behind() -> None:
    # Twice the messages each batch, each batch as long: more waiting, the same seconds of it.
    rows = list(query(lambda _messages: 4.0, rate=lambda batch: 50.0 * 2**batch))[:20]

    assert rows[-1][BACKLOG].waiting > 100 * rows[2][BACKLOG].waiting
    assert said(FallingBehind(batches=2), iter(rows)) == []


def test_the_same_batch_seen_twice_counts_once() -> None:
    rows = list(query(falling))

    assert warned_at(FallingBehind(), rows) == [9]
    assert warned_at(FallingBehind(), [row for row in rows for _twice in (1, 2)]) == [9]


def test_a_backlog_that_gets_no_input_starts_the_count_again() -> None:
    rows = list(query(falling))
    last = rows[5]
    # A second after batch 5, none arrived (the fleet paused): 9,999 waiting count for nothing.
    paused = {**last, "batch_id": 6, "timestamp": last["timestamp"] + timedelta(seconds=1),
              BACKLOG: Backlog(last[BACKLOG].latest, 9999)}  # fmt: skip
    no_kafka = {**last, "batch_id": 7, BACKLOG: None}  # a Delta source: ignored
    after = [{**row, "batch_id": row["batch_id"] + 2} for row in rows[6:]]

    # Without the pause it warns at batch 9 (above); after it, the count starts again.
    assert warned_at(FallingBehind(), [*rows[:6], paused, no_kafka, *after]) == [13]
