"""Table maintenance on real Delta tables: small files compacted, replaced files vacuumed after the
retention, the feature changelog trimmed to what a restart reads; no row changes otherwise."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from delta.tables import DeltaTable

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


def sliding(spark: Any, batch: int, devices: int = 3, minute: int | None = None) -> Any:
    """A detection batch's changelog rows: every device's two sliding windows (10 minutes,
    sliding by 5), ending 5 and 10 minutes after ``minute`` (10 x batch unless given), the
    newest event 4 minutes after it."""
    at = T0 + timedelta(minutes=10 * batch if minute is None else minute)
    rows = [
        (f"d{d}", at - timedelta(minutes=m), at + timedelta(minutes=10 - m),
         at + timedelta(minutes=4), 5, batch)
        for d in range(devices) for m in (5, 0)
    ]  # fmt: skip
    return spark.createDataFrame(rows, SCHEMA)


def changelog_trim(spark: Any, lake: str, settings: PipelineSettings) -> Any:
    (report,) = [r for r in maintain(spark, settings) if r.table == tables.FEATURE_CHANGES]
    return report


def batches_in(spark: Any, path: str) -> list[int]:
    kept = spark.read.format("delta").load(path).select("batch_id").distinct().collect()
    return sorted(r.batch_id for r in kept)


def test_the_feature_changelog_keeps_what_a_restart_reads(spark: Any, lake: str) -> None:
    path = tables.table_path(lake, tables.FEATURE_CHANGES)
    features = tables.table_path(lake, tables.FEATURES)
    # Five hours of batches, ten minutes apart, each its own append (as detection writes them).
    # The newest event is 12:54.
    for batch in range(30):
        sliding(spark, batch).coalesce(1).write.format("delta").mode("append").save(path)
    settings = PipelineSettings(lake_root=lake, window="10 minutes", watermark="2 minutes")

    # No window in features yet: a restart reads every batch.
    report = changelog_trim(spark, lake, settings)
    assert (report.rows_deleted, report.files_after) == (0, 30)
    assert batches_in(spark, path) == list(range(30))

    # Features written up to 11:00 (the appends after the later batches had not run): a restart
    # closes the windows ending after 11:00 again, from here. Kept: the batches with a window
    # ending after 11:00 less 5 minutes' slack.
    windows(spark, 170, 0).write.format("delta").mode("append").save(features)
    report = changelog_trim(spark, lake, settings)
    assert batches_in(spark, path) == list(range(17, 30))
    assert report.rows_deleted == 17 * 6

    # Features up to date (12:50): kept, the batches with a window starting at newest -
    # (watermark + 2 windows) - slack = 12:27 or later, the recent windows a restart reads.
    # Batch 27's windows start at 12:25 and 12:30: it stays whole, though one of them started
    # before the cut.
    windows(spark, 280, 1).write.format("delta").mode("append").save(features)
    report = changelog_trim(spark, lake, settings)
    kept = spark.read.format("delta").load(path)
    assert batches_in(spark, path) == list(range(27, 30))
    assert kept.count() == 3 * 6
    assert min(r.window_start for r in kept.select("window_start").collect()) == datetime(
        2026, 11, 25, 12, 25
    )
    assert report.rows_deleted == 10 * 6
    # Whole batches went: files removed, none rewritten; and none compacted.
    deleted = DeltaTable.forPath(spark, path).history().where("operation = 'DELETE'").collect()
    assert [int(h.operationMetrics["numCopiedRows"]) for h in deleted] == [0, 0]
    assert report.files_after == len(kept.inputFiles()) == report.files_before - 10


def test_a_restart_loads_the_same_state_from_the_trimmed_changelog(
    spark: Any, lake: str, tmp_path: Path
) -> None:
    """The trim deletes what ``load_state`` would not read: the state a restart loads is the
    same before and after it, with ``features`` up to date and with ``features`` behind (a
    crash before the append of the last closed windows)."""
    import json

    import pandas as pd

    from pipeline import job
    from pipeline.detection import WindowState, load_state
    from pipeline.settings import seconds
    from tests.pipeline_helpers import device_series, write_registry

    settings = PipelineSettings(
        lake_root=lake, checkpoint_root=str(tmp_path / "cp"), landing_dir=str(tmp_path / "in"),
        source="files", max_files_per_trigger=1, window="10 minutes", slide="5 minutes",
        watermark="10 minutes", dedup_horizon="15 minutes", firmware_topic="", fast_path=False,
        mlflow_tracking_uri=f"sqlite:///{tmp_path / 'none.db'}",
    )  # fmt: skip
    devices = ["dev-1", "dev-2"]
    write_registry(lake, devices)
    landing = Path(settings.landing_dir)
    landing.mkdir()
    start = datetime.now(timezone.utc).replace(microsecond=0) - timedelta(hours=3)
    series = {d: device_series(d, start, 240) for d in devices}  # two hours, every 30 s
    for part in range(12):  # a detection batch per 10 minutes of readings
        events = [e for d in devices for e in series[d][20 * part : 20 * (part + 1)]]
        (landing / f"part-{part:02}.jsonl").write_text("\n".join(map(json.dumps, events)) + "\n")
    job.run_available_now(spark, settings)

    def state() -> WindowState:
        return load_state(spark, lake, spec=settings.profile_spec(), min_events=1,
                          watermark_s=seconds(settings.watermark))  # fmt: skip

    def assert_same(found: WindowState, expected: WindowState) -> None:
        keys = ["device_id", "window_start"]
        pd.testing.assert_frame_equal(found.open.sort_index(), expected.open.sort_index())
        pd.testing.assert_frame_equal(
            found.history.sort_values(keys).reset_index(drop=True),
            expected.history.sort_values(keys).reset_index(drop=True),
        )
        assert found.max_event_time == expected.max_event_time

    changes = tables.table_path(lake, tables.FEATURE_CHANGES)
    features = DeltaTable.forPath(spark, tables.table_path(lake, tables.FEATURES))
    all_batches = batches_in(spark, changes)
    assert len(all_batches) >= 8  # a batch per file, mostly
    caught_up = state()
    assert len(caught_up.open) and len(caught_up.history)

    # Features behind by an hour: the windows closed since are read from the changelog.
    version = features.history(1).first().version
    top = caught_up.max_event_time
    features.delete(f"window_end > '{top - pd.Timedelta(minutes=70):%Y-%m-%d %H:%M:%S}'")
    behind = state()
    report = changelog_trim(spark, lake, settings)
    assert report.rows_deleted > 0
    behind_kept = batches_in(spark, changes)
    assert_same(state(), behind)

    # Features up to date again: more batches go, the state is the one loaded at first.
    features.restoreToVersion(version)
    report = changelog_trim(spark, lake, settings)
    assert report.rows_deleted > 0
    assert len(batches_in(spark, changes)) < len(behind_kept)
    assert_same(state(), caught_up)


def test_the_changelog_trim_beside_detection_appending_holds_its_batches_back(
    spark: Any, lake: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Delta checks a DELETE as serializable: an append committed while it runs fails it, and
    the live pipeline's detection appends to the changelog every few seconds. The trim commits
    while detection's batches are held back (the lock ``hold_changes`` takes), so it never
    conflicts (a conflict would be retried, and logged)."""
    import threading

    path = tables.table_path(lake, tables.FEATURE_CHANGES)
    # 200 batches a minute apart, a file each (as detection writes them), in one write.
    old = [sliding(spark, batch, minute=batch) for batch in range(200)]
    rows = old[0].sparkSession.createDataFrame(
        [row for frame in old for row in frame.collect()], SCHEMA
    )
    rows.orderBy("batch_id").coalesce(1).write.format("delta").option("maxRecordsPerFile", 6).save(
        path
    )
    features = tables.table_path(lake, tables.FEATURES)
    windows(spark, 190, 0).write.format("delta").save(features)  # closed windows up to 11:20
    held, done, appended, errors = threading.Lock(), threading.Event(), [], []
    numbers = iter(range(200, 10**6))

    def detection() -> None:
        try:
            while not done.is_set():
                batch = next(numbers)
                # Windows as recent as batch 199's: the trim's cut does not move.
                rows = sliding(spark, batch, minute=199)
                with held:
                    rows.write.format("delta").mode("append").save(path)
                appended.append(batch)
        except BaseException as exc:
            errors.append(exc)

    # Two appending threads: an append commits every fraction of a second.
    writers = [threading.Thread(target=detection) for _ in range(2)]
    for writer in writers:
        writer.start()
    while len(appended) < 2:  # appending before and throughout the round
        done.wait(0.1)
    settings = PipelineSettings(lake_root=lake, window="10 minutes", watermark="5 minutes")
    caplog.set_level("INFO", logger="pipeline.sinks")
    try:
        reports = maintain(spark, settings, hold_changes=lambda: held)
    finally:
        done.set()
        for writer in writers:
            writer.join(60)
    assert not errors, errors[0]
    (report,) = [r for r in reports if r.table == tables.FEATURE_CHANGES]
    assert report.error is None
    assert "conflicted with a concurrent commit" not in caplog.text
    # Newest event 11:23; the batches whose windows all started before 10:53 (less the
    # watermark, two windows and the slack) went: 0-172.
    assert report.rows_deleted == 173 * 6
    assert batches_in(spark, path) == list(range(173, 200)) + sorted(appended)


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
