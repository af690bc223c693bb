"""Silent devices on the real parts: readings through Kafka, the silence query in Spark
(transformWithStateInPandas, event-time timers), the registry as a Delta stream, alerts written
to Delta (new ones appended, changes MERGEd) and published to the alerts topic."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from infra import contract as c
from infra import lake as tables
from pipeline import job
from pipeline.alerts import alert_id_of
from pipeline.publish import PATH, read_alert_message
from pipeline.settings import PipelineSettings
from tests.pipeline_helpers import (
    encoded,
    make_event,
    produce,
    query_stage_pools,
    table_alerts,
    topic_messages,
    write_registry,
)

pytestmark = pytest.mark.integration

EVERY_S = 20


def settings_for(lake: str, tmp_path: Path, bootstrap: str, topic: str) -> PipelineSettings:
    return PipelineSettings(
        lake_root=lake, checkpoint_root=str(tmp_path / "cp"), bootstrap_servers=bootstrap,
        topic=topic, alerts_topic=f"{topic}.alerts", firmware_topic="",
        mlflow_tracking_uri=f"sqlite:///{tmp_path / 'none.db'}", fast_path=False,
        # The meters' own interval as the prior: thresholds are exactly 5 x 20 s = 100 s.
        silence_prior_interval=f"{EVERY_S} seconds", silence_k=5.0, silence_watermark="10 seconds",
        late_burst_min=10, silence_trigger_interval="1 second",
    )  # fmt: skip


def test_silences_end_on_the_same_alert_and_a_store_and_forward_burst_raises_late_burst(
    spark: Any, bootstrap: str, make_topic: Callable[..., str], lake: str, tmp_path: Path
) -> None:
    # One partition: the order readings are read in is the order they were sent.
    topic = make_topic(partitions=1)
    start = datetime.now(timezone.utc).replace(microsecond=0) - timedelta(hours=2)
    write_registry(lake, ["steady", "quiet", "gone", "gateway", "skewed"])

    def at(second: int) -> datetime:
        return start + timedelta(seconds=second)

    def readings(device: str, seconds: range, ahead_s: int = 0) -> list[tuple[int, dict[str, Any]]]:
        return [(s, make_event(device, s // EVERY_S, at(s + ahead_s))) for s in seconds]

    # Event-time plan (seconds after start), one reading every 20 s:
    #   steady   0..1780
    #   quiet    0..580, silent, again 1200..1780
    #   gone     0..580, never again (retired in the registry later)
    #   gateway  0..580, offline; its readings 600..1080 sent at once when the stream is at 1080
    #   rogue    0..300, not in the registry: not followed
    #   skewed   0..1780, its clock 3 hours ahead from 600 s: quarantined (clock_ahead), alive
    early = sorted(
        readings("steady", range(0, 1100, EVERY_S)) + readings("quiet", range(0, 600, EVERY_S))
        + readings("gone", range(0, 600, EVERY_S)) + readings("gateway", range(0, 600, EVERY_S))
        + readings("rogue", range(0, 320, EVERY_S)) + readings("skewed", range(0, 600, EVERY_S))
        + readings("skewed", range(600, 1100, EVERY_S), ahead_s=3 * 3600),
        key=lambda r: r[0],
    )  # fmt: skip
    buffered = readings("gateway", range(600, 1100, EVERY_S))
    late = sorted(
        readings("steady", range(1100, 1800, EVERY_S))
        + readings("quiet", range(1200, 1800, EVERY_S))
        + readings("gateway", range(1100, 1800, EVERY_S))
        + readings("skewed", range(1100, 1800, EVERY_S), ahead_s=3 * 3600),
        key=lambda r: r[0],
    )  # fmt: skip

    settings = settings_for(lake, tmp_path, bootstrap, topic)
    pipeline = job.prepare(spark, settings)
    pipeline.start_silence()
    alerts_path = tables.table_path(lake, tables.ALERTS)

    def alerts() -> dict[tuple[str, str], dict[str, Any]]:
        if not Path(alerts_path, "_delta_log").exists():
            return {}
        return {(r["device_id"], r["alert_type"]): r for r in table_alerts(lake).values()}

    def wait_for(what: str, ready: Callable[[dict[tuple[str, str], dict[str, Any]]], bool]) -> None:
        deadline = time.monotonic() + 180
        while not ready(alerts()):
            for running in pipeline.queries:
                assert running.exception() is None, running.exception()
            assert time.monotonic() < deadline, f"{what}: {alerts()}"
            time.sleep(1)

    try:
        produce(bootstrap, topic, encoded(e for _, e in early))
        wait_for("three silences", lambda a: len(a) >= 3)
        time.sleep(5)  # whatever else would come, comes now
        found = alerts()
        assert set(found) == {("quiet", "device_silent"), ("gone", "device_silent"),
                              ("gateway", "device_silent")}  # fmt: skip
        for device in ("quiet", "gone", "gateway"):
            row = found[(device, "device_silent")]
            assert row["window_start"] == at(580) and row["first_event_time"] == at(580)
            assert row["window_end"] is None  # silent now
            # Detected when the partition's time (its newest event time less 10 s) passed
            # 580 + 100 s: at steady's reading of 700 s, whatever the micro-batches.
            assert row["last_event_time"] == at(690)
            assert row["alert_id"] == alert_id_of(device, "device_silent", at(580))
            assert (row["severity"], row["status"]) == ("high", c.ALERT_RAISED)
            assert row["reasons"] == [
                f"no reading since {at(580):%Y-%m-%d %H:%M:%S} UTC for over 1 min 40 s (it "
                "reports about every 20 s)"
            ]

        # "gone" is retired: its silence ends there, and it is forgotten.
        _retire(lake, "gone")
        wait_for("retirement", lambda a: a[("gone", "device_silent")]["window_end"] is not None)
        gone = alerts()[("gone", "device_silent")]
        assert gone["window_end"] == at(1070)
        assert gone["reasons"][-1] == f"retired in the registry at {at(1070):%Y-%m-%d %H:%M:%S} UTC"

        produce(bootstrap, topic, encoded(e for _, e in buffered + late))
        wait_for("quiet back, the burst", lambda a: ("gateway", "late_burst") in a
                 and a[("quiet", "device_silent")]["window_end"] is not None)  # fmt: skip
        time.sleep(5)
        found = alerts()
        assert set(found) == {("quiet", "device_silent"), ("gone", "device_silent"),
                              ("gateway", "device_silent"), ("gateway", "late_burst")}  # fmt: skip
        quiet = found[("quiet", "device_silent")]
        assert (quiet["window_start"], quiet["window_end"]) == (at(580), at(1200))
        assert (
            quiet["reasons"][-1]
            == f"reported again at {at(1200):%Y-%m-%d %H:%M:%S} UTC, after 10 min 20 s"
        )
        # The gateway was heard from again when its first buffered reading arrived, behind the
        # watermark (1070 s): the silence ends there.
        assert found[("gateway", "device_silent")]["window_end"] == at(1070)
        burst = found[("gateway", "late_burst")]
        # Its buffered readings 600..1060 s were behind the watermark; 1080 s was not.
        assert (burst["window_start"], burst["first_event_time"]) == (at(600), at(600))
        assert (burst["window_end"], burst["last_event_time"]) == (at(1060), at(1060))
        assert burst["reasons"] == [
            f"24 readings arrived late, the oldest 7 min 50 s behind the stream (event times "
            f"{at(600):%Y-%m-%d %H:%M:%S} UTC to {at(1060):%Y-%m-%d %H:%M:%S} UTC): readings sent "
            "in a burst after the device was offline"
        ]
        assert burst["severity"] == "medium"

        # Every change was published first: the topic's latest message per alert is the row.
        latest = {}
        for message in topic_messages(bootstrap, settings.alerts_topic):
            record = read_alert_message(message.value())
            record.pop(PATH)
            latest[record["alert_id"]] = record
        assert latest == table_alerts(lake)
    finally:
        pipeline.stop()

    # Its batches and its alert writes ran in the default pool, none in detection's: it writes
    # partitions of alerts detection does not, so detection's new alerts never wait for them.
    pools = query_stage_pools(spark, pipeline.queries[0])
    assert set(pools) == {"default"} and pools["default"] > 5, pools


def test_the_silence_query_takes_every_message_its_interval_brings_in_one_batch(
    spark: Any, bootstrap: str, make_topic: Callable[..., str], lake: str, tmp_path: Path
) -> None:
    # Triggered every 10 s against the ingest's 1 s, it may take ten of the ingest's bounds of
    # 40 a batch. With the ingest's bound it read 40 of the 300 messages waiting at each trigger
    # and fell behind for good: at 5,000 events/s, 300,000 a minute against 250,000 a batch.
    topic = make_topic(partitions=1)
    write_registry(lake, ["meter"])
    start = datetime.now(timezone.utc).replace(microsecond=0) - timedelta(hours=1)
    readings = (make_event("meter", i, start + timedelta(seconds=i)) for i in range(300))
    produce(bootstrap, topic, encoded(readings))
    settings = settings_for(lake, tmp_path, bootstrap, topic).model_copy(
        update={"max_offsets_per_trigger": 40, "ingest_trigger_interval": "1 second",
                "silence_trigger_interval": "10 seconds"}
    )  # fmt: skip
    pipeline = job.prepare(spark, settings)
    query = pipeline.start_silence()

    def from_kafka() -> list[int]:
        return [source["numInputRows"] for progress in query.recentProgress
                for source in progress["sources"] if source["description"].startswith("Kafka")
                and source["numInputRows"]]  # fmt: skip

    try:
        deadline = time.monotonic() + 120
        while not from_kafka():
            assert query.exception() is None, query.exception()
            assert time.monotonic() < deadline, query.recentProgress
            time.sleep(0.5)
    finally:
        pipeline.stop()
    assert from_kafka()[0] == 300


def _retire(lake: str, device_id: str) -> None:
    """Mark ``device_id`` retired in the registry, as a registry update does (a MERGE)."""
    from deltalake import DeltaTable

    DeltaTable(tables.table_path(lake, tables.DEVICES)).update(
        predicate=f"device_id = '{device_id}'", updates={"status": "'retired'"}
    )


def test_the_writer_appends_new_alerts_and_writes_nothing_twice_after_a_restart(
    spark: Any, lake: str
) -> None:
    """The silence query's writer on a real Delta table, fed its alert changes directly: a new
    alert is appended (no MERGE), a change to one updates its row, and a batch replayed after a
    crash, a new checkpoint reading the topic again, or a silence raised again with the same
    start leave one row per alert."""
    import pandas as pd
    from delta.tables import DeltaTable

    from pipeline.silence import CHANGE_COLUMNS, CHANGES_SCHEMA, KNOWN_FOR, SilenceBatchWriter
    from pipeline.sinks import ensure_tables

    ensure_tables(spark, lake)
    path = tables.table_path(lake, tables.ALERTS)
    t0 = int(datetime(2026, 12, 1, 8, tzinfo=timezone.utc).timestamp() * 1000)
    minute = 60_000

    def silent(device: str, start_m: int, seen_m: int, end_m: int | None = None) -> dict[str, Any]:
        return {"device_id": device, "alert_type": "device_silent", "start_ms": t0 + start_m *
                minute, "first_ms": t0 + start_m * minute, "detected_ms": t0 + seen_m * minute,
                "end_ms": None if end_m is None else t0 + end_m * minute, "readings": 0,
                "interval_ms": 20_000, "threshold_ms": 100_000,
                "ended_by": None if end_m is None else "reading"}  # fmt: skip

    def burst(readings: int) -> dict[str, Any]:
        return {"device_id": "gateway", "alert_type": "late_burst", "start_ms": t0,
                "first_ms": t0, "detected_ms": t0 + readings * 20_000,
                "end_ms": t0 + readings * 20_000, "readings": readings,
                "behind_ms": 5 * minute, "interval_ms": 20_000}  # fmt: skip

    def batch(*changes: dict[str, Any]) -> Any:
        rows = [tuple(change.get(name) for name in CHANGE_COLUMNS) for change in changes]
        return spark.createDataFrame(rows, CHANGES_SCHEMA)

    def table() -> list[dict[str, Any]]:
        rows = spark.read.format("delta").load(path).orderBy("alert_id").collect()
        return [r.asDict() for r in rows]

    def operations() -> list[str]:
        history = DeltaTable.forPath(spark, path).history().orderBy("version").collect()
        return [h.operation for h in history if h.operation != "CREATE TABLE"]

    batches = [
        batch(silent("quiet", 0, 2), silent("gone", 0, 2), burst(10)),
        batch(silent("quiet", 0, 2, end_m=9), silent("gone", 0, 2, end_m=10), burst(12)),
        # quiet ended on a record that moved no reading time: silent again, the same start.
        batch(silent("quiet", 0, 12)),
    ]
    writer = SilenceBatchWriter(path)
    writer(batches[0], 0)
    assert operations() == ["WRITE"], "new alerts are appended"
    first = table()
    writer(batches[0], 0)  # replayed in the same run: nothing written
    assert table() == first and len(operations()) == 1
    writer(batches[1], 1)
    writer(batches[2], 2)
    assert operations() == ["WRITE", "MERGE", "MERGE"]
    after = table()
    by_device = {(r["device_id"], r["alert_type"]): r for r in after}
    assert len(after) == 3
    assert by_device[("quiet", "device_silent")]["window_end"] is None  # silent again
    assert by_device[("gone", "device_silent")]["window_end"] == datetime(2026, 12, 1, 8, 10)
    assert "12 readings arrived late" in by_device[("gateway", "late_burst")]["reasons"][0]

    # A new process (a new checkpoint reads the topic again): the same changes append nothing,
    # and leave every row as it was.
    again = SilenceBatchWriter(path)
    for batch_id, changes in enumerate(batches):
        again(changes, batch_id)
    assert table() == after and operations().count("WRITE") == 1

    # Hours later, gone's ended silence is forgotten; raised again with the same start, it goes
    # through the MERGE, which finds its row: still one row per alert.
    later = KNOWN_FOR // pd.Timedelta(minutes=1) + 60
    again(batch(silent("late", later - 5, later)), 3)
    assert again.written is not None
    assert alert_id_of("gone", "device_silent", datetime(2026, 12, 1, 8)) not in again.written.rows
    again(batch(silent("gone", 0, later + 1)), 4)
    final = {(r["device_id"], r["alert_type"]): r for r in table()}
    assert len(final) == len(table()) == 4
    assert final[("gone", "device_silent")]["window_end"] is None
    assert operations()[-2:] == ["WRITE", "MERGE"]
