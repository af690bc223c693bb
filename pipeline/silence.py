"""Silent devices: a device that stops reporting, and readings that arrive late in a burst.

A window aggregation cannot see absence: no events, no window. This query keeps, per registered
device, when it last reported and how often it normally does. When the stream's event time
passes the moment it becomes overdue with no reading from it, the device is silent:
``device_silent``. When it reports again, the same alert (same ``alert_id``) gets the end of the
silence. A store-and-forward gateway that comes back sends its buffered readings with their
original event times, behind what it sent before them: counted per device, they raise
``late_burst``.

The query (``pipeline.job``): the topic -> who sent each record and when
(``transforms.senders``) joined with the registry -> grouped by Kafka partition ->
``SilenceProcessor`` (``transformWithStateInPandas``) -> alert changes -> ``SilenceBatchWriter``
(new alerts appended to ``alerts``, changes MERGEd by ``alert_id``, published first). The
``devices`` table read as a stream brings retirements. It reads the topic, not the bronze
tables: ``telemetry`` and ``quarantine`` are two Delta streams, committed side by side, so a
device's quarantined readings could arrive after its partition's later valid ones, and a device
whose every reading is quarantined (a clock hours ahead) would look silent meanwhile
(docs/PERFORMANCE.md measured both). And it reads only who sent a record and when, not the whole
event: that is all it needs, and a third of the cost of the full parse (docs/PERFORMANCE.md). So
a record quarantined for its content (a reading out of range, a missing metric) is a reading
here: its device sent it then.

Why these choices:

- **The stream's time is each Kafka partition's own.** A device's messages all go to one
  partition (keyed by device_id), in the order they were sent. Spark's watermark is one for the
  whole stream, the newest event time of any partition: when a query catches up on a backlog
  (after a restart, or in a burst of traffic), partitions are read to different event times, and
  against that watermark the devices of a partition read behind would be silent, and their
  readings late, for no fault of theirs. So each partition keeps its own clock, the newest event
  time read from it, and readings are taken in offset order: whether a device is overdue, or a
  reading late, depends only on what the partition held before it, not on how the input was cut
  into micro-batches. A replay after a crash, a catch-up and a live run decide the same.
- **transformWithStateInPandas** (not applyInPandasWithState) for its **event-time timers**: a
  partition that receives nothing (every device on it quiet, or its producer gone) has no
  reading to move its clock. A timer at its earliest deadline fires when Spark's watermark (the
  newest event time of the whole stream, less ``SilenceSpec.lateness_ms``) passes it in a
  micro-batch that brought the partition nothing: it is idle, and its clock is the stream's (a
  micro-batch that brought it records but no reading idles it the same way, in ``step``).
  The older API has one timeout per group, and no watermark to read in it. It needs the RocksDB
  state store (``SILENCE_STATE_STORE``), which the other queries need not.
- **One group per partition**, its devices in one state value (an Arrow table): a group per
  device would cost a round trip between the Python worker and the JVM's state server for each.
- **The watermark is on the readings, and dropped before grouping**: Spark drops rows behind the
  watermark before a stateful operator sees them, but here late rows are the signal (a burst).
- **Event time is capped at the message's Kafka timestamp**: a reading was not taken after it was
  sent, and a device clock running ahead (up to ``max_clock_ahead`` passes the parser) would move
  its partition's clock, and make the partition's other devices overdue.

Semantics (``Partition``, pure and tested without Spark):

- A device's expected interval is learned from its own gaps between readings in event-time
  order, starting from a prior (``SilenceSpec.prior_s``, per device type if given) that counts
  as ``PRIOR_GAPS`` gaps, then as a moving average. It also remembers its longest normal gap,
  fading with a half-life of ``memory`` event time, so a device that reports in bursts is not
  silent between them.
- It is overdue when ``k`` x its interval (or twice its longest normal gap, if longer) has
  passed since it was last heard from, on its partition's clock less ``lateness_ms`` (the
  allowance for readings of one partition arriving out of order). A gap that long is a silence
  however it is seen: the clock passing it, or the device's next reading. A silence is not
  learned as a gap; it raises the longest gap only up to the threshold it passed
  (``Device.remember_silence``), so pauses that come back become normal in a few rounds.
- **The feed's silence is not a device's.** A span in which a partition brought nothing at all,
  longer than a device's threshold, seen when a reading moves the clock over it (the stream's
  watermark did not move it meanwhile: no partition brought anything newer, or its devices would
  have been found overdue on the way), is not counted in that device's silence, nor learned as
  its gap: its deadline moves on by the span. A fleet does not fall silent as one; a producer
  stopped, a network cut upstream of Kafka, or the demo run again an hour later do, and raising
  ``device_silent`` for every device then would bury the devices that are. A partition whose
  feed stops while the others flow is different: the watermark moves, its timer fires, and its
  devices are silent, as they are to anyone watching. So a fleet of one device, whose every gap
  is the whole feed's, shows a silence only through the watermark of other partitions.
- Heard from: a reading's event time, or the partition's time when it arrived if that is later
  (a reading behind the stream still says the device is alive now). A record whose event time
  is ahead of its Kafka timestamp (a clock ahead, ``PipelineSettings.max_clock_ahead``) says
  the device is alive at the partition's time, and nothing more.
- Late: a reading more than ``lateness_ms`` behind its partition's clock that is newer than the
  device's latest reading (so not a copy or a replay of one it sent). Consecutive late readings
  are one burst; ``late_burst_min`` of them raise ``late_burst``, updated as the burst grows; an
  on-time reading ends the burst.
- Devices that are not registered are not followed (``rogue_device`` is their alert); a device
  retired in the registry is forgotten, and its open silence ends there: state is bounded by the
  fleet.

Exactly once: the state is Spark's, committed with the batch, and a replayed batch reads the
same offsets into the same state, so it produces the same changes; the writer knows the alerts
the table holds (``SilenceBatchWriter``), so writing them again changes nothing.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field, fields
from typing import Any

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
    WrittenAlerts,
    alert_id_of,
    alert_writes,
    empty_alerts,
    records,
)
from pipeline.features import with_device

SILENT, LATE_BURST = c.SILENCE_ALERT_TYPES
# transformWithState keeps its state in RocksDB only.
SILENCE_STATE_STORE = ROCKSDB_PROVIDER
# The prior interval weighs as much as this many of the device's own gaps; then each new gap
# weighs at least MIN_WEIGHT (a moving average over about 20 gaps).
PRIOR_GAPS = 2
MIN_WEIGHT = 0.05
SEVERITY = {SILENT: "high", LATE_BURST: "medium"}
# How long, in event time, the writer remembers an alert that ended: a silence raised again with
# the same start comes soon after it ended (``SilenceBatchWriter``); later, the MERGE finds it.
KNOWN_FOR = pd.Timedelta(hours=6)

# Input rows of the processor, grouped by ``partition``: a reading (``kind`` READING, ``ts`` its
# event time in ms, ``offset`` its Kafka offset, ``registered``); a record whose device's clock
# runs ahead (``kind`` ALIVE, ``ts`` null: its time is wrong); a retirement (``kind`` RETIRED,
# from the registry, sent to every partition); or a record that names no device with a sound
# event time (``kind`` null: skipped).
READING, ALIVE, RETIRED = "reading", "alive", "retired"
INPUT_SCHEMA = (
    "partition int, offset long, device_id string, kind string, ts long, device_type string, "
    "registered boolean"
)
INPUT_COLUMNS = [part.split()[0] for part in INPUT_SCHEMA.split(", ")]
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
    lateness_ms: int = 10_000  # how far behind its partition's clock a reading is still on time
    memory_s: float = 3600.0  # half-life of a device's longest normal gap, in event time

    def prior_ms(self, device_type: str | None) -> float:
        return 1000.0 * self.type_prior_s.get(device_type or "", self.prior_s)


@dataclass
class Device:
    """What the query knows of one registered device (times in epoch ms, event time)."""

    device_type: str | None = None
    last_ms: int | None = None  # its latest reading
    # When it was last heard from (see the module docstring), moved on by the feed's gaps since.
    heard_ms: int | None = None
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
    burst_behind_ms: int = 0  # how far behind the stream its oldest reading arrived
    # The feed's gaps since its latest reading: left out of the next gap it learns.
    paused_ms: int = 0

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
_DEVICE_DEFAULTS = {f.name: f.default for f in fields(Device)}
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
    """A partition's devices as one state value: an Arrow IPC stream."""
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
    columns = pa.ipc.open_stream(pa.py_buffer(value)).read_all().to_pydict()
    ids = columns.pop("device_id")
    # A field added since the state was written (a checkpoint of an older version) takes its
    # default.
    for name in _DEVICE_FIELDS:
        if name not in columns:
            columns[name] = [_DEVICE_DEFAULTS[name]] * len(ids)
    # Column by column, and Device's fields by position: every batch loads every device of
    # the partition, and row dicts with keyword arguments cost several times as much.
    values = [columns[name] for name in _DEVICE_FIELDS]
    return {device_id: Device(*row) for device_id, *row in zip(ids, *values, strict=True)}


def _change(device_id: str, alert_type: str, **values: Any) -> dict[str, Any]:
    row: dict[str, Any] = dict.fromkeys(CHANGE_COLUMNS)
    row.update(device_id=device_id, alert_type=alert_type, **values)
    return row


@dataclass
class Partition:
    """The devices of one Kafka partition and its clock: the newest event time read from it.

    ``read``, ``retire`` and ``idle`` change it and return the alert changes they make
    (CHANGE_COLUMNS); ``next_deadline`` is when its earliest device becomes overdue.
    """

    spec: SilenceSpec
    devices: dict[str, Device] = field(default_factory=dict)
    clock_ms: int | None = None
    # Lower bounds, made exact by ``next_deadline``: no device is overdue before ``_due_from``
    # (devices reporting move theirs later), and no device's threshold is below ``_shortest``.
    _due_from: float = field(default=-math.inf, repr=False)
    _shortest: float = field(default=0.0, repr=False)

    @property
    def now_ms(self) -> int | None:
        """The partition's time: its clock less the lateness allowed to its readings."""
        return None if self.clock_ms is None else self.clock_ms - self.spec.lateness_ms

    def read(self, device_id: str, ts: int, device_type: str | None) -> list[dict[str, Any]]:
        """A registered device's reading at event time ``ts``, the next in the partition."""
        self._pause(ts)
        spec, now = self.spec, self.now_ms
        d = self.devices.setdefault(device_id, Device(device_type=device_type))
        seen = ts if now is None else max(ts, now)
        changes: list[dict[str, Any]] = []
        if d.silent_from_ms is None and d.heard_ms is not None:
            threshold = d.threshold_ms(spec)
            if seen - d.heard_ms > threshold:
                # Overdue before the clock said so: the reading ends a silence seen only now.
                self._go_silent(d, d.heard_ms + threshold)
        if d.silent_from_ms is not None:
            changes.append(self._silence(device_id, d, end_ms=seen, ended_by=ENDED_BY_READING))
            d.remember_silence(seen - d.silent_from_ms)
            d.silent_from_ms = d.silent_seen_ms = d.silent_threshold_ms = None
        elif d.last_ms is not None and ts - d.last_ms > d.paused_ms:
            d.learn(ts - d.last_ms - d.paused_ms, spec)
        newer = d.last_ms is None or ts > d.last_ms
        if now is not None and ts < now and newer:
            if d.burst_from_ms is None:
                d.burst_from_ms, d.burst_readings, d.burst_behind_ms = ts, 0, now - ts
            d.burst_to_ms = ts
            d.burst_readings += 1
            if d.burst_readings >= spec.late_burst_min:
                changes.append(self._burst(device_id, d))
        elif now is None or ts >= now:
            d.burst_from_ms = d.burst_to_ms = None
            d.burst_readings = d.burst_behind_ms = 0
        if d.last_ms is None or ts > d.last_ms:
            d.last_ms, d.paused_ms = ts, 0
        d.heard_ms = seen if d.heard_ms is None else max(d.heard_ms, seen)
        self._follow(d)
        if self.clock_ms is None or ts > self.clock_ms:
            changes += self._advance(ts)
        return changes

    def alive(self, device_id: str, device_type: str | None) -> list[dict[str, Any]]:
        """A record of a registered device whose clock runs ahead: the device is alive at the
        partition's time. Its event time is wrong, so it says nothing of its interval, and
        moves no clock; a silence still counts from the device's last reading."""
        when = self.now_ms
        if when is None:
            return []
        d = self.devices.setdefault(device_id, Device(device_type=device_type))
        changes = []
        if d.silent_from_ms is not None and when > d.silent_from_ms:
            changes.append(self._silence(device_id, d, end_ms=when, ended_by=ENDED_BY_READING))
            d.remember_silence(when - d.silent_from_ms)
            d.silent_from_ms = d.silent_seen_ms = d.silent_threshold_ms = None
        d.heard_ms = when if d.heard_ms is None else max(d.heard_ms, when)
        self._follow(d)
        return changes

    def pass_by(self, ts: int) -> list[dict[str, Any]]:
        """A reading of a device not followed (not registered): only the clock moves."""
        if self.clock_ms is None or ts > self.clock_ms:
            self._pause(ts)
            return self._advance(ts)
        return []

    def retire(self, device_id: str) -> list[dict[str, Any]]:
        """The registry retired ``device_id``: forget it, and end its silence."""
        gone = self.devices.pop(device_id, None)
        if gone is None or gone.silent_from_ms is None or self.now_ms is None:
            return []
        return [self._silence(device_id, gone, end_ms=self.now_ms, ended_by=ENDED_BY_RETIREMENT)]

    def idle(self, stream_ms: int) -> list[dict[str, Any]]:
        """Nothing arrived from the partition while the stream reached ``stream_ms`` (its newest
        event time): the partition's clock is the stream's."""
        if self.clock_ms is not None and stream_ms <= self.clock_ms:
            return []
        return self._advance(stream_ms)

    def _pause(self, ts: int) -> None:
        """A reading at ``ts`` is about to move the clock. If the partition brought nothing for
        longer than a device's threshold before it, that span is the feed's silence, not the
        device's (module docstring): its deadline moves on by the span."""
        if self.clock_ms is None or ts <= self.clock_ms:
            return
        gap = ts - self.clock_ms
        # A device whose deadline is after ts, or whose threshold is at least the span, is not
        # concerned. Most readings move the clock by far less than any threshold: the bounds
        # say so without looking at every device of the partition for each reading, which at
        # thousands of devices a partition was most of the query's cost (docs/PERFORMANCE.md).
        if ts <= self._due_from or gap <= self._shortest:
            return
        self.next_deadline()  # the bounds made exact, once
        if ts <= self._due_from or gap <= self._shortest:
            return
        for d in self.devices.values():
            if d.deadline_ms(self.spec) is not None and gap > d.threshold_ms(self.spec):
                d.heard_ms = (d.heard_ms or 0) + gap
                d.paused_ms += gap

    def _follow(self, d: Device) -> None:
        """``d``'s deadline moved: the partition's earliest may be it."""
        deadline = d.deadline_ms(self.spec)
        if deadline is not None and d.heard_ms is not None:
            self._due_from = min(self._due_from, deadline)
            self._shortest = min(self._shortest, deadline - d.heard_ms)

    def next_deadline(self) -> int | None:
        due, shortest = math.inf, math.inf
        for d in self.devices.values():
            deadline = d.deadline_ms(self.spec)
            if deadline is not None and d.heard_ms is not None:
                due, shortest = min(due, deadline), min(shortest, deadline - d.heard_ms)
        self._due_from, self._shortest = due, shortest
        return None if due == math.inf else int(due)

    def _advance(self, clock_ms: int) -> list[dict[str, Any]]:
        """Move the clock; raise ``device_silent`` for the devices it makes overdue."""
        self.clock_ms = clock_ms
        now = self.now_ms
        assert now is not None
        if now < self._due_from:
            return []
        changes = []
        for device_id, d in self.devices.items():
            deadline = d.deadline_ms(self.spec)
            if deadline is not None and deadline <= now:
                self._go_silent(d, now)
                changes.append(self._silence(device_id, d))
        self.next_deadline()
        return changes

    def _go_silent(self, d: Device, seen_ms: int) -> None:
        d.silent_from_ms = d.last_ms if d.last_ms is not None else d.heard_ms
        d.silent_seen_ms = seen_ms
        d.silent_threshold_ms = d.threshold_ms(self.spec)

    def _silence(self, device_id: str, d: Device, *, end_ms: int | None = None,
                 ended_by: str | None = None) -> dict[str, Any]:  # fmt: skip
        """The change of ``d``'s open silence (ended at ``end_ms`` when given)."""
        return _change(device_id, SILENT, start_ms=d.silent_from_ms, first_ms=d.silent_from_ms,
                       detected_ms=d.silent_seen_ms, end_ms=end_ms, readings=0,
                       interval_ms=round(d.interval(self.spec)),
                       threshold_ms=d.silent_threshold_ms, ended_by=ended_by)  # fmt: skip

    def _burst(self, device_id: str, d: Device) -> dict[str, Any]:
        return _change(device_id, LATE_BURST, start_ms=d.burst_from_ms, first_ms=d.burst_from_ms,
                       detected_ms=d.burst_to_ms, end_ms=d.burst_to_ms, readings=d.burst_readings,
                       behind_ms=d.burst_behind_ms,
                       interval_ms=round(d.interval(self.spec)))  # fmt: skip


def step(
    partition: Partition, rows: pd.DataFrame, stream_ms: int | None = None
) -> list[dict[str, Any]]:
    """A micro-batch's ``rows`` of one partition (INPUT_COLUMNS): the retirements, then the
    readings in offset order. Returns the alert changes.

    ``stream_ms``: the stream's time (its watermark plus ``lateness_ms``). When the rows hold
    no reading (only records that name no device, clocks ahead or retirements), nothing moved
    the partition's clock, and its timer cannot fire in a micro-batch that brought it input: it
    is idle, and takes the stream's time as its timer would."""
    changes: list[dict[str, Any]] = []
    for device_id in rows.loc[rows["kind"] == RETIRED, "device_id"]:
        changes += partition.retire(str(device_id))
    readings = rows[rows["kind"].isin([READING, ALIVE])].sort_values("offset", kind="stable")
    for device_id, kind, ts, device_type, registered in zip(
        readings["device_id"], readings["kind"], readings["ts"], readings["device_type"],
        readings["registered"], strict=True,
    ):  # fmt: skip
        if kind == ALIVE:
            if registered:
                changes += partition.alive(str(device_id), device_type)
            continue
        if registered:
            changes += partition.read(str(device_id), int(ts), device_type)
            continue
        if device_id in partition.devices:  # gone from the registry since
            changes += partition.retire(str(device_id))
        changes += partition.pass_by(int(ts))
    if stream_ms is not None and not (readings["kind"] == READING).any():
        changes += partition.idle(stream_ms)
    # One change per alert: its latest.
    latest = {(ch["device_id"], ch["alert_type"], ch["start_ms"]): ch for ch in changes}
    return list(latest.values())


class SilenceProcessor(StatefulProcessor):
    """One Kafka partition (``Partition``): its devices and its clock in the state, one
    event-time timer at its earliest deadline for when it is idle (module docstring)."""

    def __init__(self, spec: SilenceSpec) -> None:
        self.spec = spec

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.state = handle.getValueState("partition", "devices binary, clock_ms long")

    # Spark's names for the hooks and their keyword arguments.
    def handleInputRows(  # noqa: N802
        self,
        key: Any,
        rows: Iterator[Any],
        timerValues: TimerValues,  # noqa: N803
    ) -> Iterator[pd.DataFrame]:
        watermark = timerValues.getCurrentWatermarkInMs()
        partition = self._load()
        stream_ms = watermark + self.spec.lateness_ms if watermark > 0 else None
        changes = step(partition, pd.concat(list(rows), ignore_index=True), stream_ms)
        yield from self._save(partition, changes, watermark)

    def handleExpiredTimer(  # noqa: N802
        self,
        key: Any,
        timerValues: TimerValues,  # noqa: N803
        expiredTimerInfo: ExpiredTimerInfo,  # noqa: N803
    ) -> Iterator[pd.DataFrame]:
        # A timer fires only in a micro-batch that brought the partition nothing (every batch
        # with input moves it past the watermark): the partition is idle.
        watermark = timerValues.getCurrentWatermarkInMs()
        partition = self._load()
        changes = partition.idle(watermark + self.spec.lateness_ms)
        yield from self._save(partition, changes, watermark)

    def _load(self) -> Partition:
        held = self.state.get()
        if held is None:
            return Partition(self.spec)
        return Partition(self.spec, unpack(held[0]), held[1])

    def _save(
        self, partition: Partition, changes: list[dict[str, Any]], watermark: int
    ) -> Iterator[pd.DataFrame]:
        for timer in list(self.handle.listTimers()):  # ``clear`` would leave them behind
            self.handle.deleteTimer(timer)
        if partition.devices or partition.clock_ms is not None:
            self.state.update((pack(partition.devices), partition.clock_ms))
        deadline = partition.next_deadline()
        if deadline is not None:
            # Not in this micro-batch: a timer that expires fires after its input rows.
            self.handle.registerTimer(max(deadline, max(watermark, 0) + 1))
        if changes:
            yield pd.DataFrame(changes, columns=CHANGE_COLUMNS)

    def close(self) -> None:
        pass


# --- Spark --------------------------------------------------------------------------------------


def reading_time() -> Column:
    """A reading's event time, capped at its message's Kafka timestamp (module docstring); null
    for a record without one (``least`` would take the Kafka timestamp alone, and a malformed
    record would move the watermark)."""
    event_time = F.col("event_time")
    return F.when(event_time.isNotNull(), F.least(event_time, F.col("kafka_timestamp")))


def silence_input(
    records: DataFrame, devices: DataFrame, registry: DataFrame, *, lateness: str,
    partitions: int,
) -> DataFrame:  # fmt: skip
    """The processor's input (INPUT_COLUMNS): ``records`` (``transforms.senders`` rows: who
    sent each record of the topic, and when) with their registration (``devices``, the static
    table), watermarked ``lateness`` behind; and the retirements of ``registry`` (the
    ``devices`` table as a stream), one row per partition of the topic (``partitions``)."""
    retiring = F.coalesce(F.col("status") == RETIRED, F.lit(False))
    ahead = F.col("clock_ahead")
    heard = (
        with_device(records, devices)
        # A clock ahead: its event time is the very thing that is wrong.
        .withColumn("_t", F.when(~ahead, reading_time()))
        .withWatermark("_t", lateness)
        .select(
            F.coalesce(F.col("kafka_partition"), F.lit(0)).alias("partition"),
            F.col("kafka_offset").alias("offset"), "device_id",
            F.when(F.col("device_id").isNull(), F.lit(None).cast("string"))
            .when(ahead, F.lit(ALIVE)).otherwise(F.lit(READING)).alias("kind"),
            F.unix_millis("_t").alias("ts"), "device_type",
            (F.col("registered") & ~retiring).alias("registered"),
        )
    )  # fmt: skip
    retired = registry.where(F.col("status") == RETIRED).select(
        F.explode(F.sequence(F.lit(0), F.lit(max(partitions, 1) - 1))).alias("partition"),
        F.lit(None).cast("long").alias("offset"), "device_id", F.lit(RETIRED).alias("kind"),
        F.lit(None).cast("long").alias("ts"), "device_type", F.lit(False).alias("registered"),
    )  # fmt: skip
    return heard.unionByName(retired)


def silence_changes(rows: DataFrame, spec: SilenceSpec) -> DataFrame:
    """Alert changes (CHANGES_SCHEMA) from ``silence_input`` rows."""
    return rows.groupBy("partition").transformWithStateInPandas(
        SilenceProcessor(spec), CHANGES_SCHEMA, "Update", "EventTime"
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
    """``foreachBatch`` of the silence query: its alert changes written to ``alerts``,
    published first with ``publish``. A new alert is appended; a change to one the table
    holds (a silence that ended, a burst that grew) is MERGEd by ``alert_id``.

    Exactly once: the writer knows the alerts the table holds that may still change
    (``WrittenAlerts.load_open``, at its first batch with changes): every open silence, and
    the alerts that ended within ``KNOWN_FOR`` of event time. So a replayed batch, or a new
    checkpoint reading the topic again, finds its alerts written, and a silence raised again
    with the same start (it ended on a record that moved no reading time, then the device went
    quiet again) updates its row. An alert that ended longer ago is forgotten; a change to one
    goes through the MERGE, which inserts only what the table lacks."""

    alerts_path: str
    publish: Publish | None = None
    written: WrittenAlerts | None = None

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        changes = batch.toPandas()
        if changes.empty:  # most batches: nobody fell silent or came back
            return
        spark = batch.sparkSession
        if self.written is None:
            self.written = WrittenAlerts.load_open(spark, self.alerts_path,
                                                   c.SILENCE_ALERT_TYPES, KNOWN_FOR)  # fmt: skip
        alerts = silence_alerts(changes)
        alert_writes(spark, alerts, alerts, path=self.alerts_path, batch_id=batch_id,
                     written=self.written, publish=self.publish).write(spark)  # fmt: skip
        self.written.forget_until(pd.Timestamp(alerts["last_event_time"].max()) - KNOWN_FOR)
