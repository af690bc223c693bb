"""Fixture lakes for the dashboard tests, written with ``deltalake`` as the pipeline would.

``build_lake`` writes a small, fully known lake (times relative to ``now``) and returns the
numbers the pages must show; ``add_fast_alerts`` adds the fast path's table to one,
``add_silences`` the silence query's alerts; ``register_champion`` puts a champion model in an
MLflow store.
"""

from __future__ import annotations

import functools
import shutil
import tempfile
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pyarrow as pa
from deltalake import write_deltalake

from infra import contract as c
from infra import lake

MODEL_NAME = "iot-fraud"
# A reason that would be markup if rendered as HTML/Markdown: the page must show it as text.
MARKUP_REASON = "<b>power_w_mean</b> below 0.2 x expected"

DEVICES = (
    # device_id, type, owner, address, lat, lon, firmware
    (
        "meter-001",
        "smart_meter",
        "Ada Lovelace",
        "Unter den Linden 1, Berlin",
        52.517,
        13.389,
        "2.1.0",
    ),
    ("tracker-002", "gps_tracker", "Fleet GmbH", "Marienplatz 8, Munich", 48.137, 11.575, "1.4.2"),
    (
        "thermo-003",
        "thermostat",
        "Grace Hopper",
        "Jungfernstieg 7, Hamburg",
        53.553,
        9.993,
        "0.9.1",
    ),
)
ROGUE = "rogue-999"
# add_fast_alerts: the fast path published the rogue device's alert this long before the windowed
# path raised it, in FAST_MESSAGES messages.
FAST_ALERT_ID = "alert-004"
FAST_LEAD = timedelta(seconds=4.2)
FAST_MESSAGES = 3


# add_silences: a fourth registered device, silent for the last SILENT_FOR after an hour of
# readings, and the silence query's alerts (ids "silence-*"); see add_silences.
SILENT_DEVICE = ("meter-004", "smart_meter", "Ida Noddack", "Domkloster 4, Cologne", 50.941,
                 6.958, "2.1.0")  # fmt: skip
SILENT_FOR = timedelta(minutes=20)


@dataclass
class FixtureLake:
    """What was written, and the numbers a page must show for it."""

    root: str
    now: datetime
    alerts: list[dict[str, Any]]
    feedback: list[dict[str, Any]]
    telemetry_rows: int
    quarantine_by_reason: dict[str, int]
    late_rows: int
    ingest_rate_latest: float
    devices_reporting: int
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def open_alerts(self) -> int:
        reviewed = {f["alert_id"] for f in self.feedback}
        return sum(1 for a in self.alerts if a["alert_id"] not in reviewed)


def _write(root: str, table: str, columns: c.Columns, rows: list[dict[str, Any]]) -> None:
    schema = c.arrow_schema(columns)
    data = pa.Table.from_pylist(rows, schema=schema)
    write_deltalake(lake.table_path(root, table), data, mode="append")


def build_lake(root: str, now: datetime | None = None) -> FixtureLake:
    """Write every table of a small lake under ``root``; times end at ``now`` (default: now)."""
    now = (now or datetime.now(timezone.utc)).replace(microsecond=0)
    start = now - timedelta(hours=1)

    devices = [
        {
            "device_id": d,
            "device_type": t,
            "owner": o,
            "site_address": a,
            "site_lat": la,
            "site_lon": lo,
            "expected_firmware": fw,
            "plan": "standard",
            "install_date": date(2024, 3, 1),
            "status": "active",
            "updated_at": start,
        }
        for d, t, o, a, la, lo, fw in DEVICES
    ]
    _write(root, lake.DEVICES, c.DEVICES_COLUMNS, devices)

    telemetry: list[dict[str, Any]] = []
    positions = {d[0]: (d[4], d[5]) for d in DEVICES[:2]} | {ROGUE: (50.11, 8.68)}
    for device_id, (lat, lon) in positions.items():
        for i in range(60):
            at = start + timedelta(minutes=i)
            # meter-001's power collapses for the last 10 minutes: the tampering alert's window.
            power = 80.0 if device_id == "meter-001" and i >= 50 else 460.0
            telemetry.append(
                {
                    "event_id": f"{device_id}-{i}",
                    "device_id": device_id,
                    "event_time": at,
                    "seq": i,
                    "firmware": "2.1.0",
                    "lat": lat,
                    "lon": lon,
                    "temperature_c": 20.0 + i % 5,
                    "voltage_v": 230.0,
                    "current_a": 2.0,
                    "power_w": power,
                    "humidity_pct": None,
                    "battery_pct": None,
                    "signal_dbm": -70.0,
                    "extra": None,
                    "kafka_topic": "iot.telemetry",
                    "kafka_partition": 0,
                    "kafka_offset": len(telemetry),
                    "kafka_timestamp": at,
                    "ingest_time": at + timedelta(seconds=1),
                }
            )
    _write(root, lake.TELEMETRY, c.TELEMETRY_COLUMNS, telemetry)

    def alert(
        n: int, device: str, type_: str, severity: str, minutes_ago: int, **kw: Any
    ) -> dict[str, Any]:
        ws = now - timedelta(minutes=minutes_ago)
        return {
            "alert_id": f"alert-{n:03d}",
            "device_id": device,
            "alert_type": type_,
            "severity": severity,
            "score": kw.get("score", 0.9),
            "reasons": kw.get("reasons", [f"{type_} rule fired"]),
            "model_name": kw.get("model_name"),
            "model_version": kw.get("model_version"),
            "window_start": ws,
            "window_end": ws + timedelta(minutes=10),
            "first_event_time": ws,
            "last_event_time": ws + timedelta(minutes=9),
            "status": kw.get("status", c.ALERT_RAISED),
            "detected_at": ws + timedelta(minutes=10, seconds=5),
            "batch_id": n,
        }

    alerts = [
        alert(
            1,
            "meter-001",
            "tampering",
            "critical",
            10,
            reasons=[MARKUP_REASON, "power_ratio_mean 0.17"],
        ),
        alert(
            2,
            "meter-001",
            "model_anomaly",
            "high",
            10,
            model_name=MODEL_NAME,
            model_version="3",
            score=0.97,
        ),
        alert(3, "tracker-002", "impossible_travel", "high", 30, reasons=["speed 2400 km/h"]),
        alert(4, ROGUE, "rogue_device", "medium", 40, reasons=["device not in registry"]),
        alert(5, "tracker-002", "flood", "low", 50),
        alert(
            6,
            "meter-001",
            "model_anomaly",
            "medium",
            55,
            model_name=MODEL_NAME,
            model_version="2",
            score=0.71,
        ),
    ]
    _write(root, lake.ALERTS, c.ALERTS_COLUMNS, alerts)

    feedback = [
        {
            "alert_id": "alert-005",
            "verdict": "false_positive",
            "note": "maintenance burst",
            "analyst": "kim",
            "created_at": now - timedelta(minutes=5),
        },
    ]
    _write(root, lake.ALERT_FEEDBACK, c.ALERT_FEEDBACK_COLUMNS, feedback)

    features: list[dict[str, Any]] = []
    windows = {(a["device_id"], a["window_start"]): a for a in alerts}
    for a in windows.values():
        row: dict[str, Any] = {
            "device_id": a["device_id"],
            "window_start": a["window_start"],
            "window_end": a["window_end"],
            "event_count": 10,
            "seq_gap_count": 0,
            "duplicate_count": 0,
            "max_distance_km": 0.1,
            "implied_speed_kmh": None,
            "firmware_mismatch_count": 0,
            "registered": a["device_id"] != ROGUE,
            "device_type": "smart_meter",
        }
        for metric in c.METRICS:
            for stat in ("mean", "std", "min", "max"):
                row[f"{metric}_{stat}"] = 80.0 if metric == "power_w" else 1.0
        features.append(row)
    features_schema = pa.Table.from_pylist(features).schema
    features_schema = features_schema.set(
        features_schema.get_field_index("implied_speed_kmh"),
        pa.field("implied_speed_kmh", pa.float64()),
    )
    for name in ("window_start", "window_end"):
        i = features_schema.get_field_index(name)
        features_schema = features_schema.set(i, pa.field(name, pa.timestamp("us", tz="UTC")))
    write_deltalake(
        lake.table_path(root, lake.FEATURES),
        pa.Table.from_pylist(features, schema=features_schema),
        mode="append",
    )

    def watermark(query: str, b: int, at: datetime) -> datetime:
        # Spark reports the epoch until a query has a watermark (rows of an earlier release kept
        # it, and one shifted by a time zone); the dashboard must not plot either as a lag.
        if b == 0:
            return c.NO_WATERMARK
        if b == 1 and query == "detection":
            return c.NO_WATERMARK + timedelta(hours=1)
        return at - timedelta(minutes=2)

    metrics: list[dict[str, Any]] = []
    for query, rate in (("ingest", 3.0), ("detection", 2.5)):
        for b in range(12):
            at = start + timedelta(minutes=5 * b)
            metrics.append(
                {
                    "query_name": query,
                    "run_id": "run-1",
                    "batch_id": b,
                    "timestamp": at,
                    "num_input_rows": 15,
                    "input_rows_per_second": rate + b / 10,
                    "processed_rows_per_second": rate + 1,
                    "batch_duration_ms": 800 + 10 * b,
                    "watermark": watermark(query, b, at),
                    # Detection's state in RocksDB, which does not count its rows (infra.spark).
                    "state_rows": None if query == "detection" else 100 + b,
                    "late_rows_dropped": 1 if query == "detection" and b % 4 == 0 else 0,
                }
            )
    _write(root, lake.PIPELINE_METRICS, c.PIPELINE_METRICS_COLUMNS, metrics)

    quarantine: list[dict[str, Any]] = []
    for reason, n in (("invalid_json", 3), ("duplicate", 2)):
        for i in range(n):
            quarantine.append(
                {
                    "raw_value": b"{not json",
                    "raw_key": "meter-001",
                    "reason": reason,
                    "detail": "test",
                    "device_id": None,
                    "event_id": None,
                    "event_time": None,
                    "kafka_topic": "iot.telemetry",
                    "kafka_partition": 0,
                    "kafka_offset": i,
                    "kafka_timestamp": now - timedelta(minutes=i + 1),
                    "ingest_time": now - timedelta(minutes=i + 1),
                }
            )
    _write(root, lake.QUARANTINE, c.QUARANTINE_COLUMNS, quarantine)

    evaluation = [
        {
            "evaluated_at": now - timedelta(days=1),
            "scenario": "tampering",
            "injected": 4,
            "detected": 1,
            "alerts": 1,
            "true_positive_alerts": 1,
            "precision": 1.0,
            "recall": 0.25,
            "f1": 0.4,
            "median_time_to_detect_s": 300.0,
        },
        {
            "evaluated_at": now,
            "scenario": "tampering",
            "injected": 4,
            "detected": 3,
            "alerts": 5,
            "true_positive_alerts": 4,
            "precision": 0.8,
            "recall": 0.75,
            "f1": 0.774,
            "median_time_to_detect_s": 95.0,
        },
        {
            "evaluated_at": now,
            "scenario": "impossible_travel",
            "injected": 2,
            "detected": 2,
            "alerts": 2,
            "true_positive_alerts": 2,
            "precision": 1.0,
            "recall": 1.0,
            "f1": 1.0,
            "median_time_to_detect_s": 61.0,
        },
    ]
    _write(root, lake.EVALUATION, c.EVALUATION_COLUMNS, evaluation)

    return FixtureLake(
        root=root,
        now=now,
        alerts=alerts,
        feedback=feedback,
        telemetry_rows=len(telemetry),
        quarantine_by_reason={"invalid_json": 3, "duplicate": 2},
        late_rows=3,
        ingest_rate_latest=3.0 + 11 / 10,
        devices_reporting=len(positions),
    )


def add_fast_alerts(fixture: FixtureLake) -> list[dict[str, Any]]:
    """Write ``fast_alerts`` to ``fixture``'s lake: FAST_MESSAGES messages for FAST_ALERT_ID (the
    first FAST_LEAD before its ``detected_at``) and one for an alert the windowed path never
    confirmed (not in ``alerts``). The rows written."""
    alert = next(a for a in fixture.alerts if a["alert_id"] == FAST_ALERT_ID)
    first = alert["detected_at"] - FAST_LEAD
    # The later messages come from later events of the window, also after the windowed alert.
    published = [first, first + timedelta(seconds=3), alert["detected_at"] + timedelta(seconds=2)]
    assert len(published) == FAST_MESSAGES
    unconfirmed = {**alert, "alert_id": "alert-unconfirmed", "device_id": "rogue-998"}
    rows = [
        {
            "alert_id": source["alert_id"],
            "device_id": source["device_id"],
            "alert_type": source["alert_type"],
            "window_start": source["window_start"],
            "event_id": f"{source['device_id']}-fast-{i}",
            "event_time": source["window_start"] + timedelta(minutes=i),
            "kafka_partition": 0,
            "kafka_offset": 1000 + i,
            "kafka_timestamp": at - timedelta(milliseconds=20),
            "published_at": at,
        }
        for i, (source, at) in enumerate([(alert, at) for at in published] + [(unconfirmed, first)])
    ]
    # Written in a different order than published: the first message is the earliest one.
    _write(fixture.root, lake.FAST_ALERTS, c.FAST_ALERTS_COLUMNS, rows[::-1])
    return rows


def add_silences(fixture: FixtureLake) -> dict[str, datetime]:
    """Register SILENT_DEVICE with readings up to SILENT_FOR ago, and append the silence query's
    alerts to ``fixture``'s lake (``fixture.alerts`` is left as built):

    - thermo-003: a silence that ended two days ago, and one since 26 hours ago, still on (its
      window starts before the last 24 hours);
    - SILENT_DEVICE: still silent since its last reading, and an earlier silence the query
      never ended (two open: the device counts once, silent since the later one);
    - tracker-002: a silence that ended two hours ago, and a late burst;
    - meter-001: a silence still open but withdrawn; ROGUE: one still open, not registered.

    Returns the devices silent now: ``device_id -> last reading`` (``silent_since``), also kept
    in ``fixture.extra["silent_since"]``.
    """
    now, root = fixture.now, fixture.root
    device_id, type_, owner, address, lat, lon, firmware = SILENT_DEVICE
    registry = {"device_id": device_id, "device_type": type_, "owner": owner,
                "site_address": address, "site_lat": lat, "site_lon": lon,
                "expected_firmware": firmware, "plan": "standard",
                "install_date": date(2024, 3, 1), "status": "active",
                "updated_at": now - timedelta(hours=1)}  # fmt: skip
    _write(root, lake.DEVICES, c.DEVICES_COLUMNS, [registry])
    # An hour of one reading a minute, the last one SILENT_FOR ago (event times with sub-second
    # parts: a silence's window starts at its last reading floored to the second).
    last_reading = now - SILENT_FOR + timedelta(milliseconds=400)
    readings = [last_reading - timedelta(minutes=i) for i in range(40, -1, -1)]
    telemetry = [
        {"event_id": f"{device_id}-{i}", "device_id": device_id, "event_time": at, "seq": i,
         "firmware": firmware, "lat": lat, "lon": lon, "temperature_c": 21.0,
         "voltage_v": 230.0, "current_a": 2.0, "power_w": 460.0, "signal_dbm": -70.0,
         "kafka_topic": "iot.telemetry", "kafka_partition": 1, "kafka_offset": i,
         "kafka_timestamp": at, "ingest_time": at + timedelta(seconds=1)}
        for i, at in enumerate(readings)
    ]  # fmt: skip
    _write(root, lake.TELEMETRY, c.TELEMETRY_COLUMNS, telemetry)

    def silence(
        n: int, device: str, last: datetime, ended: datetime | None, **kw: Any
    ) -> dict[str, Any]:
        detected = last + timedelta(minutes=4, seconds=10)
        reasons = ["no reading for 4 min 10 s (expected every 60 s; threshold 4 × interval)"]
        if ended is not None:
            reasons.append(f"reporting again after {ended - last}")
        return {
            "alert_id": f"silence-{n}",
            "device_id": device,
            "alert_type": kw.get("alert_type", "device_silent"),
            "severity": kw.get("severity", "high"),
            "score": 1.0,
            "reasons": kw.get("reasons", reasons),
            "model_name": None,
            "model_version": None,
            "window_start": last.replace(microsecond=0),
            "window_end": ended,
            "first_event_time": last,
            "last_event_time": kw.get("last_event_time", detected),
            "status": kw.get("status", c.ALERT_RAISED),
            "detected_at": kw.get("detected_at", detected + timedelta(seconds=2)),
            "batch_id": 100 + n,
        }

    thermo_last = now - timedelta(hours=26, milliseconds=-250)
    rows = [
        silence(1, "thermo-003", now - timedelta(hours=50), now - timedelta(hours=48)),
        silence(2, "thermo-003", thermo_last, None),
        silence(3, device_id, last_reading - timedelta(minutes=5), None),
        silence(4, device_id, last_reading, None),
        silence(5, "tracker-002", now - timedelta(hours=3), now - timedelta(hours=2)),
        silence(6, "meter-001", now - timedelta(minutes=30), None, status=c.ALERT_WITHDRAWN),
        silence(7, ROGUE, now - timedelta(minutes=45), None),
        silence(
            8, "tracker-002", now - timedelta(hours=2, minutes=30), now - timedelta(hours=2),
            alert_type="late_burst", severity="medium",
            reasons=["40 readings arrived 30 min behind the stream"],
        ),
    ]  # fmt: skip
    _write(root, lake.ALERTS, c.ALERTS_COLUMNS, rows)
    silent = {"thermo-003": thermo_last, device_id: last_reading}
    fixture.extra["silent_since"] = silent
    fixture.extra["silences"] = rows
    return silent


def register_champion(tracking_uri: str, metrics: dict[str, float] | None = None) -> str:
    """Register two versions of MODEL_NAME, the second with alias ``champion``; its version."""
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)
    experiment = client.create_experiment("dashboard-test")
    client.create_registered_model(MODEL_NAME)
    version = ""
    for i in range(2):
        run = client.create_run(experiment)
        for key, value in (metrics or {"pr_auc": 0.91, "f1": 0.84}).items():
            client.log_metric(run.info.run_id, key, value - 0.1 * (1 - i))
        client.log_param(run.info.run_id, "model", "isolation_forest")
        client.set_terminated(run.info.run_id)
        mv = client.create_model_version(
            MODEL_NAME, source=f"{run.info.artifact_uri}/model", run_id=run.info.run_id
        )
        version = str(mv.version)
    client.set_registered_model_alias(MODEL_NAME, "champion", version)
    return version


@functools.cache
def _champion_template() -> tuple[Path, str]:
    # Creating an MLflow SQLite store runs its schema migrations (seconds): do it once per run.
    folder = Path(tempfile.mkdtemp(prefix="mlflow-template-"))
    version = register_champion(f"sqlite:///{folder / 'mlflow.db'}")
    return folder / "mlflow.db", version


def champion_store(folder: Path) -> tuple[str, str]:
    """A SQLite MLflow store in ``folder`` with a champion: (tracking URI, champion version)."""
    template, version = _champion_template()
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(template, folder / "mlflow.db")
    return f"sqlite:///{folder / 'mlflow.db'}", version
