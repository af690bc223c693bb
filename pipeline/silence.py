"""Silent devices: a device that stops reporting, and readings that arrive late in a burst.

A window aggregation cannot see absence: no events, no window. This query keeps, per registered
device, when it last reported and how often it normally does, and sets an event-time timer at
the moment it becomes overdue. When the watermark passes that moment with no reading, the device
is silent: ``device_silent``. When it reports again, the same alert (same ``alert_id``) gets the
end of the silence. A store-and-forward gateway that comes back sends its buffered readings with
their original event times, far behind the stream: counted per device, they raise ``late_burst``.

The query (``pipeline.job``): the topic -> parse -> readings (valid, or quarantined as out of
range or with a clock ahead: a device that sends them is not silent) -> event time, watermarked
-> union with the ``devices`` table read as a stream (registrations, retirements) -> grouped by
bucket -> ``SilenceProcessor`` (``transformWithStateInPandas``, event-time timers) -> alert
changes -> ``SilenceBatchWriter`` (MERGE into ``alerts`` by ``alert_id``, published first).

Why these choices:

- **transformWithStateInPandas**, not applyInPandasWithState: it has event-time timers that fire
  when the watermark passes them, with no input for the key, which is exactly a silence; the
  older API has one timeout per group and no way to read the watermark a reading arrived under.
  It needs the RocksDB state store (``SILENCE_STATE_STORE``), which the other queries need not.
- **Buckets of devices**, not one group per device: every group costs a round trip between the
  Python worker and the JVM's state server, so a group per device makes a 25,000-device batch
  slow. Devices are hashed into ``BUCKETS`` groups; each keeps its devices in one state value (an
  Arrow table) and one timer, at the earliest moment one of them becomes overdue.
- **The watermark on the readings, dropped before grouping**: Spark drops readings behind the
  watermark before a stateful operator sees them, but here they are the signal (a burst). So the
  event time travels as a plain number; the timers still follow the readings' watermark.
- **Event time is capped at the message's Kafka timestamp**: a reading was not taken after it was
  sent, and a device clock running ahead (up to ``max_clock_ahead`` passes the parser) would move
  the watermark, and make every other device overdue.

Semantics (``step``, pure and tested without Spark):

- A device's expected interval is learned from its own gaps between readings in event-time
  order, starting from a prior (``SilenceSpec.prior_s``, per device type if given) that counts
  as ``PRIOR_GAPS`` gaps, then as a moving average. It also remembers its longest normal gap,
  fading with a half-life of ``memory`` event time, so a device that reports in bursts is not
  silent between them.
- It is overdue when ``k`` x its interval (or twice its longest normal gap, if longer) has
  passed since it was last heard from. A gap that long is a silence whenever it is seen: when
  the watermark passes it (the timer), or when the next reading arrives first. A silence is not
  learned as a gap; it raises the longest gap only up to the threshold it passed
  (``Device.remember_silence``), so pauses that come back become normal in a few rounds.
- Heard from: a reading's event time, or the watermark it arrived under if that is later (a
  reading behind the stream still says the device is alive now).
- Late: a reading behind the watermark that is newer than the device's latest reading (so not a
  copy or a replay of one it sent). Consecutive late readings are one burst; ``late_burst_min``
  of them raise ``late_burst``, updated as the burst grows; an on-time reading ends the burst.
- Devices that are not registered (active) are not followed (``rogue_device`` is their alert);
  a device retired in the registry is forgotten, and its open silence ends there.

Exactly once: the state is Spark's, committed with the batch, and a replayed batch sees the
same readings, watermark and state, so it produces the same changes; the MERGE by ``alert_id``
makes writing them again a no-op.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.streaming.stateful_processor import (
    ExpiredTimerInfo,
    StatefulProcessor,
    StatefulProcessorHandle,
    TimerValues,
)

from infra import contract as c
from infra.spark import ROCKSDB_PROVIDER
from pipeline import columns as col
from pipeline.alerts import (
    DETECTOR_COLUMNS,
    Publish,
    alert_id_of,
    empty_alerts,
    records,
    upsert_alerts,
)

log = logging.getLogger(__name__)

SILENT, LATE_BURST = c.SILENCE_ALERT_TYPES
# Groups the devices are hashed into. The state is keyed by it: changing it needs a new
# checkpoint for the silence query.
BUCKETS = 64
# transformWithState keeps its state in RocksDB only.
SILENCE_STATE_STORE = ROCKSDB_PROVIDER
# The prior interval weighs as much as this many of the device's own gaps; then each new gap
# weighs at least MIN_WEIGHT (a moving average over about 20 gaps).
PRIOR_GAPS = 2
MIN_WEIGHT = 0.05
SEVERITY = {SILENT: "high", LATE_BURST: "medium"}

# Input rows of the processor: a reading (``kind`` READING, ``ts`` its event time in ms) or a
# registry row (``kind`` the device's status, ``device_type``).
READING = "reading"
ACTIVE, RETIRED = "active", "retired"
INPUT_SCHEMA = "device_id string, kind string, ts long, device_type string"
# One row per alert change: what ``silence_alerts`` turns into alert rows.
CHANGES_SCHEMA = (
    "device_id string, alert_type string, start_ms long, first_ms long, detected_ms long, "
    "end_ms long, readings long, behind_ms long, interval_ms long, threshold_ms long, "
    "ended_by string"
)
CHANGE_COLUMNS = [part.split()[0] for part in CHANGES_SCHEMA.split(", ")]
ENDED_BY_READING, ENDED_BY_RETIREMENT = "reading", "retirement"


@dataclass(frozen=True)
class SilenceSpec:
    """When a device is overdue, and what a burst is."""

    k: float = 5.0
    prior_s: float = 60.0
    # Prior interval per device type (seconds), where known better than ``prior_s``.
    type_prior_s: dict[str, float] = field(default_factory=dict)
    late_burst_min: int = 10
    memory_s: float = 3600.0  # half-life of a device's longest normal gap, in event time

    def prior_ms(self, device_type: str | None) -> float:
        return 1000.0 * self.type_prior_s.get(device_type or "", self.prior_s)


@dataclass
class Device:
    """What the query knows of one registered device (times in epoch ms, event time)."""

    device_type: str | None = None
    last_ms: int | None = None  # its latest reading
    heard_ms: int | None = None  # when it was last heard from (see the module docstring)
    gaps: int = 0  # gaps learned
    interval_ms: float = math.nan  # expected interval; NaN: the prior's
    longest_ms: float = 0.0  # longest recent normal gap
    # The open silence: its last reading before it, when it was detected, and the threshold then.
    silent_from_ms: int | None = None
    silent_seen_ms: int | None = None
    silent_threshold_ms: int | None = None
    # The open burst of late readings: first and last event times, count.
    burst_from_ms: int | None = None
    burst_to_ms: int | None = None
    burst_readings: int = 0
    burst_behind_ms: int = 0  # how far behind the watermark its oldest reading arrived

    def interval(self, spec: SilenceSpec) -> float:
        return spec.prior_ms(self.device_type) if math.isnan(self.interval_ms) else self.interval_ms

    def threshold_ms(self, spec: SilenceSpec) -> int:
        return round(max(spec.k * self.interval(spec), 2.0 * self.longest_ms))

    def deadline_ms(self, spec: SilenceSpec) -> int | None:
        """When it becomes overdue; None when not followed (never heard from, or silent)."""
        if self.heard_ms is None or self.silent_from_ms is not None:
            return None
        return self.heard_ms + self.threshold_ms(spec)

    def learn(self, gap_ms: int, spec: SilenceSpec) -> None:
        """One normal gap between consecutive readings."""
        weight = max(1.0 / (self.gaps + 1 + PRIOR_GAPS), MIN_WEIGHT)
        current = self.interval(spec)
        self.interval_ms = current + weight * (gap_ms - current)
        fade = 0.5 ** (gap_ms / (1000.0 * spec.memory_s))
        self.longest_ms = max(float(gap_ms), self.longest_ms * fade)
        self.gaps += 1

    def remember_silence(self, gap_ms: int) -> None:
        """A silence that ended: not a normal gap, but a device whose normal has long pauses
        (one that sends in bursts) must not be silent at every pause. Its longest gap takes the
        silence, up to the threshold it passed: a pause that comes back is learned in a few
        rounds (the threshold doubles each time), and one real silence raises the bar at most
        twofold, fading with memory."""
        assert self.silent_threshold_ms is not None
        self.longest_ms = max(self.longest_ms, min(float(gap_ms), float(self.silent_threshold_ms)))


_DEVICE_FIELDS = [f.name for f in fields(Device)]
_DEVICE_SCHEMA = pa.schema(
    [("device_id", pa.string()), ("device_type", pa.string())]
    + [(name, pa.int64()) for name in _DEVICE_FIELDS if name.endswith("_ms") and name not in
       ("interval_ms", "longest_ms")]
    + [("gaps", pa.int64()), ("interval_ms", pa.float64()), ("longest_ms", pa.float64()),
       ("burst_readings", pa.int64())]
)  # fmt: skip
if sorted(_DEVICE_SCHEMA.names) != sorted(["device_id", *_DEVICE_FIELDS]):
    raise RuntimeError("the state's Arrow schema must name every Device field")


def pack(devices: dict[str, Device]) -> bytes:
    """A bucket's devices as one state value: an Arrow IPC stream."""
    columns: dict[str, list[Any]] = {"device_id": list(devices)}
    for name in _DEVICE_FIELDS:
        columns[name] = [getattr(d, name) for d in devices.values()]
    table = pa.Table.from_pydict(columns, schema=_DEVICE_SCHEMA)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, _DEVICE_SCHEMA) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue().to_pybytes())


def unpack(value: bytes | None) -> dict[str, Device]:
    if not value:
        return {}
    table = pa.ipc.open_stream(pa.py_buffer(value)).read_all()
    rows = table.to_pylist()
    return {row.pop("device_id"): Device(**{k: v for k, v in row.items() if k in _DEVICE_FIELDS})
            for row in rows}  # fmt: skip


def _change(device_id: str, alert_type: str, **values: Any) -> dict[str, Any]:
    row: dict[str, Any] = dict.fromkeys(CHANGE_COLUMNS)
    row.update(device_id=device_id, alert_type=alert_type, **values)
    return row


def _silence(device_id: str, d: Device, spec: SilenceSpec, *, end_ms: int | None = None,
             ended_by: str | None = None) -> dict[str, Any]:  # fmt: skip
    """The change of ``d``'s open silence (ended at ``end_ms`` when given)."""
    assert d.silent_from_ms is not None
    return _change(device_id, SILENT, start_ms=d.silent_from_ms, first_ms=d.silent_from_ms,
                   detected_ms=d.silent_seen_ms, end_ms=end_ms, readings=0,
                   interval_ms=round(d.interval(spec)), threshold_ms=d.silent_threshold_ms,
                   ended_by=ended_by)  # fmt: skip


def _burst(device_id: str, d: Device, spec: SilenceSpec) -> dict[str, Any]:
    assert d.burst_from_ms is not None
    return _change(device_id, LATE_BURST, start_ms=d.burst_from_ms, first_ms=d.burst_from_ms,
                   detected_ms=d.burst_to_ms, end_ms=d.burst_to_ms, readings=d.burst_readings,
                   behind_ms=d.burst_behind_ms, interval_ms=round(d.interval(spec)))  # fmt: skip


def _go_silent(device_id: str, d: Device, spec: SilenceSpec, seen_ms: int) -> None:
    d.silent_from_ms = d.last_ms if d.last_ms is not None else d.heard_ms
    d.silent_seen_ms = seen_ms
    d.silent_threshold_ms = d.threshold_ms(spec)


def _read(device_id: str, d: Device, times: np.ndarray, watermark_ms: int,
          spec: SilenceSpec) -> list[dict[str, Any]]:  # fmt: skip
    """Apply one device's readings of a batch (event times, ascending); return its changes."""
    changes: list[dict[str, Any]] = []
    burst_grew = False
    for ts in times.tolist():
        seen = max(ts, watermark_ms)
        overdue_now = d.heard_ms is not None and seen - d.heard_ms > d.threshold_ms(spec)
        if d.silent_from_ms is None and overdue_now:
            # Overdue before the watermark said so: the reading ends a silence seen only now.
            assert d.heard_ms is not None
            _go_silent(device_id, d, spec, d.heard_ms + d.threshold_ms(spec))
        if d.silent_from_ms is not None:
            changes.append(_silence(device_id, d, spec, end_ms=seen, ended_by=ENDED_BY_READING))
            d.remember_silence(seen - d.silent_from_ms)
            d.silent_from_ms = d.silent_seen_ms = d.silent_threshold_ms = None
        elif d.last_ms is not None and ts > d.last_ms:
            d.learn(ts - d.last_ms, spec)
        newer = d.last_ms is None or ts > d.last_ms
        if ts < watermark_ms and newer:
            if d.burst_from_ms is None:
                d.burst_from_ms, d.burst_readings, d.burst_behind_ms = ts, 0, watermark_ms - ts
            d.burst_to_ms = ts
            d.burst_readings += 1
            burst_grew = True
        elif ts >= watermark_ms:
            if burst_grew and d.burst_readings >= spec.late_burst_min:
                changes.append(_burst(device_id, d, spec))
            burst_grew = False
            d.burst_from_ms = d.burst_to_ms = None
            d.burst_readings = d.burst_behind_ms = 0
        d.last_ms = ts if d.last_ms is None else max(d.last_ms, ts)
        d.heard_ms = seen if d.heard_ms is None else max(d.heard_ms, seen)
    if burst_grew and d.burst_readings >= spec.late_burst_min:
        changes.append(_burst(device_id, d, spec))
    return changes


def step(
    devices: dict[str, Device], rows: pd.DataFrame, watermark_ms: int, spec: SilenceSpec
) -> list[dict[str, Any]]:
    """Apply a batch's ``rows`` (INPUT_SCHEMA: registry rows, then readings) to ``devices`` (in
    place) under ``watermark_ms``, then raise the silences it makes due; return the alert
    changes (CHANGE_COLUMNS)."""
    changes: list[dict[str, Any]] = []
    registry = rows[rows["kind"] != READING]
    for device_id, kind, device_type in zip(registry["device_id"], registry["kind"],
                                            registry["device_type"], strict=True):  # fmt: skip
        if kind == RETIRED:
            gone = devices.pop(device_id, None)
            if gone is not None and gone.silent_from_ms is not None:
                changes.append(_silence(device_id, gone, spec, end_ms=watermark_ms,
                                        ended_by=ENDED_BY_RETIREMENT))  # fmt: skip
        elif kind == ACTIVE:
            devices.setdefault(device_id, Device()).device_type = device_type
    readings = rows[rows["kind"] == READING].sort_values(["device_id", "ts"], kind="stable")
    for device_id, times in readings.groupby("device_id", sort=False)["ts"]:
        d = devices.get(str(device_id))
        if d is not None:
            changes += _read(str(device_id), d, times.to_numpy(np.int64), watermark_ms, spec)
    return changes + overdue(devices, watermark_ms, spec)


def overdue(
    devices: dict[str, Device], watermark_ms: int, spec: SilenceSpec
) -> list[dict[str, Any]]:
    """Raise ``device_silent`` for the devices whose deadline the watermark has reached."""
    changes = []
    for device_id, d in devices.items():
        deadline = d.deadline_ms(spec)
        if deadline is not None and deadline <= watermark_ms:
            _go_silent(device_id, d, spec, watermark_ms)
            changes.append(_silence(device_id, d, spec))
    return changes


def next_deadline(devices: dict[str, Device], spec: SilenceSpec) -> int | None:
    deadlines = [t for d in devices.values() if (t := d.deadline_ms(spec)) is not None]
    return min(deadlines) if deadlines else None


class SilenceProcessor(StatefulProcessor):
    """One bucket of devices (``step``): its devices in one state value, one event-time timer at
    the earliest deadline among them."""

    def __init__(self, spec: SilenceSpec) -> None:
        self.spec = spec

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.devices = handle.getValueState("devices", "devices binary")

    # Spark's names for the hooks and their keyword arguments.
    def handleInputRows(  # noqa: N802
        self,
        key: Any,
        rows: Iterator[Any],
        timerValues: TimerValues,  # noqa: N803
    ) -> Iterator[pd.DataFrame]:
        frame = pd.concat(list(rows), ignore_index=True)
        yield from self._advance(frame, timerValues.getCurrentWatermarkInMs())

    def handleExpiredTimer(  # noqa: N802
        self,
        key: Any,
        timerValues: TimerValues,  # noqa: N803
        expiredTimerInfo: ExpiredTimerInfo,  # noqa: N803
    ) -> Iterator[pd.DataFrame]:
        no_rows = pd.DataFrame({name: pd.Series(dtype="object") for name in ("device_id", "kind",
                                "ts", "device_type")})  # fmt: skip
        yield from self._advance(no_rows, timerValues.getCurrentWatermarkInMs())

    def _advance(self, rows: pd.DataFrame, watermark_ms: int) -> Iterator[pd.DataFrame]:
        held = self.devices.get()
        devices = unpack(held[0] if held else None)
        changes = step(devices, rows, max(watermark_ms, 0), self.spec)
        # ``clear`` leaves timers behind: each is deleted by its time.
        for timer in list(self.handle.listTimers()):
            self.handle.deleteTimer(timer)
        if devices:
            self.devices.update((pack(devices),))
            deadline = next_deadline(devices, self.spec)
            if deadline is not None:
                self.handle.registerTimer(deadline)
        else:
            self.devices.clear()
        if changes:
            yield pd.DataFrame(changes, columns=CHANGE_COLUMNS)

    def close(self) -> None:
        pass


# --- Spark --------------------------------------------------------------------------------------


def reading_time() -> Column:
    """A reading's event time, capped at its message's Kafka timestamp (module docstring)."""
    return F.least(F.col("event_time"), F.col("kafka_timestamp"))


def silence_input(readings: DataFrame, registry: DataFrame, *, watermark: str) -> DataFrame:
    """The processor's input: ``readings`` (``events_and_flagged`` rows) as event times under
    ``watermark``, and ``registry`` (the ``devices`` table as a stream) as status rows."""
    timed = readings.select("device_id", reading_time().alias("_t")).withWatermark("_t", watermark)
    heard = timed.select(
        "device_id", F.lit(READING).alias("kind"), F.unix_millis("_t").alias("ts"),
        F.lit(None).cast("string").alias("device_type"),
    )  # fmt: skip
    status = registry.select(
        "device_id", F.col("status").alias("kind"), F.lit(None).cast("long").alias("ts"),
        "device_type",
    )  # fmt: skip
    return heard.unionByName(status)


def silence_changes(rows: DataFrame, spec: SilenceSpec) -> DataFrame:
    """Alert changes (CHANGES_SCHEMA) from ``silence_input`` rows."""
    bucket = F.pmod(F.xxhash64("device_id"), F.lit(BUCKETS))
    return (
        rows.withColumn("bucket", bucket)
        .groupBy("bucket")
        .transformWithStateInPandas(SilenceProcessor(spec), CHANGES_SCHEMA, "Update", "EventTime")
    )


# --- Alert rows ---------------------------------------------------------------------------------


def _time(ms: pd.Series) -> pd.Series:
    return pd.to_datetime(ms, unit="ms")


def _span(ms: float) -> str:
    """``ms`` as people read a duration: 45 s, 4 min 10 s, 2 h 5 min."""
    s = round(ms / 1000)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s" if s % 60 else f"{s // 60} min"
    return f"{s // 3600} h {s % 3600 // 60} min" if s % 3600 // 60 else f"{s // 3600} h"


def _clock(ms: int) -> str:
    return pd.Timestamp(ms, unit="ms").strftime("%Y-%m-%d %H:%M:%S UTC")


def _reasons(row: dict[str, Any]) -> list[str]:
    if row["alert_type"] == LATE_BURST:
        return [
            f"{row['readings']} readings arrived late, the oldest {_span(row['behind_ms'])} "
            f"behind the stream (event times {_clock(row['first_ms'])} to "
            f"{_clock(row['end_ms'])}): readings sent in a burst after the device was offline"
        ]
    reasons = [
        f"no reading since {_clock(row['first_ms'])} for over {_span(row['threshold_ms'])} "
        f"(it reports about every {_span(row['interval_ms'])})"
    ]
    if row["ended_by"] == ENDED_BY_READING:
        reasons.append(f"reported again at {_clock(row['end_ms'])}, after "
                       f"{_span(row['end_ms'] - row['first_ms'])}")  # fmt: skip
    elif row["ended_by"] == ENDED_BY_RETIREMENT:
        reasons.append(f"retired in the registry at {_clock(row['end_ms'])}")
    return reasons


def silence_alerts(changes: pd.DataFrame) -> pd.DataFrame:
    """Alert rows (DETECTOR_COLUMNS) of the processor's ``changes``; the latest change of an
    alert wins."""
    if changes.empty:
        return empty_alerts()
    rows = changes.copy()
    rows["window_start"] = _time(rows["start_ms"]).dt.floor("s")
    alerts = pd.DataFrame({
        "device_id": rows["device_id"],
        "alert_type": rows["alert_type"],
        "severity": rows["alert_type"].map(SEVERITY),
        "score": 1.0,
        "reasons": [_reasons(r) for r in records(rows)],
        "model_name": None,
        "model_version": None,
        col.WINDOW_START: rows["window_start"],
        col.WINDOW_END: _time(rows["end_ms"]),
        "first_event_time": _time(rows["first_ms"]),
        "last_event_time": _time(rows["detected_ms"]),
    })  # fmt: skip
    keys = zip(alerts["device_id"], alerts["alert_type"], alerts[col.WINDOW_START], strict=True)
    alerts["alert_id"] = [alert_id_of(d, t, s) for d, t, s in keys]
    alerts = alerts.drop_duplicates("alert_id", keep="last")
    return alerts[list(DETECTOR_COLUMNS)].reset_index(drop=True)


@dataclass
class SilenceBatchWriter:
    """``foreachBatch`` of the silence query: its alert changes MERGEd into ``alerts`` (a
    replayed batch changes nothing), published first with ``publish``."""

    alerts_path: str
    publish: Publish | None = None

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        changes = batch.toPandas()
        if changes.empty:  # most batches: nobody fell silent or came back
            return
        upsert_alerts(batch.sparkSession, silence_alerts(changes), batch_id,
                      path=self.alerts_path, publish=self.publish)  # fmt: skip
