"""The data contracts, defined once: telemetry event, Delta tables, scenario and alert names.

Column lists are ``(name, type)`` pairs in Spark SQL type syntax; ``spark_ddl`` and
``arrow_schema`` turn them into what Spark, the simulator (deltalake) and the dashboard need.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow as pa

Columns = tuple[tuple[str, str], ...]

# --- Telemetry event: JSON value on Kafka, key = device_id (UTF-8) -------------------------------
METRICS = (
    "temperature_c", "humidity_pct", "voltage_v", "current_a",
    "power_w", "battery_pct", "signal_dbm",
)  # fmt: skip
# Metrics a stuck sensor can freeze: the simulator injects it on one of them, the pipeline counts
# their share of distinct readings. Not the battery: a full one legitimately reads 100 for hours.
REPEAT_METRICS = tuple(m for m in METRICS if m != "battery_pct")

# The event as sent: metrics nested under "metrics"; event_time an ISO-8601 UTC string.
EVENT_FIELDS: Columns = (
    ("event_id", "string"),
    ("device_id", "string"),
    ("event_time", "string"),
    ("seq", "long"),
    ("firmware", "string"),
    ("lat", "double"),
    ("lon", "double"),
    ("metrics", "struct<" + ",".join(f"{m}:double" for m in METRICS) + ">"),
)
REQUIRED_FIELDS = ("event_id", "device_id", "event_time", "seq")

# Values outside these closed ranges are impossible and go to quarantine.
VALID_RANGES: dict[str, tuple[float, float]] = {
    "lat": (-90.0, 90.0),
    "lon": (-180.0, 180.0),
    "seq": (0, 2**62),
    "temperature_c": (-80.0, 200.0),
    "humidity_pct": (0.0, 100.0),
    "voltage_v": (0.0, 1000.0),
    "current_a": (0.0, 1000.0),
    "power_w": (0.0, 1_000_000.0),
    "battery_pct": (0.0, 100.0),
    "signal_dbm": (-150.0, 0.0),
}
MAX_MESSAGE_BYTES = 64 * 1024
MAX_ID_LENGTH = 128

# Device types and the sensors each has (a missing sensor is sent as null).
DEVICE_TYPES: dict[str, tuple[str, ...]] = {
    "smart_meter": ("voltage_v", "current_a", "power_w", "signal_dbm", "temperature_c"),
    "gps_tracker": ("battery_pct", "signal_dbm", "temperature_c"),
    "industrial_sensor": ("temperature_c", "humidity_pct", "voltage_v", "current_a", "power_w"),
    "thermostat": ("temperature_c", "humidity_pct", "battery_pct", "signal_dbm"),
}

# --- Authorized firmware update: JSON value on topic iot.firmware_updates, key = device_id -------
# A device reporting a firmware other than its registered one, with no update for that device and
# firmware authorized around that time, raises a ``firmware_tamper`` alert.
FIRMWARE_UPDATE_FIELDS: Columns = (
    ("update_id", "string"),
    ("device_id", "string"),
    ("firmware", "string"),
    ("authorized_at", "string"),  # ISO-8601 UTC
)
FIRMWARE_UPDATE_REQUIRED = ("device_id", "firmware", "authorized_at")

# --- Quarantine reason codes ---------------------------------------------------------------------
REASON_INVALID_UTF8 = "invalid_utf8"
REASON_INVALID_JSON = "invalid_json"
REASON_MISSING_FIELD = "missing_field"
REASON_WRONG_TYPE = "wrong_type"
REASON_BAD_TIMESTAMP = "bad_timestamp"
# An event_time too far ahead of the time its message was sent: a device clock running ahead.
REASON_CLOCK_AHEAD = "clock_ahead"
REASON_OUT_OF_RANGE = "out_of_range"
REASON_OVERSIZE = "oversize"
REASON_KEY_MISMATCH = "key_mismatch"
# A valid copy of an event already in ``telemetry`` (same event_id): kept in quarantine, counted.
REASON_DUPLICATE = "duplicate"
REASONS = (
    REASON_INVALID_UTF8, REASON_INVALID_JSON, REASON_MISSING_FIELD, REASON_WRONG_TYPE,
    REASON_BAD_TIMESTAMP, REASON_CLOCK_AHEAD, REASON_OUT_OF_RANGE, REASON_OVERSIZE,
    REASON_KEY_MISMATCH, REASON_DUPLICATE,
)  # fmt: skip

# --- Scenarios the simulator injects, and the alert types that detect them -----------------------
SCENARIOS = (
    "tampering", "spike", "dip", "stuck_sensor", "drift", "impossible_travel", "cloned_device",
    "replay", "flood", "rogue_device", "firmware_change", "clock_skew", "malformed", "silence",
    "store_and_forward",
)  # fmt: skip
# Fraud scenarios are the ones detection is scored on; clock_skew and malformed test robustness.
FRAUD_SCENARIOS = tuple(s for s in SCENARIOS if s not in ("clock_skew", "malformed"))
# Scenarios seen in what a device did not send, or sent late (``pipeline.silence``), not in its
# readings: no window shows them, so the model is neither trained nor scored on them.
ABSENCE_SCENARIOS = ("silence", "store_and_forward")

ALERT_TYPES = (
    "tampering", "spike", "dip", "stuck_sensor", "drift", "impossible_travel", "cloned_device",
    "replay", "flood", "rogue_device", "firmware_mismatch", "firmware_tamper", "model_anomaly",
    "impossible_reading", "clock_ahead", "device_silent", "late_burst",
)  # fmt: skip
# Alert types of the silence query (``pipeline.silence``): a device that stopped reporting, and
# readings that arrived far behind the stream in a burst. A ``device_silent`` alert runs from the
# device's last reading (``first_event_time``) to the time it was heard from again
# (``window_end``, null while it is still silent); ``last_event_time`` is the stream's event time
# when the silence was detected.
SILENCE_ALERT_TYPES = ("device_silent", "late_burst")
# Alert types one event decides: the fast path (pipeline.fastpath) raises them per event too.
# impossible_reading and clock_ahead are raised from quarantined readings (reasons out_of_range
# and clock_ahead) of registered devices: the reading stays out of the features, the device is
# flagged.
PER_EVENT_ALERT_TYPES = ("rogue_device", "firmware_mismatch", "impossible_reading", "clock_ahead")
# The quarantine reason behind each alert type raised from a quarantined reading.
QUARANTINE_ALERT_TYPES = {
    REASON_OUT_OF_RANGE: "impossible_reading",
    REASON_CLOCK_AHEAD: "clock_ahead",
}
# A model's score in [0, 1] raises model_anomaly at or above this, unless the registered model
# carries its own "threshold" in its metadata.
MODEL_ALERT_THRESHOLD = 0.5
# An injected scenario counts as detected by an alert of one of these types on the same device.
SCENARIO_ALERT_TYPES: dict[str, tuple[str, ...]] = {
    "tampering": ("tampering", "model_anomaly"),
    "spike": ("spike", "model_anomaly"),
    "dip": ("dip", "model_anomaly"),
    "stuck_sensor": ("stuck_sensor", "model_anomaly"),
    "drift": ("drift", "model_anomaly"),
    "impossible_travel": ("impossible_travel", "cloned_device"),
    "cloned_device": ("cloned_device", "impossible_travel"),
    "replay": ("replay",),
    "flood": ("flood",),
    "rogue_device": ("rogue_device",),
    "firmware_change": ("firmware_mismatch", "firmware_tamper"),
    "silence": ("device_silent",),
    "store_and_forward": ("late_burst", "device_silent"),
    # Robustness scenarios: not scored for recall (most malformed messages raise no alert), but
    # the alerts they cause are true ones.
    "malformed": ("impossible_reading",),
    "clock_skew": ("clock_ahead",),
}
SEVERITIES = ("low", "medium", "high", "critical")

# --- Delta tables --------------------------------------------------------------------------------
DEVICES_COLUMNS: Columns = (
    ("device_id", "string"),
    ("device_type", "string"),
    ("owner", "string"),
    ("site_address", "string"),
    ("site_lat", "double"),
    ("site_lon", "double"),
    ("expected_firmware", "string"),
    ("plan", "string"),
    ("install_date", "date"),
    ("status", "string"),  # active | retired
    ("updated_at", "timestamp"),
)

GROUND_TRUTH_COLUMNS: Columns = (
    ("scenario_id", "string"),
    ("device_id", "string"),
    ("scenario", "string"),
    ("start_time", "timestamp"),
    ("end_time", "timestamp"),
    ("details", "string"),
    ("run_id", "string"),
)

TELEMETRY_COLUMNS: Columns = (
    ("event_id", "string"),
    ("device_id", "string"),
    ("event_time", "timestamp"),
    ("seq", "long"),
    ("firmware", "string"),
    ("lat", "double"),
    ("lon", "double"),
    *((m, "double") for m in METRICS),
    ("extra", "map<string,string>"),
    ("kafka_topic", "string"),
    ("kafka_partition", "int"),
    ("kafka_offset", "long"),
    ("kafka_timestamp", "timestamp"),
    ("ingest_time", "timestamp"),
)

QUARANTINE_COLUMNS: Columns = (
    ("raw_value", "binary"),
    ("raw_key", "string"),
    ("reason", "string"),
    ("detail", "string"),
    # Filled when parsing got that far (always for duplicates).
    ("device_id", "string"),
    ("event_id", "string"),
    ("event_time", "timestamp"),
    ("kafka_topic", "string"),
    ("kafka_partition", "int"),
    ("kafka_offset", "long"),
    ("kafka_timestamp", "timestamp"),
    ("ingest_time", "timestamp"),
)

FIRMWARE_UPDATES_COLUMNS: Columns = (
    ("update_id", "string"),
    ("device_id", "string"),
    ("firmware", "string"),
    ("authorized_at", "timestamp"),
    ("kafka_topic", "string"),
    ("kafka_partition", "int"),
    ("kafka_offset", "long"),
    ("kafka_timestamp", "timestamp"),
    ("ingest_time", "timestamp"),
)

ALERTS_COLUMNS: Columns = (
    ("alert_id", "string"),
    ("device_id", "string"),
    ("alert_type", "string"),
    ("severity", "string"),
    ("score", "double"),
    ("reasons", "array<string>"),
    ("model_name", "string"),
    ("model_version", "string"),
    ("window_start", "timestamp"),
    ("window_end", "timestamp"),
    ("first_event_time", "timestamp"),
    ("last_event_time", "timestamp"),
    ("status", "string"),  # ALERT_STATUSES; null in rows written before the column existed
    ("detected_at", "timestamp"),
    ("batch_id", "long"),
)
# Each detector writes alerts of its own types only, from its own query's thread (windowed
# detection, firmware, silence). Delta (Serializable isolation, the only level it offers) fails a
# MERGE when another commit added files it should have read; it tells which by partition. So
# partitioned by type, one detector's appends and MERGEs never make another's MERGE fail, and none
# waits for another's.
ALERTS_PARTITIONED_BY = ("alert_type",)
# --- Alert messages: JSON value on the alerts topic, key = device_id ----------------------------
# A windowed message is an ``alerts`` row plus ``path`` "windowed"; a fast-path message (per-event
# checks, ``pipeline.fastpath``) is these columns, with ``path`` "fast" and the event that raised
# it and its telemetry message.
FAST_MESSAGE_COLUMNS: Columns = (
    *ALERTS_COLUMNS,
    ("path", "string"),
    ("event_id", "string"),
    ("kafka_partition", "int"),
    ("kafka_offset", "long"),
    ("kafka_timestamp", "timestamp"),
)
# What the fast path (per-event checks, Real-time Mode) published to the alerts topic: one row per
# message, so an alert's first row says when the fast path raised it. The windowed path's row of
# the same alert_id, if any, is in ``alerts``.
FAST_ALERTS_COLUMNS: Columns = (
    ("alert_id", "string"),
    ("device_id", "string"),
    ("alert_type", "string"),
    ("window_start", "timestamp"),
    ("event_id", "string"),
    ("event_time", "timestamp"),
    ("kafka_partition", "int"),  # of the telemetry message that raised it
    ("kafka_offset", "long"),
    ("kafka_timestamp", "timestamp"),
    ("published_at", "timestamp"),  # the alert message's Kafka timestamp
)
# A rule alert raised on a window still filling is provisional: when the watermark closes the
# window, the rules decide once more on its final state, and an alert they no longer call for is
# withdrawn (kept, marked). Every other alert stands as raised.
ALERT_RAISED, ALERT_WITHDRAWN = "raised", "withdrawn"
ALERT_STATUSES = (ALERT_RAISED, ALERT_WITHDRAWN)

ALERT_FEEDBACK_COLUMNS: Columns = (
    ("alert_id", "string"),
    ("verdict", "string"),  # true_positive | false_positive
    ("note", "string"),
    ("analyst", "string"),
    ("created_at", "timestamp"),
)
VERDICTS = ("true_positive", "false_positive")

PIPELINE_METRICS_COLUMNS: Columns = (
    ("query_name", "string"),
    ("run_id", "string"),
    ("batch_id", "long"),
    ("timestamp", "timestamp"),
    ("num_input_rows", "long"),
    ("input_rows_per_second", "double"),
    ("processed_rows_per_second", "double"),
    ("batch_duration_ms", "long"),
    ("watermark", "timestamp"),
    ("state_rows", "long"),
    ("late_rows_dropped", "long"),
    # Where the batch ended in each Kafka topic it reads, {topic: {partition: offset}} as JSON
    # (null for a query without one): which messages a batch read, after the checkpoint's own
    # record of it is purged (``spark.sql.streaming.minBatchesToRetain``).
    ("kafka_end_offsets", "string"),
)
# What Spark reports as a query's watermark before it has one; ``watermark`` is null then.
NO_WATERMARK = datetime(1970, 1, 1, tzinfo=timezone.utc)

EVALUATION_COLUMNS: Columns = (
    ("evaluated_at", "timestamp"),
    ("scenario", "string"),
    ("injected", "long"),
    ("detected", "long"),
    ("alerts", "long"),
    ("true_positive_alerts", "long"),
    ("precision", "double"),
    ("recall", "double"),
    ("f1", "double"),
    ("median_time_to_detect_s", "double"),
)


def spark_ddl(columns: Columns) -> str:
    """``"a string, b double"`` for ``spark.createDataFrame`` or ``from_json``."""
    return ", ".join(f"`{name}` {type_}" for name, type_ in columns)


def column_names(columns: Columns) -> list[str]:
    return [name for name, _ in columns]


def arrow_schema(columns: Columns) -> pa.Schema:
    """The pyarrow schema for writing with ``deltalake`` (UTC timestamps in microseconds)."""
    import pyarrow as pa

    return pa.schema([pa.field(name, _arrow_type(type_)) for name, type_ in columns])


def _arrow_type(type_: str) -> pa.DataType:
    import pyarrow as pa

    simple = {
        "string": pa.string(),
        "double": pa.float64(),
        "long": pa.int64(),
        "int": pa.int32(),
        "boolean": pa.bool_(),
        "binary": pa.binary(),
        "date": pa.date32(),
        "timestamp": pa.timestamp("us", tz="UTC"),
    }
    if type_ in simple:
        return simple[type_]
    if type_.startswith("array<") and type_.endswith(">"):
        return pa.list_(_arrow_type(type_[6:-1]))
    if type_ == "map<string,string>":
        return pa.map_(pa.string(), pa.string())
    raise ValueError(f"no arrow type for {type_!r}")
