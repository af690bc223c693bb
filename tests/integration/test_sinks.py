"""Delta writes on the real Delta sink: a replayed append lands once, an empty one commits nothing,
and an append takes new feature columns into an existing table."""

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


def test_an_append_adds_new_feature_columns_to_an_existing_table(
    spark: SparkSession, lake: str
) -> None:
    path = f"{lake}/features"
    old = spark.createDataFrame([("d1", 1, 10.0)], "device_id string, w long, power_mean double")
    idempotent_append(old, path, "app-features", 0, merge_schema=True)
    # An upgrade adds a feature: the next batch carries a column the table does not have.
    new = spark.createDataFrame(
        [("d2", 1, 20.0, -0.1)], "device_id string, w long, power_mean double, power_slope double"
    )
    idempotent_append(new, path, "app-features", 1, merge_schema=True)
    idempotent_append(new, path, "app-features", 1, merge_schema=True)  # replayed
    rows = {r.device_id: r for r in spark.read.format("delta").load(path).collect()}
    assert (rows["d1"].power_mean, rows["d1"].power_slope) == (10.0, None)
    assert (rows["d2"].power_mean, rows["d2"].power_slope) == (20.0, -0.1)
    assert len(rows) == 2
