"""The pipeline's once-only warning about queries that keep falling behind (issue 23)."""

from __future__ import annotations

from pipeline.progress import FallingBehind


def batch(batch_id: int, seconds: float) -> dict[str, float]:
    return {"batch_id": batch_id, "batch_duration_ms": seconds * 1000}


def test_a_query_slower_than_its_trigger_three_batches_in_a_row_is_reported_once() -> None:
    behind = FallingBehind(
        {"detection": 1.0, "ingest": 1.0, "firmware": 30.0}, batches=3, log_file="/logs/x.log"
    )

    said = [
        behind.update({"detection": batch(0, 4.0), "ingest": batch(0, 2.0)}),
        behind.update({"detection": batch(0, 4.0), "ingest": batch(0, 2.0)}),  # no new batch
        behind.update({"detection": batch(1, 2.5), "ingest": batch(1, 2.0)}),
        behind.update({"detection": batch(2, 3.0), "ingest": batch(2, 2.0)}),
        behind.update(
            {"detection": batch(3, 5.0), "ingest": batch(3, 2.0), "firmware": batch(0, 40.0)}
        ),
    ]

    assert said == [None, None, None, (
        "falling behind: 3 detection micro-batches in a row took 2.5-4.0 s against a 1 s "
        "trigger, so results come later; more cores (IOT_SPARK_MASTER) or less input help; "
        "Spark's warnings: /logs/x.log (said once)"
    ), None]  # fmt: skip


def test_a_batch_within_the_trigger_starts_the_count_again() -> None:
    behind = FallingBehind({"ingest": 1.0}, batches=2)

    said = [behind.update({"ingest": batch(i, s)}) for i, s in enumerate([3.0, 0.5, 3.0, 0.9])]

    assert said == [None, None, None, None]


def test_queries_without_a_known_trigger_are_left_alone() -> None:
    behind = FallingBehind({"ingest": 1.0}, batches=1)

    assert behind.update({"fast_path": batch(0, 99.0)}) is None
