"""Idempotent Delta appends on the real Delta sink: a replayed batch lands once, an empty one
commits nothing."""

from __future__ import annotations

from delta.tables import DeltaTable
from pyspark.sql import SparkSession

from pipeline.sinks import idempotent_append


def versions(spark: SparkSession, path: str) -> int:
    return DeltaTable.forPath(spark, path).history().count()


def test_a_replayed_append_lands_once_and_an_empty_one_commits_nothing(
    spark: SparkSession, lake: str
) -> None:
    path = f"{lake}/events"
    rows = spark.createDataFrame([("e1", 1), ("e2", 2)], "event_id string, seq long")
    idempotent_append(rows, path, "app-telemetry", 0)
    idempotent_append(rows, path, "app-telemetry", 0)  # batch 0 again, after a crash
    assert sorted(r.event_id for r in spark.read.format("delta").load(path).collect()) == [
        "e1",
        "e2",
    ]
    assert versions(spark, path) == 1

    idempotent_append(rows.limit(0), path, "app-telemetry", 1)
    assert versions(spark, path) == 1, "an empty batch adds no commit"

    idempotent_append(rows.where("seq = 2"), path, "app-telemetry", 2)
    idempotent_append(rows, path, "app-telemetry", 1)  # older than a committed version
    assert spark.read.format("delta").load(path).count() == 3
    assert versions(spark, path) == 2
