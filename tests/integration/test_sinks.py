"""Delta writes on the real Delta sink: a replayed append lands once, an empty one commits nothing,
and an append takes new feature columns into an existing table."""

from __future__ import annotations

import json
from types import SimpleNamespace

from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession

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


def test_an_alerts_table_of_an_older_release_takes_the_status_column(
    spark: SparkSession, lake: str
) -> None:
    import pandas as pd

    from infra import contract as c
    from infra import lake as tables
    from pipeline.alerts import alert_frame, as_written, to_spark
    from pipeline.sinks import ensure_tables

    path = tables.table_path(lake, tables.ALERTS)
    older = tuple(column for column in c.ALERTS_COLUMNS if column[0] != "status")
    row = ("old-1",) + (None,) * (len(older) - 1)
    spark.createDataFrame([row], c.spark_ddl(older)).write.format("delta").save(path)
    ensure_tables(spark, lake)
    ensure_tables(spark, lake)  # once added, nothing to do
    table = spark.read.format("delta").load(path)
    assert table.columns == [*c.column_names(older), "status"]
    # The pipeline's next append lands beside the older row, which keeps a null status.
    start = pd.Timestamp("2026-11-26 08:00")
    window = pd.DataFrame([{"device_id": "d1", "window_start": start, "window_end": start,
                            "first_event_time": start, "last_event_time": start}])  # fmt: skip
    rows = as_written(alert_frame(window, "flood", "medium", 0.5, "x"), 0, start)
    alert = to_spark(spark, rows)
    idempotent_append(alert, path, "app-alerts", 0)
    statuses = {r.alert_id == "old-1": r.status for r in table.collect()}
    assert statuses == {True: None, False: c.ALERT_RAISED}


def test_rows_the_driver_writes_land_in_one_file_per_commit(spark: SparkSession, lake: str) -> None:
    """The alerts a batch raises, their final values and the pipeline's metrics: a write of a
    few rows held in the driver adds one file (in ``alerts``, one per alert type it holds), not
    one per core (local[2] here: two)."""
    import pandas as pd

    from infra import lake as tables
    from pipeline.alerts import WrittenAlerts, alert_frame, alert_writes
    from pipeline.metrics import MetricsListener
    from pipeline.sinks import ensure_tables

    def added(path: str) -> list[int]:
        """Files each commit after the table's creation added, oldest first."""
        history = DeltaTable.forPath(spark, path).history().orderBy("version").collect()
        metrics = [h.operationMetrics for h in history if h.operation != "CREATE TABLE"]
        return [int(m.get("numFiles") or m.get("numTargetFilesAdded")) for m in metrics]

    ensure_tables(spark, lake)
    path = tables.table_path(lake, tables.ALERTS)
    start = pd.Timestamp("2026-11-28 08:00")
    windows = pd.DataFrame([{"device_id": f"d{i}", "window_start": start,
                             "window_end": start + pd.Timedelta(minutes=10),
                             "first_event_time": start, "last_event_time": start}
                            for i in range(40)])  # fmt: skip
    raised = alert_frame(windows, "flood", "high", 0.5, "40 events")
    written = WrittenAlerts()
    alert_writes(spark, raised, raised.iloc[:0], path=path, batch_id=0,
                 written=written).write(spark)  # fmt: skip
    final = alert_frame(windows, "flood", "high", 0.9, "90 events")  # the windows closed
    alert_writes(spark, final.iloc[:0], final, path=path, batch_id=1,
                 written=written).write(spark)  # fmt: skip
    table = spark.read.format("delta").load(path).toPandas()
    assert sorted(table["device_id"]) == sorted(windows["device_id"])
    assert set(table["score"]) == {0.9}
    # The append; the MERGE's rewrite, one file per partition it writes (one alert type here).
    assert added(path) == [1, 1]

    listener = MetricsListener(tables.table_path(lake, tables.PIPELINE_METRICS),
                               rocksdb_counts_rows=True)  # fmt: skip
    for batch in range(10):  # as Spark reports a query's progress to the listener
        progress = {"name": "ingest", "runId": "r", "batchId": batch, "numInputRows": 5,
                    "timestamp": "2026-11-28T08:00:00.000Z"}  # fmt: skip
        listener.onQueryProgress(
            SimpleNamespace(progress=SimpleNamespace(json=json.dumps(progress)))
        )
    assert listener.flush(spark) == 10
    assert added(tables.table_path(lake, tables.PIPELINE_METRICS)) == [1]


def test_writes_left_after_a_batch_run_in_order_and_a_query_stop_does_not_cut_them(
    spark: SparkSession, lake: str
) -> None:
    """``AfterBatch`` on a real streaming query: a write starts once ``foreachBatch`` has
    returned, the next one once it is done, and each runs in a job group of its own, so the
    query's stop (which cancels the query's jobs) lets it finish; a failed one fails the next
    wait and start."""
    import threading
    import time

    import pytest

    from pipeline.sinks import AfterBatch

    after = AfterBatch()
    order: list[str] = []
    returned = threading.Event()
    slow_began = threading.Event()

    def slow() -> None:  # a Spark job still running when the query stops
        slow_began.set()
        spark.range(2, numPartitions=2).rdd.map(lambda x: time.sleep(6) or x).collect()
        order.append(f"slow, batch returned first: {returned.is_set()}")

    def then() -> None:
        order.append("then")

    def each(batch: object, batch_id: int) -> None:
        if batch_id == 0:
            after.start(spark, "batch 0", slow)
            returned.set()

    query = (
        spark.readStream.format("rate").option("rowsPerSecond", 1).load()
        .writeStream.foreachBatch(each).option("checkpointLocation", f"{lake}/ckpt").start()
    )  # fmt: skip
    try:
        assert slow_began.wait(120), "the write after batch 0 never began"
        time.sleep(1)  # its job is running
    finally:
        query.stop()  # cancels the query's job group
    after.wait()
    assert order == ["slow, batch returned first: True"]

    def quick() -> None:
        time.sleep(1)
        order.append("quick")

    after.start(spark, "batch 1", quick)
    after.start(spark, "batch 2", then)  # begins once the last one is done
    assert order[-1] == "quick"
    after.wait()
    assert order[-1] == "then"

    def fails() -> None:
        raise ValueError("disk full")

    after.start(spark, "batch 3", fails)
    with pytest.raises(RuntimeError, match="after its micro-batch failed") as caught:
        after.wait()
    assert isinstance(caught.value.__cause__, ValueError)
    with pytest.raises(RuntimeError):  # the next batch stops there
        after.check()
    with pytest.raises(RuntimeError):
        after.start(spark, "batch 4", quick)
    assert order[-1] == "then", "a write after a failed one ran"


def test_rows_the_driver_holds_become_a_frame_without_a_python_worker(
    spark: SparkSession,
) -> None:
    """The metrics' dicts, the ingest's copies and the alerts' pandas rows: each a frame with
    every value as given (a null a null, an aware time its instant) and no Python worker in its
    lineage (a list sent as one starts a task per core each time the frame is read)."""
    from datetime import datetime, timezone

    import pandas as pd

    from pipeline.sinks import driver_frame

    def lineage(frame: DataFrame) -> str:
        return str(frame._jdf.queryExecution().toRdd().toDebugString())

    at = datetime(2026, 12, 7, 8, 0, 1, 250000, tzinfo=timezone.utc)
    schema = "name string, count long, at timestamp, ratio double"
    naive = pd.Timestamp("2026-12-07 08:00:01.25")  # pandas from toPandas: UTC, naive
    given = {
        "dicts": [{"name": "a", "count": 3, "at": at, "ratio": 0.5},
                  {"name": None, "count": None, "at": None}],  # "ratio" left out
        "tuples": [("a", 3, at, 0.5), (None, None, None, None)],
        "pandas": pd.DataFrame({"name": ["a", None], "count": [3, None], "at": [naive, pd.NaT],
                                "ratio": [0.5, None]}),
    }  # fmt: skip
    for kind, data in given.items():
        frame = driver_frame(spark, data, schema)
        assert frame.rdd.getNumPartitions() == 1, kind
        assert "PythonRDD" not in lineage(frame), kind
        assert [tuple(r) for r in frame.orderBy("name").collect()] == [
            (None, None, None, None),
            ("a", 3, datetime(2026, 12, 7, 8, 0, 1, 250000), 0.5),  # collect(): session time, UTC
        ], kind
    empty = driver_frame(spark, [], schema)
    assert "PythonRDD" not in lineage(empty)
    assert empty.count() == 0
    assert empty.dtypes == [("name", "string"), ("count", "bigint"), ("at", "timestamp"),
                            ("ratio", "double")]  # fmt: skip
