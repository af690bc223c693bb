"""Table maintenance on real Delta tables: small files compacted, replaced files vacuumed after the
retention, the feature changelog trimmed to what a restart reads; no row changes otherwise."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from datetime import datetime, timedelta
from functools import reduce
from pathlib import Path
from typing import Any

import pytest
from delta.tables import DeltaTable
from pyspark.sql import DataFrame

from infra import lake as tables
from pipeline.maintenance import active_files, apply_table_properties, maintain
from pipeline.settings import PipelineSettings

pytestmark = pytest.mark.integration

T0 = datetime(2026, 11, 25, 8, 0)
SCHEMA = "device_id string, window_start timestamp, window_end timestamp, last_event_time " \
         "timestamp, event_count long, batch_id long"  # fmt: skip


def windows(spark: Any, start_min: int, batch: int, devices: int = 3) -> Any:
    start = T0 + timedelta(minutes=start_min)
    rows = [(f"d{d}", start, start + timedelta(minutes=10), start + timedelta(minutes=9), 5, batch)
            for d in range(devices)]  # fmt: skip
    return spark.createDataFrame(rows, SCHEMA)


def unset_table_defaults(spark: Any) -> None:
    """Tables created later in the test session take Delta's defaults again."""
    from pipeline.maintenance import table_properties

    for key in table_properties(PipelineSettings()):
        spark.conf.unset(f"spark.databricks.delta.properties.defaults.{key.removeprefix('delta.')}")


def rows_of(spark: Any, path: str) -> list[tuple[Any, ...]]:
    return sorted(tuple(r) for r in spark.read.format("delta").load(path).collect())


def test_small_files_are_compacted_and_old_ones_vacuumed(spark: Any, lake: str) -> None:
    path = tables.table_path(lake, tables.FEATURES)
    for batch in range(12):  # a streaming table: one small file per micro-batch
        windows(spark, 5 * batch, batch).coalesce(1).write.format("delta").mode("append").save(path)
    before = rows_of(spark, path)
    table = DeltaTable.forPath(spark, path)
    assert active_files(table) == 12

    settings = PipelineSettings(lake_root=lake, vacuum_retention="168 hours")
    (report,) = [r for r in maintain(spark, settings) if r.table == tables.FEATURES]
    assert (report.files_before, report.files_after, report.files_vacuumed) == (12, 1, 0)
    assert rows_of(spark, path) == before
    # Within the retention the replaced files stay: a reader of version 11 still reads them.
    assert spark.read.format("delta").option("versionAsOf", 11).load(path).count() == 36
    assert len(list(Path(path).glob("*.parquet"))) == 13

    # A shorter retention takes effect when the pipeline next starts (it sets it then).
    shorter = settings.model_copy(update={"vacuum_retention": "0 seconds"})
    apply_table_properties(spark, shorter)
    (report,) = [r for r in maintain(spark, shorter) if r.table == tables.FEATURES]
    unset_table_defaults(spark)
    assert (report.files_before, report.files_after, report.files_vacuumed) == (1, 1, 12)
    assert len(list(Path(path).glob("*.parquet"))) == 1
    assert rows_of(spark, path) == before


def test_a_pipeline_start_gives_each_table_the_properties_of_its_settings(
    spark: Any, lake: str, bootstrap: str, make_topic: Callable[..., str], tmp_path: Path
) -> None:
    from pipeline import job
    from pipeline.maintenance import CHECKPOINT_INTERVAL, MAINTAINED, RETENTION
    from pipeline.sinks import CONTRACT_TABLES

    created = [t for t in MAINTAINED if t in CONTRACT_TABLES]  # the rest come with the queries
    assert created

    def properties(table: str) -> tuple[str | None, str | None]:
        path = tables.table_path(lake, table)
        shown = dict(spark.sql(f"SHOW TBLPROPERTIES delta.`{path}`").collect())
        return shown.get(RETENTION), shown.get(CHECKPOINT_INTERVAL)

    settings = PipelineSettings(
        lake_root=lake, checkpoint_root=str(tmp_path / "cp"), bootstrap_servers=bootstrap,
        topic=make_topic(partitions=1), firmware_topic="", alerts_topic="",
        mlflow_tracking_uri=f"sqlite:///{tmp_path / 'none.db'}", vacuum_retention="48 hours",
        delta_checkpoint_interval=5,
    )  # fmt: skip
    try:
        job.prepare(spark, settings)  # a first start creates the tables
        assert {t: properties(t) for t in created} == dict.fromkeys(
            created, ("interval 172800 seconds", "5")
        )
        # A table the queries create later (their first write) takes them from the session, and
        # Delta checkpoints its log in the commit whose version is a multiple of the interval:
        # at 5, version 5 writes one (at Delta's default, 10, none would be there).
        changes = tables.table_path(lake, tables.FEATURE_CHANGES)
        for batch in range(6):  # versions 0 to 5
            windows(spark, 5 * batch, batch).write.format("delta").mode("append").save(changes)
        assert properties(tables.FEATURE_CHANGES) == ("interval 172800 seconds", "5")
        log = Path(changes) / "_delta_log"
        assert [p.name for p in log.glob("*.checkpoint.parquet")] == [
            "00000000000000000005.checkpoint.parquet"
        ]

        later = {"vacuum_retention": "96 hours", "delta_checkpoint_interval": 50}
        job.prepare(spark, settings.model_copy(update=later))
        again = [*created, tables.FEATURE_CHANGES]
        assert {t: properties(t) for t in again} == dict.fromkeys(
            again, ("interval 345600 seconds", "50")
        )
    finally:
        unset_table_defaults(spark)


def test_the_feature_changelog_keeps_what_a_restart_reads(spark: Any, lake: str) -> None:
    path = tables.table_path(lake, tables.FEATURE_CHANGES)
    # Five hours of windows; the newest event is at about 13:04.
    for first in range(0, 60, 10):  # six appends of ten batches each
        batches = [windows(spark, 5 * b, b) for b in range(first, first + 10)]
        reduce(DataFrame.unionByName, batches).write.format("delta").mode("append").save(path)
    settings = PipelineSettings(lake_root=lake, window="10 minutes", watermark="5 minutes")
    (report,) = [r for r in maintain(spark, settings) if r.table == tables.FEATURE_CHANGES]
    # Kept: windows ending after newest - (watermark + 2 windows + 1 hour) = 11:39.
    kept = spark.read.format("delta").load(path)
    ends = [r.window_end for r in kept.select("window_end").distinct().collect()]
    assert min(ends) == datetime(2026, 11, 25, 11, 40)
    assert report.rows_deleted == 3 * 60 - kept.count()
    assert report.files_after == 1


def test_iotfraud_maintain_reports_each_table(lake: str, spark: Any, tmp_path: Path) -> None:
    path = tables.table_path(lake, tables.FEATURES)
    for batch in range(2):
        windows(spark, 0, batch).coalesce(1).write.format("delta").mode("append").save(path)
    done = subprocess.run(
        [sys.executable, "-m", "iotfraud", "maintain"],
        env={**os.environ, "IOT_LAKE_ROOT": lake,
             "IOT_PIPELINE_CHECKPOINT_ROOT": str(tmp_path / "cp"), "IOT_SPARK_MASTER": "local[1]"},
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "features: 2 -> 1 files, 0 old files removed" in done.stdout


def test_maintenance_beside_a_writer_never_fails_its_appends(spark: Any, lake: str) -> None:
    """The running pipeline's situation: appends keep coming while maintenance runs. A table
    property changed by maintenance (a metadata change) made such an append fail and stopped
    the detection query; maintenance now changes no metadata."""
    import threading

    from pipeline.sinks import idempotent_append

    path = tables.table_path(lake, tables.FEATURE_CHANGES)
    windows(spark, 0, 0).write.format("delta").save(path)
    errors: list[BaseException] = []

    def write() -> None:
        try:
            for batch in range(1, 9):
                idempotent_append(windows(spark, 5 * batch, batch), path, "app", batch)
        except BaseException as exc:
            errors.append(exc)

    writer = threading.Thread(target=write)
    writer.start()
    settings = PipelineSettings(lake_root=lake, vacuum_retention="1 hour")
    while writer.is_alive():
        reports = maintain(spark, settings)
        assert not [r.error for r in reports if r.error]
    writer.join()
    assert not errors, errors[0]
    assert spark.read.format("delta").load(path).count() == 9 * 3
