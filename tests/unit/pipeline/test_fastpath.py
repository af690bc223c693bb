"""The fast path's per-event alerts: the windowed path's ids, types and texts, from the same
parse; its messages read back as the ``fast_alerts`` table rows."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from infra import contract as c
from pipeline.alerts import alert_id_of
from pipeline.fastpath import fast_alerts, fast_log_rows, fast_messages, realtime_master
from pipeline.features import feature_events, features_from_events, quarantine_feature_events
from pipeline.publish import EVENT_FIELDS, alert_message, read_alert_message
from pipeline.rules import rule_alerts
from pipeline.transforms import events_and_flagged, parse_events, quarantined, valid_events
from tests.pipeline_helpers import device_series
from tests.unit.pipeline.test_rules import events_df, registry_df
from tests.unit.pipeline.test_transforms import RAW_DDL

START = datetime(2026, 11, 22, 8, 0, tzinfo=timezone.utc)
SENT = START + timedelta(hours=1)  # the messages' Kafka timestamp: no clock is ahead


def kafka_rows(events: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return [(e["device_id"], json.dumps(e).encode(), "telemetry", i % 2, 100 + i, SENT)
            for i, e in enumerate(events)]  # fmt: skip


def fleet() -> list[dict[str, Any]]:
    """A clean device, a rogue one, one on a firmware the registry does not expect, one that
    sends no firmware; 8 minutes each, so two windows close and one stays open."""
    return [
        *device_series("clean", START, 16, every_s=30),
        *device_series("rogue", START, 16, every_s=30),
        *device_series("firmware", START, 16, every_s=30, firmware="6.6.6"),
        *[{k: v for k, v in e.items() if k != "firmware"}
          for e in device_series("stuck", START, 16, every_s=30)],
    ]  # fmt: skip


FLEET = fleet()  # once: event ids are random


@pytest.fixture(scope="module")
def fast(spark: Any) -> Any:
    raw = spark.createDataFrame(kafka_rows(FLEET), RAW_DDL)
    events = events_and_flagged(parse_events(raw))
    return fast_alerts(events, registry_df(spark), window_s=600, slide_s=300).toPandas()


def test_each_offending_event_raises_its_alert_in_every_window_holding_it(fast: Any) -> None:
    assert list(fast.columns) == c.column_names(c.FAST_MESSAGE_COLUMNS)
    assert c.column_names(c.FAST_MESSAGE_COLUMNS)[-5:] == ["path", *EVENT_FIELDS]
    counts = fast.groupby(["device_id", "alert_type"]).size().to_dict()
    # 16 events, each in 2 sliding windows; nothing for the clean device or a missing firmware.
    assert counts == {("firmware", "firmware_mismatch"): 32, ("rogue", "rogue_device"): 32}
    first = fast[fast["kafka_offset"] == fast["kafka_offset"].min()]
    assert sorted(first["window_start"]) == [pd_time(START - timedelta(minutes=5)), pd_time(START)]
    assert (first["window_end"] - first["window_start"] == timedelta(minutes=10)).all()
    assert set(fast["path"]) == {"fast"} and set(fast["status"]) == {"raised"}
    assert fast["batch_id"].isna().all() and fast["detected_at"].notna().all()
    assert (fast["first_event_time"] == fast["last_event_time"]).all()


def test_ids_severities_and_reasons_are_the_windowed_paths(spark: Any, fast: Any) -> None:
    windows = features_from_events(
        events_df(spark, FLEET), registry_df(spark), window="10 minutes", slide="5 minutes"
    ).toPandas()
    windowed = rule_alerts(windows)
    windowed = windowed[windowed["alert_type"].isin(["rogue_device", "firmware_mismatch"])]
    assert len(windowed) == 6  # 3 windows x 2 devices
    by_id = fast.drop_duplicates("alert_id").set_index("alert_id")
    counts = windows.set_index(["device_id", "window_start"])["firmware_mismatch_count"]
    assert set(windowed["alert_id"]) == set(by_id.index)
    for row in windowed.itertuples():
        assert by_id.loc[row.alert_id, "severity"] == row.severity
        assert row.alert_id == alert_id_of(row.device_id, row.alert_type, row.window_start)
        fast_reasons = list(by_id.loc[row.alert_id, "reasons"])
        if row.alert_type == "firmware_mismatch":
            # An event names the firmware it reports; a window counts its readings of another.
            assert fast_reasons == ["firmware 6.6.6, registry expects 1.0.0"]
            count = counts[(row.device_id, row.window_start)]
            assert list(row.reasons) == [f"{count} readings of a firmware other than the "
                                         "registry's 1.0.0"]  # fmt: skip
        else:
            assert fast_reasons == list(row.reasons)


def test_messages_read_back_as_alerts_and_as_fast_alerts_rows(spark: Any, fast: Any) -> None:
    raw = spark.createDataFrame(kafka_rows(FLEET), RAW_DDL)
    alerts = fast_alerts(events_and_flagged(parse_events(raw)), registry_df(spark), window_s=600,
                         slide_s=300)  # fmt: skip
    contract = spark.createDataFrame(
        [], ", ".join(f"`{name}` {kind}" for name, kind in c.FAST_MESSAGE_COLUMNS)
    )
    assert [(f.name, f.dataType) for f in alerts.schema] == [
        (f.name, f.dataType) for f in contract.schema
    ]
    messages = fast_messages(alerts).collect()
    assert {m.key for m in messages} == {"rogue", "firmware"}
    record = read_alert_message(messages[0].value.encode())
    assert record["path"] == "fast" and record["batch_id"] is None
    assert record["window_start"].tzinfo == timezone.utc
    assert record["kafka_timestamp"] == SENT
    published = START + timedelta(hours=2)
    topic = [(m.key, m.value.encode(), "iot.alerts", 0, i, published)
             for i, m in enumerate(messages)]  # fmt: skip
    # The windowed path's messages and anything else on the topic are no fast alerts.
    windowed = alert_message({"alert_id": "w", "device_id": "d", "status": "raised"})
    topic += [("d", windowed, "iot.alerts", 0, 900, published),
              ("d", b"not json", "iot.alerts", 0, 901, published)]  # fmt: skip
    rows = fast_log_rows(spark.createDataFrame(topic, RAW_DDL)).toPandas()
    assert list(rows.columns) == c.column_names(c.FAST_ALERTS_COLUMNS)
    assert len(rows) == len(messages) == 64
    expected = fast.sort_values(["kafka_offset", "window_start"]).reset_index(drop=True)
    got = rows.sort_values(["kafka_offset", "window_start"]).reset_index(drop=True)
    for name in ("alert_id", "device_id", "alert_type", "window_start", "event_id",
                 "kafka_partition", "kafka_offset", "kafka_timestamp"):  # fmt: skip
        assert got[name].tolist() == expected[name].tolist(), name
    assert got["event_time"].tolist() == expected["first_event_time"].tolist()
    assert (got["published_at"] == pd_time(published)).all()


def flagged_fleet() -> list[tuple[Any, ...]]:
    """Kafka rows of a registered device sending every 30 s, each message produced 2 s after
    its reading: one reading is out of range, one carries a clock an hour ahead."""
    events = device_series("clean", START, 16, every_s=30)
    events[3]["metrics"]["voltage_v"] = -5000.0
    sent = [START + timedelta(seconds=30 * i + 2) for i in range(len(events))]
    events[7]["event_time"] = (sent[7] + timedelta(hours=1)).isoformat()
    return [(e["device_id"], json.dumps(e).encode(), "telemetry", 0, 100 + i, sent[i])
            for i, e in enumerate(events)]  # fmt: skip


def test_quarantined_readings_raise_the_windowed_paths_flag_alerts(spark: Any) -> None:
    """An impossible reading and a clock ahead raise ``impossible_reading`` and ``clock_ahead``
    on both paths, in the same windows (the clock ahead at its message's time), with the same
    ids, severities and reasons."""
    parsed = parse_events(spark.createDataFrame(flagged_fleet(), RAW_DDL))
    fast = fast_alerts(events_and_flagged(parsed), registry_df(spark), window_s=600,
                       slide_s=300).toPandas()  # fmt: skip
    assert fast.groupby("alert_type").size().to_dict() == {
        "clock_ahead": 2,
        "impossible_reading": 2,
    }
    ahead = fast[fast["alert_type"] == "clock_ahead"]
    assert (ahead["first_event_time"] == pd_time(START + timedelta(seconds=30 * 7 + 2))).all()

    events = feature_events(valid_events(parsed), duplicates=False).unionByName(
        quarantine_feature_events(quarantined(parsed))
    )
    windows = features_from_events(events, registry_df(spark), window="10 minutes",
                                   slide="5 minutes").toPandas()  # fmt: skip
    assert windows["event_count"].sum() == 14 * 2  # the two quarantined readings are not events
    windowed = rule_alerts(windows)
    assert set(windowed["alert_type"]) == {"clock_ahead", "impossible_reading"}
    by_id = fast.set_index("alert_id")
    assert sorted(windowed["alert_id"]) == sorted(by_id.index)
    for row in windowed.itertuples():
        assert by_id.loc[row.alert_id, "severity"] == row.severity
        assert list(by_id.loc[row.alert_id, "reasons"]) == list(row.reasons)


def test_other_quarantined_records_and_a_rogue_devices_raise_nothing_more(spark: Any) -> None:
    rogue = device_series("rogue", START, 2)
    rogue[0]["metrics"]["voltage_v"] = -5000.0  # impossible, but the device is rogue anyway
    rogue[1]["event_time"] = (SENT + timedelta(hours=1)).isoformat()  # clock far ahead
    clean = device_series("clean", START, 2)
    clean[0]["event_time"] = "yesterday"  # bad_timestamp: no reading to judge
    clean[1]["seq"] = "#7"  # wrong_type
    raw = spark.createDataFrame(kafka_rows(rogue + clean), RAW_DDL)
    parsed = parse_events(raw)
    assert fast_alerts(events_and_flagged(parsed), registry_df(spark), window_s=600,
                       slide_s=300).count() == 0  # fmt: skip
    # The windowed path: the rogue device's readings count towards its rogue_device windows,
    # and flag nothing more.
    more = device_series("rogue", START + timedelta(seconds=60), 2)
    events = feature_events(
        valid_events(parse_events(spark.createDataFrame(kafka_rows(more), RAW_DDL))),
        duplicates=False,
    ).unionByName(quarantine_feature_events(quarantined(parsed)))
    windows = features_from_events(events, registry_df(spark), window="10 minutes",
                                   slide="5 minutes").toPandas()  # fmt: skip
    assert set(rule_alerts(windows)["alert_type"]) == {"rogue_device"}


def test_window_starts_are_sparks_at_boundaries_and_before_1970(spark: Any) -> None:
    from pyspark.sql import functions as F

    from pipeline.fastpath import window_starts

    times = ["2026-11-22 08:05:00", "2026-11-22 08:04:59.999999", "2026-11-22 08:05:00.000001",
             "1969-12-31 23:57:30.5", "1960-01-01 00:00:00"]  # fmt: skip
    frame = spark.createDataFrame([(t,) for t in times], "t string").select(
        F.to_timestamp("t").alias("t")
    )
    ours = frame.select("t", window_starts(F.col("t"), window_s=600, slide_s=300).alias("s"))
    got = {r.t: sorted(r.s) for r in ours.collect()}
    spark_windows = frame.select("t", F.window("t", "10 minutes", "5 minutes").start.alias("s"))
    expected: dict[Any, list[Any]] = {}
    for r in spark_windows.collect():
        expected.setdefault(r.t, []).append(r.s)
    assert got == {t: sorted(s) for t, s in expected.items()}


@pytest.mark.parametrize(
    ("master", "partitions", "expected"),
    [("local[2]", 3, "local[5]"), ("local[4,2]", 2, "local[6,2]"), ("local", 1, "local[2]"),
     ("spark://host:7077", 3, "spark://host:7077")],
)  # fmt: skip
def test_a_local_master_gets_a_slot_per_partition_more(
    master: str, partitions: int, expected: str
) -> None:
    assert realtime_master(master, partitions) == expected


def test_local_star_counts_the_cores() -> None:
    import os

    assert realtime_master("local[*]", 2) == f"local[{(os.cpu_count() or 2) + 2}]"


def pd_time(at: datetime) -> Any:
    import pandas as pd

    return pd.Timestamp(at.astimezone(timezone.utc).replace(tzinfo=None))
