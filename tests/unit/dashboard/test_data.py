"""The dashboard's Delta readers and feedback writer on fixture tables written with deltalake."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import polars as pl
import pytest

from dashboard import data
from infra import contract as c
from infra import lake
from tests.dashboard_fixtures import (
    FAST_ALERT_ID,
    FAST_LEAD,
    FAST_MESSAGES,
    MARKUP_REASON,
    ROGUE,
    SILENT_DEVICE,
    FixtureLake,
    add_fast_alerts,
    add_silences,
    build_lake,
)


@pytest.fixture(scope="module")
def fixture_lake(tmp_path_factory: pytest.TempPathFactory) -> FixtureLake:
    """One read-only lake for the module (tests that write build their own)."""
    return build_lake(str(tmp_path_factory.mktemp("lake")))


def test_missing_table_gives_empty_frame_with_contract_columns(tmp_path: Path) -> None:
    frame = data.read_alerts(str(tmp_path / "nowhere"))
    assert frame.is_empty()
    assert frame.columns == c.column_names(c.ALERTS_COLUMNS)
    assert frame.schema["window_start"] == pl.Datetime("us", "UTC")
    assert data.read_feedback(str(tmp_path)).is_empty()
    assert data.devices_reporting(str(tmp_path), None) == 0
    assert data.count_rows(str(tmp_path), lake.QUARANTINE) == 0
    assert data.latest_evaluation(str(tmp_path)).is_empty()
    assert data.read_pipeline_metrics(str(tmp_path)).columns[-1] == "watermark_lag_s"


def test_folder_without_delta_log_counts_as_missing(tmp_path: Path) -> None:
    (tmp_path / lake.ALERTS).mkdir()
    assert not data.table_exists(str(tmp_path), lake.ALERTS)
    assert data.read_alerts(str(tmp_path), columns=["alert_id"]).columns == ["alert_id"]


def test_existing_but_empty_table_gives_empty_frame(tmp_path: Path) -> None:
    from deltalake import write_deltalake

    schema = c.arrow_schema(c.ALERTS_COLUMNS)
    write_deltalake(lake.table_path(str(tmp_path), lake.ALERTS), schema.empty_table())
    frame = data.read_alerts(str(tmp_path))
    assert frame.is_empty()
    assert frame.columns == c.column_names(c.ALERTS_COLUMNS)


def test_alerts_withdrawn_when_their_window_closed_are_shown_only_when_asked(
    tmp_path: Path,
) -> None:
    import pyarrow as pa
    from deltalake import write_deltalake

    start = datetime(2026, 11, 26, 8, 0, tzinfo=timezone.utc)
    rows = [
        {"alert_id": alert_id, "device_id": "d1", "alert_type": "stuck_sensor",
         "window_start": start + timedelta(minutes=5 * n), "status": status}
        for n, (alert_id, status) in enumerate([("standing", c.ALERT_RAISED),
                                                ("withdrawn", c.ALERT_WITHDRAWN),
                                                ("older", None)])
    ]  # fmt: skip
    schema = c.arrow_schema(c.ALERTS_COLUMNS)
    write_deltalake(lake.table_path(str(tmp_path), lake.ALERTS),
                    pa.Table.from_pylist(rows, schema=schema))  # fmt: skip
    # A null status (a row written before the column existed) stands.
    assert data.read_alerts(str(tmp_path))["alert_id"].to_list() == ["older", "standing"]
    shown = data.read_alerts(str(tmp_path), columns=["alert_id"])
    assert shown.columns == ["alert_id"] and shown.height == 2
    everything = data.read_alerts(str(tmp_path), withdrawn=True)
    assert everything["alert_id"].to_list() == ["older", "withdrawn", "standing"]


def test_only_requested_columns_are_loaded(fixture_lake: FixtureLake) -> None:
    frame = data.read_alerts(fixture_lake.root, columns=["alert_id", "severity", "no_such"])
    assert frame.columns == ["alert_id", "severity"]
    assert frame.height == len(fixture_lake.alerts)


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"alert_types": ["model_anomaly"]}, {"alert-002", "alert-006"}),
        ({"severities": ["high", "critical"]}, {"alert-001", "alert-002", "alert-003"}),
        ({"device_ids": [ROGUE]}, {"alert-004"}),
        ({"model_versions": ["3"]}, {"alert-002"}),
        ({"model_versions": [None]}, {"alert-001", "alert-003", "alert-004", "alert-005"}),
        (
            {"model_versions": [None, "2"]},
            {"alert-001", "alert-003", "alert-004", "alert-005"} | {"alert-006"},
        ),
        ({"alert_types": ["model_anomaly"], "severities": ["medium"]}, {"alert-006"}),
        ({"alert_types": []}, set()),
        ({"alert_ids": ["alert-004", "alert-006", "no-such"]}, {"alert-004", "alert-006"}),
    ],
)
def test_alert_filters(
    fixture_lake: FixtureLake, kwargs: dict[str, list[str]], expected: set[str]
) -> None:
    frame = data.read_alerts(fixture_lake.root, **kwargs)  # type: ignore[arg-type]
    assert set(frame["alert_id"]) == expected


def test_alert_time_range_and_order(fixture_lake: FixtureLake) -> None:
    now = fixture_lake.now
    frame = data.read_alerts(fixture_lake.root, since=now - timedelta(minutes=35))
    # Windows started 10 and 30 minutes ago; 40, 50, 55 minutes ago are out of range.
    assert set(frame["alert_id"]) == {"alert-001", "alert-002", "alert-003"}
    assert frame["window_start"].is_sorted(descending=True)
    until = data.read_alerts(fixture_lake.root, until=now - timedelta(minutes=50))
    assert set(until["alert_id"]) == {"alert-006"}


def test_open_alerts_exclude_those_with_a_verdict(fixture_lake: FixtureLake) -> None:
    alerts = data.read_alerts(fixture_lake.root)
    feedback = data.read_feedback(fixture_lake.root)
    open_ = data.open_alerts(alerts, feedback)
    assert open_.height == fixture_lake.open_alerts == 5
    assert "alert-005" not in set(open_["alert_id"])
    joined = data.with_feedback(alerts, feedback)
    assert joined.filter(pl.col("alert_id") == "alert-005")["verdict"].to_list() == [
        "false_positive"
    ]
    assert joined["verdict"].null_count() == 5


def test_fast_path_reads_first_message_and_count_per_alert_in_the_range(tmp_path: Path) -> None:
    fixture = build_lake(str(tmp_path / "lake"))
    rows = add_fast_alerts(fixture)
    alert = next(a for a in fixture.alerts if a["alert_id"] == FAST_ALERT_ID)
    fast = data.read_fast_path(fixture.root).sort("alert_id")
    assert fast.rows() == [
        (FAST_ALERT_ID, alert["detected_at"] - FAST_LEAD, FAST_MESSAGES),
        ("alert-unconfirmed", rows[-1]["published_at"], 1),
    ]
    # Bounded as the alerts are, by window start: this alert's window started 40 minutes ago.
    since = data.read_fast_path(fixture.root, since=fixture.now - timedelta(minutes=35))
    assert since.is_empty()
    until = data.read_fast_path(fixture.root, until=fixture.now - timedelta(minutes=35))
    assert until.height == 2
    only = data.read_fast_path(fixture.root, alert_ids=[FAST_ALERT_ID])
    assert only["alert_id"].to_list() == [FAST_ALERT_ID]


def test_fast_path_of_a_lake_without_the_table_is_empty(fixture_lake: FixtureLake) -> None:
    fast = data.read_fast_path(fixture_lake.root)
    assert fast.is_empty()
    assert fast.columns == ["alert_id", "fast_published_at", "fast_messages"]
    alerts = data.with_first_path(data.read_alerts(fixture_lake.root), fast)
    assert alerts["alert_id"].to_list() == data.read_alerts(fixture_lake.root)["alert_id"].to_list()
    assert set(alerts["first_by"]) == {data.WINDOWED_FIRST}
    assert set(alerts["fast_messages"]) == {0}


def test_the_path_that_raised_an_alert_first() -> None:
    detected = datetime(2026, 11, 26, 8, 10, 5, tzinfo=timezone.utc)
    alerts = pl.DataFrame(
        {"alert_id": ["fast", "windowed", "tie", "none"], "detected_at": [detected] * 4}
    )
    fast = pl.DataFrame(
        {
            "alert_id": ["tie", "windowed", "fast"],
            "fast_published_at": [
                detected,
                detected + timedelta(seconds=1.5),
                detected - timedelta(seconds=4.2),
            ],
            "fast_messages": [1, 2, 3],
        }
    )
    rows = data.with_first_path(alerts, fast).rows_by_key("alert_id", named=True, unique=True)
    assert {k: r["first_by"] for k, r in rows.items()} == {
        "fast": "fast path",
        "windowed": "windowed",
        "tie": "windowed",
        "none": "windowed",
    }
    assert {k: data.first_by_sentence(r) for k, r in rows.items()} == {
        "fast": "Raised first by the fast path, 4.2 s before the windowed path (3 fast messages)",
        "windowed": (
            "Raised first by the windowed path, 1.5 s before the fast path (2 fast messages)"
        ),
        "tie": "Raised first by the windowed path, 0.0 s before the fast path (1 fast message)",
        "none": "Raised by the windowed path (no fast-path message)",
    }


def test_feedback_is_appended_and_latest_verdict_wins(tmp_path: Path) -> None:
    root = str(tmp_path / "lake")
    build_lake(root)
    alerts_version = data.open_table(root, lake.ALERTS).version()  # type: ignore[union-attr]
    t0 = data.utcnow()
    data.write_feedback(
        root, "alert-001", "true_positive", note="<i>meter</i> bypass", analyst="ana", now=t0
    )
    data.write_feedback(
        root, "alert-001", "false_positive", note="", analyst="bo", now=t0 + timedelta(seconds=1)
    )
    raw = data.read_table(root, lake.ALERT_FEEDBACK)
    assert raw.height == 3
    latest = data.read_feedback(root)
    row = latest.filter(pl.col("alert_id") == "alert-001").row(0, named=True)
    assert (row["verdict"], row["analyst"]) == ("false_positive", "bo")
    assert data.open_alerts(data.read_alerts(root), latest).height == 4
    # The alerts table is never written by the dashboard.
    assert data.open_table(root, lake.ALERTS).version() == alerts_version  # type: ignore[union-attr]


def test_feedback_creates_the_table(tmp_path: Path) -> None:
    data.write_feedback(str(tmp_path), "a-1", "true_positive")
    assert data.read_feedback(str(tmp_path))["alert_id"].to_list() == ["a-1"]


@pytest.mark.parametrize(("alert_id", "verdict"), [("a-1", "maybe"), ("", "true_positive")])
def test_feedback_rejects_bad_input(tmp_path: Path, alert_id: str, verdict: str) -> None:
    with pytest.raises(ValueError):
        data.write_feedback(str(tmp_path), alert_id, verdict)
    assert not data.table_exists(str(tmp_path), lake.ALERT_FEEDBACK)


def test_alert_timeline_counts(fixture_lake: FixtureLake) -> None:
    alerts = data.read_alerts(fixture_lake.root)
    timeline = data.alert_timeline(alerts, "severity", "1h")
    totals = dict(timeline.group_by("severity").agg(pl.col("alerts").sum()).iter_rows())
    assert totals == {"critical": 1, "high": 2, "medium": 2, "low": 1}


def test_a_relative_range_is_resolved_when_read_and_a_fixed_one_is_kept() -> None:
    now = datetime(2026, 11, 26, 12, 0, tzinfo=timezone.utc)
    last_hour = data.TimeRange(hours=1.0)
    assert last_hour.bounds(now) == (now - timedelta(hours=1), None)
    later = now + timedelta(minutes=5)
    assert last_hour.bounds(later) == (later - timedelta(hours=1), None)
    fixed = data.TimeRange(since=now - timedelta(days=1), until=now)
    assert fixed.bounds(later) == (now - timedelta(days=1), now)
    assert data.ALL_TIME.bounds(now) == (None, None)


def test_timeline_bucket_is_sized_to_the_alerts_in_the_range(fixture_lake: FixtureLake) -> None:
    alerts = data.read_alerts(fixture_lake.root)
    now = fixture_lake.now
    # The alerts span the last hour: one-minute bars, whether the range is a day or all time.
    assert data.timeline_bucket(alerts, now - timedelta(days=1), None, now) == "1m"
    assert data.timeline_bucket(alerts, None, None, now) == "1m"
    assert data.timeline_bucket(alerts, now - timedelta(minutes=15), None, now) == "1m"
    assert data.timeline_bucket(alerts.head(0), now - timedelta(days=7), None, now) == "6h"


def test_time_bucket_keeps_bar_count_reasonable() -> None:
    now = data.utcnow()
    assert data.time_bucket(now - timedelta(minutes=15), now) == "1m"
    assert data.time_bucket(now - timedelta(hours=24), now) == "15m"
    assert data.time_bucket(now - timedelta(days=7), now) == "6h"
    assert data.time_bucket(None, now) == "1h"


def test_feedback_quality_per_model_version() -> None:
    alerts = pl.DataFrame(
        {
            "alert_id": ["a", "b", "c", "d"],
            "model_version": ["3", "3", None, "3"],
            "verdict": ["true_positive", "false_positive", "true_positive", None],
        }
    )
    quality = data.feedback_quality(alerts)
    assert quality.rows() == [("3", 2, 1, 0.5), ("rules", 1, 1, 1.0)]


def test_telemetry_around_a_window_is_filtered_by_device_and_time(
    fixture_lake: FixtureLake,
) -> None:
    now = fixture_lake.now
    frame = data.read_telemetry(
        fixture_lake.root,
        "meter-001",
        since=now - timedelta(minutes=20),
        until=now,
        columns=["event_time", "power_w"],
    )
    assert frame.columns == ["event_time", "power_w"]
    assert frame.height == 20
    assert frame["event_time"].is_sorted()
    assert frame["power_w"].tail(10).to_list() == [80.0] * 10


def test_devices_reporting_and_positions(fixture_lake: FixtureLake) -> None:
    assert data.devices_reporting(fixture_lake.root, None) == fixture_lake.devices_reporting
    future = fixture_lake.now + timedelta(minutes=1)
    assert data.devices_reporting(fixture_lake.root, future) == 0
    positions = data.last_positions(fixture_lake.root, [ROGUE])
    assert positions.select("device_id", "lat", "lon").rows() == [(ROGUE, 50.11, 8.68)]


def test_devices_reporting_counts_distinct_devices_in_the_range_not_missing_ids(
    tmp_path: Path,
) -> None:
    import pyarrow as pa
    from deltalake import write_deltalake

    start = datetime(2026, 12, 7, 12, 0, tzinfo=timezone.utc)
    rows = [
        ("meter-001", start - timedelta(seconds=1)),  # before the range
        ("meter-002", start),
        ("meter-002", start + timedelta(minutes=1)),
        ("meter-003", start + timedelta(minutes=9)),
        (None, start + timedelta(minutes=2)),  # no device: not a device reporting
        ("meter-004", start + timedelta(minutes=10)),  # the range's end is excluded
    ]
    schema = c.arrow_schema(c.TELEMETRY_COLUMNS)
    table = pa.Table.from_pylist(
        [{"device_id": device, "event_time": at} for device, at in rows], schema=schema
    )
    root = str(tmp_path)
    write_deltalake(lake.table_path(root, lake.TELEMETRY), table)
    assert data.devices_reporting(root, start, start + timedelta(minutes=10)) == 2
    assert data.devices_reporting(root, None) == 4


def test_map_points_place_registered_sites_and_unregistered_positions(
    fixture_lake: FixtureLake,
) -> None:
    root = fixture_lake.root
    points = data.map_points(
        data.read_devices(root), data.read_alerts(root), data.last_positions(root, [ROGUE])
    )
    by_id = {row["device_id"]: row for row in points.iter_rows(named=True)}
    assert set(by_id) == {"meter-001", "tracker-002", "thermo-003", ROGUE}
    assert (by_id["meter-001"]["alerts"], by_id["meter-001"]["worst_severity"]) == (3, "critical")
    assert (by_id["thermo-003"]["alerts"], by_id["thermo-003"]["worst_severity"]) == (0, None)
    assert by_id[ROGUE]["registered"] is False
    assert (by_id["meter-001"]["lat"], by_id["meter-001"]["lon"]) == (52.517, 13.389)


def test_window_features_of_an_alert(fixture_lake: FixtureLake) -> None:
    alert = fixture_lake.alerts[0]
    features = data.read_features(
        fixture_lake.root, alert["device_id"], window_start=alert["window_start"]
    )
    assert features.height == 1
    assert features["power_w_mean"].to_list() == [80.0]
    fields = data.as_field_table(features.row(0, named=True))
    assert fields.schema == {"field": pl.String, "value": pl.String}
    assert "power_w_mean" in set(fields["field"])


def test_a_window_still_open_shows_its_latest_state_until_it_is_closed(tmp_path: Path) -> None:
    import pyarrow as pa
    from deltalake import write_deltalake

    root, start = str(tmp_path), datetime(2026, 11, 25, 8, 0, tzinfo=timezone.utc)
    end = start + timedelta(minutes=10)

    def row(count: int, batch: int | None = None) -> dict[str, object]:
        base = {"device_id": "d1", "window_start": start, "window_end": end, "event_count": count}
        return base if batch is None else {**base, "batch_id": batch}

    for batch, count in ((3, 5), (4, 9), (2, 1)):  # appended out of order
        write_deltalake(lake.table_path(root, lake.FEATURE_CHANGES),
                        pa.Table.from_pylist([row(count, batch)]), mode="append")  # fmt: skip
    shown = data.read_features(root, "d1", window_start=start)
    assert shown["event_count"].to_list() == [9]  # the latest change, not the last written
    write_deltalake(lake.table_path(root, lake.FEATURES), pa.Table.from_pylist([row(12)]))
    shown = data.read_features(root, "d1", window_start=start)
    assert shown["event_count"].to_list() == [12]  # closed: its final row, once


def test_field_table_shows_values_as_plain_text() -> None:
    fields = data.as_field_table({"reasons": [MARKUP_REASON, "x"], "score": 0.91234, "none": None})
    assert fields["value"].to_list() == [f"{MARKUP_REASON}; x", "0.9123", ""]


def test_pipeline_metrics_lag_rate_and_quarantine(fixture_lake: FixtureLake) -> None:
    metrics = data.read_pipeline_metrics(fixture_lake.root)
    assert metrics.height == 24
    # Each query's first batch has the epoch, detection's second one the epoch an hour on:
    # missing watermarks, not lags of half a century.
    missing = metrics.filter(pl.col("watermark").is_null())
    assert sorted(missing.select("query_name", "batch_id").rows()) == [
        ("detection", 0), ("detection", 1), ("ingest", 0)
    ]  # fmt: skip
    assert missing["watermark_lag_s"].null_count() == 3
    lag = metrics["watermark_lag_s"]
    assert lag.null_count() == 3 and lag.drop_nulls().unique().to_list() == [120.0]
    assert int(metrics["late_rows_dropped"].sum()) == fixture_lake.late_rows
    assert data.ingest_rate(metrics, "ingest") == pytest.approx(fixture_lake.ingest_rate_latest)
    assert data.ingest_rate(metrics.head(0), "ingest") is None
    quarantine = data.quarantine_by_reason(fixture_lake.root)
    assert dict(quarantine.iter_rows()) == fixture_lake.quarantine_by_reason


def test_latest_evaluation_keeps_only_the_newest_run(fixture_lake: FixtureLake) -> None:
    evaluation = data.latest_evaluation(fixture_lake.root)
    assert evaluation["scenario"].to_list() == ["impossible_travel", "tampering"]
    assert evaluation.filter(pl.col("scenario") == "tampering")["recall"].to_list() == [0.75]


def test_downsample_bounds_points_per_group() -> None:
    start = data.utcnow()
    frame = pl.DataFrame(
        {
            "t": [start + timedelta(seconds=i) for i in range(3000)] * 2,
            "q": ["a"] * 3000 + ["b"] * 3000,
            "v": [1.0] * 6000,
        }
    )
    small = data.downsample(frame, "t", max_points=100, by="q")
    assert small.group_by("q").len()["len"].max() <= 101  # type: ignore[operator]
    assert small["v"].unique().to_list() == [1.0]
    assert data.downsample(frame.head(50), "t", max_points=100).height == 50


def test_champion_is_none_without_a_store(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert data.champion(uri, "iot-fraud") is None
    assert not (tmp_path / "mlflow.db").exists()


def test_delta_uri_maps_s3a() -> None:
    assert lake.delta_uri("s3a://bucket/lake", "alerts") == "s3://bucket/lake/alerts"


def test_the_watermark_lag_is_each_query_as_it_is_now() -> None:
    from datetime import datetime

    t = datetime(2026, 11, 26, 8, 0)
    metrics = pl.DataFrame({
        "query_name": ["detection", "detection", "ingest", "firmware"],
        "timestamp": [t, t.replace(minute=5), t.replace(minute=6), t.replace(minute=1)],
        "watermark_lag_s": [120.0, None, None, 30.0],
    })  # fmt: skip
    # detection's latest batch has no watermark (restarted): not its older 120 s.
    assert data.watermark_lag(metrics) == 30.0
    assert data.watermark_lag(metrics.filter(pl.col("query_name") != "firmware")) is None
    assert data.watermark_lag(metrics.clear()) is None


def test_the_latest_batch_table_has_one_readable_row_per_query() -> None:
    from datetime import datetime

    t = datetime(2026, 11, 26, 8, 0)
    metrics = pl.DataFrame({
        "query_name": ["ingest", "detection", "ingest", "detection"],
        "run_id": ["r"] * 4,
        "batch_id": [7, 3, 8, 4],
        "timestamp": [t, t, t.replace(minute=1), t.replace(minute=2)],
        "num_input_rows": [10, 20, 11, 21],
        "input_rows_per_second": [1.0, 2.0, 1.1, 2.1],
        "processed_rows_per_second": [1.0, 2.0, 1.1, 2.1],
        "batch_duration_ms": [900, 1800, 950, 1850],
        "watermark": [None, t, None, t],
        "state_rows": [0, 5, 0, 6],
        "late_rows_dropped": [0, 1, 0, 0],
        "kafka_end_offsets": ['{"iot.telemetry": {"0": 10}}'] * 4,
        "watermark_lag_s": [None, 0.0, None, 120.0],
    })  # fmt: skip
    latest = data.latest_batches(metrics)
    assert latest.columns == list(data.LATEST_BATCH_COLUMNS.values())
    assert "kafka_end_offsets" not in latest.columns and "run_id" not in latest.columns
    assert latest.rows() == [
        ("detection", 4, t.replace(minute=2), 1850, 21, 2.1, 120.0, 6, 0),
        ("ingest", 8, t.replace(minute=1), 950, 11, 1.1, None, 0, 0),
    ]


# --- Silent devices (device_silent alerts) -------------------------------------------------------
NOW = datetime(2026, 11, 26, 12, 0, tzinfo=timezone.utc)
SILENCE_SCHEMA = {name: pl.String for name in ("alert_id", "device_id", "alert_type", "status")} | {
    name: pl.Datetime("us", "UTC")
    for name in ("window_start", "window_end", "first_event_time", "last_event_time")
}


def silences(*rows: tuple[str, str, str, datetime, datetime | None, str | None]) -> pl.DataFrame:
    """Alert rows ``(alert_id, device_id, alert_type, last reading, window_end, status)``."""
    return pl.DataFrame(
        [
            {"alert_id": a, "device_id": d, "alert_type": t, "window_start": last.replace(
                microsecond=0), "window_end": end, "first_event_time": last,
             "last_event_time": last + timedelta(minutes=4), "status": status}
            for a, d, t, last, end, status in rows
        ],
        schema=SILENCE_SCHEMA,
    )  # fmt: skip


def ago(minutes: float) -> datetime:
    return NOW - timedelta(minutes=minutes)


def test_silent_now_counts_each_registered_device_still_silent_once() -> None:
    registered = ["twice", "ended", "withdrawn", "old", "two-open", "burst", "quiet", "retired"]
    registry = pl.DataFrame({"device_id": registered, "status": ["active"] * 7 + ["retired"]})
    frame = silences(
        # One silence ended, a later one still on: silent now, once, since the later one.
        ("t1", "twice", "device_silent", ago(300), ago(200), "raised"),
        ("t2", "twice", "device_silent", ago(60.5), None, "raised"),
        ("e1", "ended", "device_silent", ago(90), ago(30), "raised"),
        ("w1", "withdrawn", "device_silent", ago(40), None, "withdrawn"),
        # A null status (a row written before the column existed) stands.
        ("o1", "old", "device_silent", ago(1500), None, None),
        # Two still open (the query never ended the first): once, since its later last reading.
        ("p1", "two-open", "device_silent", ago(50), None, "raised"),
        ("p2", "two-open", "device_silent", ago(20), None, "raised"),
        # Not registered, or retired (whose silence the query ends, but perhaps not yet): not
        # counted.
        ("r1", "rogue", "device_silent", ago(10), None, "raised"),
        ("r2", "retired", "device_silent", ago(10), None, "raised"),
        # Another type with no window end is no silence.
        ("b1", "burst", "late_burst", ago(10), None, "raised"),
    )
    silent = data.silent_now(frame, registry)
    assert silent.rows() == [
        ("old", ago(1500), "o1"),
        ("twice", ago(60.5), "t2"),
        ("two-open", ago(20), "p2"),
    ]
    assert data.silent_now(frame, registry.head(0)).is_empty()
    # A registry row without a status (or no status column) counts as registered.
    unknown = registry.with_columns(pl.lit(None, pl.String).alias("status"))
    assert data.silent_now(frame, unknown).height == 4
    assert data.silent_now(frame, unknown.drop("status")).height == 4


def test_a_silence_ended_in_any_row_of_its_alert_is_over() -> None:
    """One row per alert (the pipeline MERGEs on alert_id); were an earlier version of the row
    read too, its end would still count."""
    frame = silences(
        ("s1", "d1", "device_silent", ago(30), None, "raised"),
        ("s1", "d1", "device_silent", ago(30), ago(5), "raised"),
    )
    assert data.silent_now(frame, pl.DataFrame({"device_id": ["d1"]})).is_empty()


def test_silent_now_of_a_lake_written_before_silence_alerts_is_empty(tmp_path: Path) -> None:
    import pyarrow as pa
    from deltalake import write_deltalake

    registry = pl.DataFrame({"device_id": ["d1"]})
    # No alerts table at all.
    assert data.silent_now(data.read_silences(str(tmp_path)), registry).is_empty()
    # An alerts table from before the status column and the silence alert types.
    old_columns = tuple((n, t) for n, t in c.ALERTS_COLUMNS if n != "status")
    row = {"alert_id": "a1", "device_id": "d1", "alert_type": "flood",
           "window_start": NOW, "window_end": None}  # fmt: skip
    write_deltalake(lake.table_path(str(tmp_path), lake.ALERTS),
                    pa.Table.from_pylist([row], schema=c.arrow_schema(old_columns)))  # fmt: skip
    read = data.read_silences(str(tmp_path))
    assert read.is_empty() and "status" not in read.columns
    silent = data.silent_now(read, registry)
    assert silent.is_empty() and silent.columns == ["device_id", "silent_since", "alert_id"]


def test_read_silences_reads_every_silence_whatever_its_window_and_status(tmp_path: Path) -> None:
    fixture = build_lake(str(tmp_path / "lake"))
    expected = add_silences(fixture)
    read = data.read_silences(fixture.root)
    assert sorted(read["alert_id"]) == [f"silence-{n}" for n in range(1, 8)]
    assert read.columns == list(data.SILENCE_COLUMNS)
    silent = data.silent_now(read, data.read_devices(fixture.root))
    assert dict(silent.select("device_id", "silent_since").iter_rows()) == expected
    assert silent["device_id"].to_list() == ["thermo-003", SILENT_DEVICE[0]]


def test_read_alerts_with_status_in_the_columns_reads_it_once(fixture_lake: FixtureLake) -> None:
    frame = data.read_alerts(fixture_lake.root, columns=["alert_id", "status"], withdrawn=True)
    assert frame.columns == ["alert_id", "status"]
    assert frame.height == len(fixture_lake.alerts)


def test_map_points_mark_devices_silent_now(fixture_lake: FixtureLake) -> None:
    root = fixture_lake.root
    now = fixture_lake.now
    silent = pl.DataFrame(
        {
            "device_id": ["thermo-003", "meter-001", "not-on-map"],
            "silent_since": [now - timedelta(hours=30), now - timedelta(minutes=20), now],
        },
        schema={"device_id": pl.String, "silent_since": pl.Datetime("us", "UTC")},
    )
    points = data.map_points(data.read_devices(root), data.read_alerts(root),
                             data.last_positions(root, [ROGUE]), silent, now)  # fmt: skip
    by_id = {row["device_id"]: row for row in points.iter_rows(named=True)}
    assert set(by_id) == {"meter-001", "tracker-002", "thermo-003", ROGUE}
    old, recent = now - timedelta(hours=30), now - timedelta(minutes=20)
    assert by_id["thermo-003"]["silence"] == f"silent since {old:%Y-%m-%d %H:%M} UTC"
    assert by_id["meter-001"]["silence"] == f"silent since {recent:%H:%M} UTC"
    assert by_id["meter-001"]["silent_since"] == recent
    assert by_id["tracker-002"]["silence"] is None and by_id[ROGUE]["silent_since"] is None
    # Without silences, no device is marked.
    plain = data.map_points(data.read_devices(root), data.read_alerts(root),
                            data.last_positions(root, [ROGUE]))  # fmt: skip
    assert plain["silence"].null_count() == plain.height == 4


def test_since_is_a_time_within_twelve_hours_and_a_date_and_time_before() -> None:
    since = pl.Series("since", [ago(11 * 60 + 59), ago(12 * 60), ago(5)], pl.Datetime("us", "UTC"))
    text = pl.select(data.since_text(pl.lit(since), NOW)).to_series().to_list()
    assert text == ["00:01 UTC", "2026-11-26 00:00 UTC", "11:55 UTC"]


@pytest.mark.parametrize(
    ("span", "text"),
    [
        (timedelta(seconds=45.9), "45 s"),
        (timedelta(minutes=4, seconds=10), "4 min 10 s"),
        (timedelta(hours=2, minutes=5, seconds=59), "2 h 5 min"),
        (timedelta(days=3, hours=4, minutes=1), "3 d 4 h"),
        (timedelta(minutes=4, seconds=0.9), "4 min"),
        (timedelta(days=2, minutes=59), "2 d"),
        (timedelta(seconds=-3), "0 s"),
    ],
)
def test_duration_text(span: timedelta, text: str) -> None:
    assert data.duration_text(span) == text


def silence_alert(end: datetime | None, alert_type: str = "device_silent") -> dict[str, object]:
    last = datetime(2026, 11, 26, 7, 55, 49, 750000, tzinfo=timezone.utc)
    return {"alert_id": "s1", "alert_type": alert_type, "reasons": ["no reading for 4 min 10 s"],
            "window_start": last.replace(microsecond=0), "window_end": end,
            "first_event_time": last, "last_event_time": last + timedelta(minutes=4)}  # fmt: skip


def test_an_ongoing_silence_reads_as_still_silent_and_an_ended_one_as_its_length() -> None:
    ongoing = silence_alert(None)
    assert data.is_ongoing_silence(ongoing)
    assert data.silence_sentence(ongoing, NOW) == (
        "Still silent: no reading since 2026-11-26 07:55:49 UTC (4 h 4 min)"
    )
    fields = dict(data.alert_field_table(ongoing).iter_rows())
    assert fields["window_end"] == data.STILL_SILENT == "still silent"
    assert "reasons" not in fields
    assert not any(v in {"None", "NaT"} or v.startswith("1970") for v in fields.values())
    assert data.alert_end(ongoing, NOW) == NOW

    ended = silence_alert(datetime(2026, 11, 26, 9, 0, 5, tzinfo=timezone.utc))
    assert not data.is_ongoing_silence(ended)
    assert data.silence_sentence(ended, NOW) == (
        "Silent for 1 h 4 min: no reading from 2026-11-26 07:55:49 until 2026-11-26 09:00:05 UTC"
    )
    assert dict(data.alert_field_table(ended).iter_rows())["window_end"] == (
        "2026-11-26 09:00:05+00:00"
    )
    assert data.alert_end(ended, NOW) == ended["window_end"]

    # Other types: no sentence; a window with no end recorded ends where it starts, as before.
    other = silence_alert(None, alert_type="late_burst")
    assert not data.is_ongoing_silence(other)
    assert data.silence_sentence(other, NOW) is None
    assert dict(data.alert_field_table(other).iter_rows())["window_end"] == ""
    assert data.alert_end(other, NOW) == other["window_start"]


def test_the_firmware_a_device_reports_is_listed_with_the_registry_s_verdict() -> None:
    t0 = datetime(2026, 12, 5, 8, 0, tzinfo=timezone.utc)
    events = pl.DataFrame(
        {
            "event_time": [t0 + timedelta(minutes=i) for i in range(6)],
            "firmware": ["1.0.0", "1.0.0", "6.6.6", None, "6.6.6", "1.0.0"],
        }
    )
    rows = data.firmware_reported(events, "1.0.0").rows()
    assert rows == [
        ("1.0.0", 3, t0, t0 + timedelta(minutes=5), True),
        ("6.6.6", 2, t0 + timedelta(minutes=2), t0 + timedelta(minutes=4), False),
        (None, 1, t0 + timedelta(minutes=3), t0 + timedelta(minutes=3), None),
    ]
    # A device the registry does not know: no verdict.
    unknown = data.firmware_reported(events, None)
    assert unknown["registry_expects"].null_count() == unknown.height == 3
