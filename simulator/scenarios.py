"""Fraud and anomaly scenarios, one class per kind, and their ground truth.

An injection is one ``Scenario`` object: one kind on one device (a new, unregistered one for
``rogue_device``) over a window of simulated time, long enough (12-20 minutes by default) to be
seen by 10-minute sliding windows. Outside injections, telemetry is clean.

- tampering: reported power drops to 15-35 % of voltage x current while current stays.
- spike / dip: one metric jumps up / falls down for the window (power follows current/voltage).
- stuck_sensor: one metric repeats the exact same value.
- drift: one metric drifts away linearly (about 1 unit a minute).
- impossible_travel: the device reports from 1,500-3,000 km away, then jumps back.
- cloned_device: a second sender with the same device_id, far away, its seq interleaved with
  the real device's (both count up from the same value).
- replay: the device's own messages re-sent 1-3 minutes later, byte for byte (same event_id).
- flood: the device sends every 0.5 s (20-60x its normal rate).
- rogue_device: a device_id that is not in the registry sends normal-looking telemetry.
- firmware_change: the device reports a firmware other than its expected_firmware.
- clock_skew: event_time 20 minutes to 6 hours behind (late delivery) or 20 minutes to 3 hours
  ahead of the send time (ahead of the wall clock in a run faster than real time, whose
  simulated clock lags the wall clock until its end).
- malformed: every 10 s the device sends a message that is malformed in one way, labelled with the
  quarantine reason it must get (``infra.contract.REASON_*``).
- silence: the device sends nothing for ``silence_min_s`` to ``silence_max_s`` (5 minutes to an
  hour by default, log-uniform), then reports again; or never does (``silence_resume_probability``):
  the injection then runs to the run's end.
- store_and_forward: the device is offline for the window and keeps its readings; at the window's
  end it sends them all in a burst, a few ms apart, byte for byte (original event_time and seq),
  then reports normally again.

A kind is a subclass of ``Scenario`` that overrides only what it does; the defaults do nothing.
Its class holds, in this order:

- selection: ``fits`` (which device types), ``device`` (a random free registered device, or a new
  one), ``changes_readings`` and ``withholds`` (held back during a run's warm-up), ``may_start``
  (when);
- parameters: ``lasts`` draws how long it runs (unless given), ``choose`` draws the others; they
  are recorded in the ground truth's details;
- effect on the telemetry: ``extra_reports`` (more readings: flood, cloned_device), ``number``
  (seq of its own readings), ``change`` (what it does to the readings of its window, which
  ``apply`` then tags with the kind), ``withholds`` (its device's own readings of the window,
  the ones ``readings`` picks, are encoded but not sent: silence, store_and_forward; they reach
  ``messages`` in ``Slice.withheld``), ``messages`` (messages of its own: replay, malformed, the
  burst of store_and_forward);
- ground truth: ``ground_truth_row``, the window clipped to where the run stopped.

``Simulation`` (``simulator.telemetry``) calls these hooks on every running injection, slice by
slice. To add a kind, name it in ``infra.contract.SCENARIOS``, write its class and add it to
``KINDS`` at the end of this module.
"""

from __future__ import annotations

import json
import logging
import math
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple

import numpy as np
import pyarrow as pa

from infra import contract as c
from infra import lake
from simulator.events import METRIC_INDEX, TYPES, Events, event_dict, event_json, event_times
from simulator.fleet import Fleet, signals
from simulator.settings import SimulatorSettings

if TYPE_CHECKING:
    from typing import Self

log = logging.getLogger(__name__)

SCENARIO_CODE = {name: i + 1 for i, name in enumerate(c.SCENARIOS)}
_POWERED = tuple(t for t, sensors in c.DEVICE_TYPES.items() if "power_w" in sensors)
_V, _I, _W = METRIC_INDEX["voltage_v"], METRIC_INDEX["current_a"], METRIC_INDEX["power_w"]
# (device, send time, clone marker) of extra readings, as in ``Events``.
Reports = tuple[np.ndarray, np.ndarray, np.ndarray]
# Random draws of a free device before giving up: a busy fleet skips the injection.
_PICK_TRIES = 50


@dataclass
class GroundTruthRow:
    """One injected scenario, as written to ``ground_truth``."""

    scenario_id: str
    device_id: str
    scenario: str
    start_time: datetime
    end_time: datetime
    details: str
    run_id: str

    def as_dict(self) -> dict[str, Any]:
        return {
            "scenario_id": self.scenario_id,
            "device_id": self.device_id,
            "scenario": self.scenario,
            "start_time": self.start_time,
            "end_time": self.end_time,
            "details": self.details,
            "run_id": self.run_id,
        }


class Message(NamedTuple):
    """A message a scenario sends on its own, beside the device's readings."""

    scenario: Scenario
    send_s: float  # simulated seconds since the start
    key: bytes
    value: bytes
    label: str | None  # the quarantine reason it must get, None for a valid message


@dataclass(frozen=True)
class Placement:
    """Where and when a new injection goes: what its random parameters may depend on."""

    device_type: str
    settings: SimulatorSettings
    start: float  # simulated seconds


class Withheld(NamedTuple):
    """A reading encoded but not sent: its device's injection withholds it (``withholds``)."""

    scenario: Scenario
    send_s: float  # when it would have been sent, simulated seconds since the start
    key: bytes
    value: bytes  # as it would have been sent


@dataclass
class Slice:
    """A slice ``[t0, t1)`` of simulated time with its readings encoded, time-ordered: what
    ``Scenario.messages`` reads and draws from. ``events``, ``keys`` and ``values`` are the
    readings sent; ``withheld`` the ones the injections kept back, time-ordered too."""

    t0: float
    t1: float
    fleet: Fleet
    rng: np.random.Generator
    start_epoch: float  # Unix time of simulated second 0
    events: Events
    keys: list[bytes]
    values: list[bytes]
    withheld: list[Withheld] = field(default_factory=list)

    @property
    def start_ms(self) -> int:
        return round(self.start_epoch * 1000)


@dataclass(eq=False)
class Scenario:
    """One injection: a scenario kind on one device over ``[start, end)`` simulated seconds."""

    name: ClassVar[str]
    # Kinds that change a device's readings are seen against its own normal, once that is
    # learned: none starts in a run's warm-up.
    changes_readings: ClassVar[bool] = False
    # Kinds that withhold a device's own readings of the window (``readings``): they are encoded
    # as they would have been sent, then left out of the batch and handed to ``messages`` in
    # ``Slice.withheld``. Seen against the device's learned reporting interval: none starts in
    # a run's warm-up either.
    withholds: ClassVar[bool] = False

    scenario_id: str
    dev: int
    start: float
    end: float
    index: int  # its number in the run (1, 2, ...): marks a clone's readings
    params: dict[str, Any] = field(default_factory=dict)  # recorded in the ground truth
    sent: int = 0  # messages it tagged or sent
    withheld: int = 0  # readings of its device it kept from being sent (``withholds``)

    @property
    def code(self) -> int:
        """The tag of its messages in ``Batch.tags``."""
        return SCENARIO_CODE[self.name]

    # --- selection -------------------------------------------------------------------------------
    @classmethod
    def fits(cls, device_type: str) -> bool:
        """Whether this kind makes sense for a device of ``device_type``."""
        return True

    @classmethod
    def may_start(cls, start: float, settings: SimulatorSettings) -> bool:
        """Whether a planned injection may start at ``start`` simulated seconds: after the warm-up
        for kinds that change or withhold readings, and before a bounded run's quiet tail."""
        s = settings
        if (cls.changes_readings or cls.withholds) and start < s.scenario_warmup_s:
            return False
        span = s.duration * s.accelerate if s.duration and s.accelerate > 0 else None
        return span is None or s.quiet_tail_s <= 0 or start < span - s.quiet_tail_s

    @classmethod
    def device(
        cls, fleet: Fleet, rng: np.random.Generator, busy: set[int], device_id: str | None
    ) -> int:
        """The device of a new injection: ``device_id`` when given, else a registered device that
        reports from the start, is not in ``busy`` (running an injection) and ``fits``, drawn at
        random."""
        if device_id is not None:
            return fleet.index_of(device_id)
        for _ in range(_PICK_TRIES):
            dev = int(rng.integers(fleet.n_registered))
            if dev in busy or fleet.live_from[dev] != -np.inf:
                continue
            if cls.fits(fleet.device_type(dev)):
                return dev
        raise ValueError(f"no free device fits scenario {cls.name!r}")

    # --- parameters ------------------------------------------------------------------------------
    @classmethod
    def lasts(cls, rng: np.random.Generator, settings: SimulatorSettings) -> float:
        """How long a new injection runs (simulated seconds), when not given."""
        return float(rng.uniform(settings.scenario_min_s, settings.scenario_max_s))

    @classmethod
    def choose(cls, rng: np.random.Generator, place: Placement) -> dict[str, Any]:
        """The random parameters of one injection."""
        return {}

    def prepare(self, fleet: Fleet) -> None:
        """Resolve, once injected, what its effect needs from the fleet."""

    # --- effect on the telemetry -----------------------------------------------------------------
    def overlaps(self, t0: float, t1: float) -> bool:
        """Whether the injection runs at some time in ``[t0, t1)``."""
        return self.start < t1 and self.end > t0

    def window(self, t: np.ndarray) -> np.ndarray:
        """Which of the times ``t`` fall in the injection."""
        inside: np.ndarray = (t >= self.start) & (t < self.end)
        return inside

    def ticks(self, t0: float, t1: float, step: float, offset: float = 0.0) -> np.ndarray:
        """Times ``start + offset + k * step`` (k = 0, 1, ...) in both the injection and
        ``[t0, t1)``: a steady sender's schedule."""
        lo, hi = max(t0, self.start), min(t1, self.end)
        first = np.ceil((lo - self.start - offset) / step)
        last = np.ceil((hi - self.start - offset) / step)
        t = self.start + offset + np.arange(first, last) * step
        kept: np.ndarray = t[(t >= lo) & (t < hi)]
        return kept

    def extra_reports(self, fleet: Fleet, t0: float, t1: float) -> Reports | None:
        """(device, send time, clone marker) of the readings it adds in ``[t0, t1)``; the marker
        is -1 for the device's own readings, else the ``index`` of the injection sending them."""
        return None

    def number(self, events: Events, device_seq: int) -> None:
        """Number the readings it sends as another sender (a clone's); the device's own readings
        are numbered already. ``device_seq`` is the device's last seq before this slice."""

    def apply(self, events: Events, own: np.ndarray, power_factor: np.ndarray) -> None:
        """Change the readings of the injection (in place) and tag them with its kind.

        ``own`` indexes the readings of its device (clone readings included), so the cost does
        not grow with the batch; ``power_factor`` is each reading's true power factor, so power
        can follow a changed current or voltage.
        """
        idx = self.readings(events, own)
        self.change(events, idx, power_factor)
        events.tag[idx] = self.code
        self.sent += int(np.count_nonzero(events.tag[own] == self.code))

    def readings(self, events: Events, own: np.ndarray) -> np.ndarray:
        """The readings it changes and tags: its device's own ones inside the window."""
        chosen: np.ndarray = own[self.window(events.t[own]) & (events.clone[own] < 0)]
        return chosen

    def change(self, events: Events, idx: np.ndarray, power_factor: np.ndarray) -> None:
        """What it does to the readings ``idx``; nothing when the readings themselves are the
        scenario (flood, rogue_device)."""

    @classmethod
    def messages(cls, scenarios: list[Self], now: Slice) -> list[Message]:
        """The messages of its own that the running injections ``scenarios`` of this kind send
        in the slice; generated together, so a kind draws its random values once a slice."""
        return []

    # --- ground truth ----------------------------------------------------------------------------
    def ground_truth_row(
        self, device_id: str, start_time: datetime, until_s: float, run_id: str
    ) -> GroundTruthRow:
        """Its ground-truth row, the window clipped to ``until_s`` simulated seconds (where the run
        stopped, or its own end)."""
        details = {**self.params, "messages": self.sent}
        if self.withholds:
            details["withheld"] = self.withheld
        return GroundTruthRow(
            scenario_id=self.scenario_id,
            device_id=device_id,
            scenario=self.name,
            start_time=start_time + timedelta(seconds=self.start),
            end_time=start_time + timedelta(seconds=max(self.start, min(self.end, until_s))),
            details=json.dumps(details, sort_keys=True),
            run_id=run_id,
        )


class _MetricChange(Scenario):
    """One metric changed over the window: by a step, a factor or a ramp (spike, dip, drift)."""

    changes_readings = True
    # (metric, how, low, high): "add" adds, "mul" multiplies, "ramp" adds per simulated minute.
    MODIFIERS: ClassVar[tuple[tuple[str, str, float, float], ...]]

    @classmethod
    def fits(cls, device_type: str) -> bool:
        return any(m in c.DEVICE_TYPES[device_type] for m, *_ in cls.MODIFIERS)

    @classmethod
    def choose(cls, rng: np.random.Generator, place: Placement) -> dict[str, Any]:
        options = [m for m in cls.MODIFIERS if m[0] in c.DEVICE_TYPES[place.device_type]]
        metric, how, low, high = options[int(rng.integers(len(options)))]
        return {"metric": metric, "how": how, "amount": round(float(rng.uniform(low, high)), 3)}

    def change(self, events: Events, idx: np.ndarray, power_factor: np.ndarray) -> None:
        p = self.params
        m = events.metrics
        col = METRIC_INDEX[p["metric"]]
        if p["how"] == "add":
            m[idx, col] += p["amount"]
        elif p["how"] == "mul":
            m[idx, col] *= p["amount"]
        else:
            m[idx, col] += p["amount"] * (events.t[idx] - self.start) / 60.0
        if p["metric"] in ("current_a", "voltage_v"):
            # Power follows a changed current or voltage, where the device measures power.
            has_power = idx[~np.isnan(m[idx, _W])]
            m[has_power, _W] = m[has_power, _V] * m[has_power, _I] * power_factor[has_power]


class _Jump(Scenario):
    """Readings sent from far away: ``OFFSET_DEG`` degrees (half of it north-south)."""

    OFFSET_DEG: ClassVar[tuple[float, float]]

    @classmethod
    def choose(cls, rng: np.random.Generator, place: Placement) -> dict[str, Any]:
        low, high = cls.OFFSET_DEG
        north = float(rng.uniform(low / 2, high / 2)) * float(rng.choice([-1.0, 1.0]))
        east = float(rng.uniform(low, high)) * float(rng.choice([-1.0, 1.0]))
        return {"dlat": round(north, 4), "dlon": round(east, 4)}

    def change(self, events: Events, idx: np.ndarray, power_factor: np.ndarray) -> None:
        events.lat[idx] += self.params["dlat"]
        events.lon[idx] += self.params["dlon"]


class Tampering(Scenario):
    name = "tampering"
    changes_readings = True

    @classmethod
    def fits(cls, device_type: str) -> bool:
        return device_type in _POWERED

    @classmethod
    def choose(cls, rng: np.random.Generator, place: Placement) -> dict[str, Any]:
        return {"power_factor": round(float(rng.uniform(0.15, 0.35)), 3)}

    def change(self, events: Events, idx: np.ndarray, power_factor: np.ndarray) -> None:
        m = events.metrics
        m[idx, _W] = m[idx, _V] * m[idx, _I] * self.params["power_factor"]


class Spike(_MetricChange):
    name = "spike"
    MODIFIERS = (
        ("temperature_c", "add", 25.0, 40.0),
        ("current_a", "mul", 3.0, 5.0),
        ("humidity_pct", "add", 30.0, 40.0),
    )


class Dip(_MetricChange):
    name = "dip"
    MODIFIERS = (
        ("voltage_v", "mul", 0.45, 0.65),
        ("current_a", "mul", 0.05, 0.15),
        ("signal_dbm", "add", -35.0, -25.0),
        ("temperature_c", "add", -30.0, -20.0),
    )


class StuckSensor(Scenario):
    name = "stuck_sensor"
    changes_readings = True

    @classmethod
    def fits(cls, device_type: str) -> bool:
        return any(m in c.REPEAT_METRICS for m in c.DEVICE_TYPES[device_type])

    @classmethod
    def choose(cls, rng: np.random.Generator, place: Placement) -> dict[str, Any]:
        options = [m for m in c.DEVICE_TYPES[place.device_type] if m in c.REPEAT_METRICS]
        return {"metric": options[int(rng.integers(len(options)))]}

    def change(self, events: Events, idx: np.ndarray, power_factor: np.ndarray) -> None:
        if not idx.size:
            return
        col = METRIC_INDEX[self.params["metric"]]
        if "value" not in self.params:
            # The sensor sticks at its first reading of the window.
            self.params["value"] = round(
                float(events.metrics[idx[np.argmin(events.t[idx])], col]), 2
            )
        events.metrics[idx, col] = self.params["value"]


class Drift(_MetricChange):
    name = "drift"
    MODIFIERS = (
        ("temperature_c", "ramp", 0.8, 1.5),
        ("humidity_pct", "ramp", 1.0, 2.0),
        ("voltage_v", "ramp", 1.5, 3.0),
    )


class ImpossibleTravel(_Jump):
    name = "impossible_travel"
    OFFSET_DEG = (20.0, 36.0)  # 1,500-3,000 km


class ClonedDevice(_Jump):
    """A second sender with the device's id: its readings fall between the real device's, from
    far away; the real device's readings of the window are tagged too."""

    name = "cloned_device"
    OFFSET_DEG = (6.0, 12.0)  # 400-1,000 km

    def extra_reports(self, fleet: Fleet, t0: float, t1: float) -> Reports:
        step = float(fleet.params["interval"][self.dev])
        t = self.ticks(t0, t1, step, offset=step / 2)
        return np.full(t.size, self.dev, np.int64), t, np.full(t.size, self.index, np.int64)

    def number(self, events: Events, device_seq: int) -> None:
        idx = np.flatnonzero(events.clone == self.index)
        if idx.size == 0:
            return
        if "next_seq" not in self.params:
            # The clone copied the device's state, seq counter included.
            self.params["next_seq"] = device_seq + 1
        idx = idx[np.argsort(events.t[idx], kind="stable")]
        events.seq[idx] = self.params["next_seq"] + np.arange(idx.size)
        self.params["next_seq"] += idx.size

    def readings(self, events: Events, own: np.ndarray) -> np.ndarray:
        clone = own[events.clone[own] == self.index]
        return np.concatenate([super().readings(events, own), clone])

    def change(self, events: Events, idx: np.ndarray, power_factor: np.ndarray) -> None:
        super().change(events, idx[events.clone[idx] == self.index], power_factor)


@dataclass(eq=False)
class Replay(Scenario):
    """The device's messages re-sent ``delay_s`` later, byte for byte."""

    name = "replay"
    DELAY_S: ClassVar[tuple[float, float]] = (60.0, 180.0)
    # (send time, key, value) of the device's messages waiting to be re-sent.
    recorded: list[tuple[float, bytes, bytes]] = field(default_factory=list)

    @classmethod
    def choose(cls, rng: np.random.Generator, place: Placement) -> dict[str, Any]:
        return {"delay_s": round(float(rng.uniform(*cls.DELAY_S)), 1)}

    def apply(self, events: Events, own: np.ndarray, power_factor: np.ndarray) -> None:
        """The device's readings stay genuine and untagged: the copies are the scenario."""

    @classmethod
    def messages(cls, scenarios: list[Self], now: Slice) -> list[Message]:
        out: list[Message] = []
        for replay in scenarios:
            out += replay._due(now)
        return out

    def _due(self, now: Slice) -> list[Message]:
        """Record the device's messages of the slice; return those due for re-sending in it."""
        delay = float(self.params["delay_s"])
        own = np.flatnonzero((now.events.dev == self.dev) & self.window(now.events.t))
        self.recorded.extend(
            (float(now.events.t[i]) + delay, now.keys[i], now.values[i]) for i in own
        )
        due = [r for r in self.recorded if now.t0 <= r[0] < now.t1 and r[0] < self.end]
        self.recorded = [r for r in self.recorded if r[0] >= now.t1 and r[0] < self.end]
        self.sent += len(due)
        return [Message(self, t, key, value, None) for t, key, value in due]


class Flood(Scenario):
    """The device reports every ``interval_s`` on top of its steady readings."""

    name = "flood"
    INTERVAL_S: ClassVar[float] = 0.5

    @classmethod
    def choose(cls, rng: np.random.Generator, place: Placement) -> dict[str, Any]:
        return {"interval_s": cls.INTERVAL_S}

    def extra_reports(self, fleet: Fleet, t0: float, t1: float) -> Reports:
        t = self.ticks(t0, t1, float(self.params["interval_s"]))
        return np.full(t.size, self.dev, np.int64), t, np.full(t.size, -1, np.int64)


class RogueDevice(Scenario):
    """A device that is not in the registry, near a registered one, sending for the window."""

    name = "rogue_device"

    @classmethod
    def device(
        cls, fleet: Fleet, rng: np.random.Generator, busy: set[int], device_id: str | None
    ) -> int:
        """A new device of a random type, near a registered one (``device_id`` is not used)."""
        near = int(rng.integers(fleet.n_registered))
        lat = float(fleet.site_lat[near] + rng.uniform(-0.2, 0.2))
        lon = float(fleet.site_lon[near] + rng.uniform(-0.2, 0.2))
        device_type = TYPES[int(rng.integers(len(TYPES)))]
        return fleet.add_device(f"rogue-{rng.bytes(2).hex()}", device_type, lat, lon, rng)

    def prepare(self, fleet: Fleet) -> None:
        # The device exists only for the injection: it reports over the window, never after.
        fleet.live_from[self.dev] = self.start
        fleet.live_to[self.dev] = self.end


@dataclass(eq=False)
class FirmwareChange(Scenario):
    name = "firmware_change"
    firmware_code: int = -1  # the reported firmware's index in the fleet's firmware table

    @classmethod
    def choose(cls, rng: np.random.Generator, place: Placement) -> dict[str, Any]:
        return {"firmware": f"{int(rng.integers(5, 10))}.{int(rng.integers(0, 9))}.0-unsigned"}

    def prepare(self, fleet: Fleet) -> None:
        self.firmware_code = fleet.firmware_code(self.params["firmware"])

    def change(self, events: Events, idx: np.ndarray, power_factor: np.ndarray) -> None:
        events.firmware[idx] = self.firmware_code


class ClockSkew(Scenario):
    name = "clock_skew"

    @classmethod
    def choose(cls, rng: np.random.Generator, place: Placement) -> dict[str, Any]:
        late = bool(rng.random() < 0.5)
        seconds = rng.uniform(1200, 21600) if late else rng.uniform(1200, 10800)
        skew = round(float(-seconds if late else seconds), 1)
        if skew > 0:
            skew = round(skew + _behind_wall_clock(place.settings, place.start), 1)
        return {"skew_s": skew}

    def change(self, events: Events, idx: np.ndarray, power_factor: np.ndarray) -> None:
        events.t_event[idx] += self.params["skew_s"]


def _behind_wall_clock(settings: SimulatorSettings, t: float) -> float:
    """How far the simulated clock is behind the wall clock at ``t`` simulated seconds, in a run
    faster than real time that ends near now (0 otherwise). A device clock "ahead" is ahead of
    real time, as in production, so the pipeline's clock check sees it: ahead of a simulated
    clock that lags by an hour it would pass as on time, and move the watermark past every other
    device's events."""
    s = settings
    if not (s.duration and s.accelerate > 1.0) or s.start_time is not None:
        return 0.0
    span = s.duration * s.accelerate
    return max(0.0, (span - t) * (1.0 - 1.0 / s.accelerate))


class Malformed(Scenario):
    """Every ``INTERVAL_S`` the device sends a message broken in one way, the reasons in turn."""

    name = "malformed"
    INTERVAL_S: ClassVar[float] = 10.0

    @classmethod
    def choose(cls, rng: np.random.Generator, place: Placement) -> dict[str, Any]:
        return {"reasons": list(place.settings.malformed_reasons)}

    def apply(self, events: Events, own: np.ndarray, power_factor: np.ndarray) -> None:
        """The device's readings stay genuine and untagged: the broken messages are the
        scenario."""

    @classmethod
    def messages(cls, scenarios: list[Self], now: Slice) -> list[Message]:
        # One ``signals`` call serves every injection: called once per injection, its fixed cost
        # outweighed the few messages it made.
        due = [(m, m.ticks(now.t0, now.t1, cls.INTERVAL_S)) for m in scenarios]
        due = [(m, times) for m, times in due if m.params["reasons"] and times.size]
        if not due:
            return []
        fleet, rng = now.fleet, now.rng
        dev = np.concatenate([np.full(times.size, m.dev, np.int64) for m, times in due])
        times = np.concatenate([times for _, times in due])
        metrics, lat, lon, _ = signals(fleet, dev, times, now.start_epoch, rng)
        stamps = event_times(now.start_ms, times)
        out: list[Message] = []
        i = 0
        for m, ticks in due:
            reasons: list[str] = m.params["reasons"]
            sensors = c.DEVICE_TYPES[fleet.device_type(m.dev)]
            other = fleet.keys[(m.dev + 1) % fleet.n_registered]
            counts = m.params.setdefault("counts", {})
            for t in ticks.tolist():
                event = event_dict(
                    event_id=str(uuid.UUID(bytes=rng.bytes(16), version=4)),
                    device_id=str(fleet.ids[m.dev]),
                    event_time=bytes(stamps[i]).decode(),
                    seq=int(fleet.seq[m.dev]),
                    firmware=fleet.firmware_table[int(fleet.firmware[m.dev])],
                    lat=float(lat[i]),
                    lon=float(lon[i]),
                    metrics={s: float(metrics[i, METRIC_INDEX[s]]) for s in sensors},
                )
                # The reasons take turns by the tick's number since the injection started.
                reason = reasons[round((t - m.start) / cls.INTERVAL_S) % len(reasons)]
                key, value, _detail = malformed_message(
                    reason, event, fleet.keys[m.dev], other, rng
                )
                counts[reason] = counts.get(reason, 0) + 1
                m.sent += 1
                out.append(Message(m, t, key, value, reason))
                i += 1
        return out


class Silence(Scenario):
    """The device sends nothing for the window (``silence_min_s`` to ``silence_max_s``,
    log-uniform), then reports again; with probability ``1 - silence_resume_probability`` it never
    does, and the injection runs to the run's end (its ground truth ends where the run stopped).

    Its readings are still taken, so its seq counts on: it resumes with a gap in seq.
    """

    name = "silence"
    withholds = True

    @classmethod
    def lasts(cls, rng: np.random.Generator, settings: SimulatorSettings) -> float:
        low, high = math.log(settings.silence_min_s), math.log(settings.silence_max_s)
        return math.exp(float(rng.uniform(low, high)))

    @classmethod
    def choose(cls, rng: np.random.Generator, place: Placement) -> dict[str, Any]:
        return {"resumes": bool(rng.random() < place.settings.silence_resume_probability)}

    def prepare(self, fleet: Fleet) -> None:
        # The span is known once placed (``lasts``, or given); one that never resumes has none.
        resumes = bool(self.params["resumes"])
        self.params["span_s"] = round(self.end - self.start, 1) if resumes else None
        if not resumes:
            self.end = math.inf

    def apply(self, events: Events, own: np.ndarray, power_factor: np.ndarray) -> None:
        """The readings are withheld (``withholds``), not changed: nothing to tag."""


@dataclass(eq=False)
class StoreAndForward(Scenario):
    """The device is offline for the window and buffers its readings; at the window's end it
    sends them all, byte for byte (original event_time and seq), ``BURST_GAP_S`` apart in
    event-time order and before its next reading, then reports normally again."""

    name = "store_and_forward"
    withholds = True
    BURST_GAP_S: ClassVar[float] = 0.002
    # The device's readings withheld so far, time-ordered: the burst to come.
    buffered: list[Withheld] = field(default_factory=list)

    def apply(self, events: Events, own: np.ndarray, power_factor: np.ndarray) -> None:
        """The readings are withheld (``withholds``), then sent by ``messages``: untagged here."""

    @classmethod
    def messages(cls, scenarios: list[Self], now: Slice) -> list[Message]:
        out: list[Message] = []
        for gateway in scenarios:
            out += gateway._forward(now)
        return out

    def _forward(self, now: Slice) -> list[Message]:
        """Buffer the device's withheld readings of the slice; the burst when the window ends in
        it (at its end: a run stopped before then never sends it)."""
        self.buffered += [w for w in now.withheld if w.scenario is self]
        if self.end > now.t1 or not self.buffered:
            return []
        # Back online at the window's end: the burst goes out before the device's next reading,
        # which would otherwise make the buffered ones look older than what it last sent.
        events = now.events
        later = events.t[(events.dev == self.dev) & (events.t >= self.end)]
        room = float(later.min(initial=now.t1)) - self.end
        gap = min(self.BURST_GAP_S, max(0.0, room) / len(self.buffered))
        burst = [
            Message(self, self.end + k * gap, w.key, w.value, None)
            for k, w in enumerate(self.buffered)
        ]
        self.buffered = []
        self.sent += len(burst)
        return burst


def malformed_message(
    reason: str,
    event: dict[str, Any],
    key: bytes,
    other_key: bytes,
    rng: np.random.Generator,
) -> tuple[bytes, bytes, str]:
    """(key, value, detail) of a message that fails exactly the check named by ``reason``.

    ``event`` is a valid contract event (a dict); the message breaks it in one way only.
    """
    event = {**event, "metrics": dict(event["metrics"])}
    if reason == c.REASON_INVALID_JSON:
        cut = int(rng.integers(5, 40))
        return key, event_json(event)[:-cut], f"truncated by {cut} characters"
    if reason == c.REASON_MISSING_FIELD:
        missing = c.REQUIRED_FIELDS[int(rng.integers(len(c.REQUIRED_FIELDS)))]
        del event[missing]
        detail = f"missing {missing}"
    elif reason == c.REASON_WRONG_TYPE:
        choice = int(rng.integers(3))
        if choice == 0:
            event["seq"] = f"#{event['seq']}"
            detail = "seq is a string"
        elif choice == 1:
            event["lat"] = "north"
            detail = "lat is a string"
        else:
            event["metrics"]["temperature_c"] = "warm"
            detail = "metrics.temperature_c is a string"
    elif reason == c.REASON_BAD_TIMESTAMP:
        bad = ("yesterday", "31/12/2025 10:00", "1999-12-31T23:59:59Z")[int(rng.integers(3))]
        event["event_time"] = bad
        detail = f"event_time {bad}"
    elif reason == c.REASON_OUT_OF_RANGE:
        choice = int(rng.integers(3))
        if choice == 0:
            event["lat"] = 123.456
            detail = "lat 123.456"
        elif choice == 1:
            event["metrics"]["humidity_pct"] = 150.0
            detail = "humidity_pct 150"
        else:
            event["metrics"]["voltage_v"] = -12.0
            detail = "voltage_v -12"
    elif reason == c.REASON_OVERSIZE:
        padding = b',"padding":"' + b"x" * (c.MAX_MESSAGE_BYTES + 1024) + b'"}'
        return key, event_json(event)[:-1] + padding, f"more than {c.MAX_MESSAGE_BYTES} bytes"
    elif reason == c.REASON_INVALID_UTF8:
        firmware = json.dumps(event["firmware"]).encode()
        value = event_json(event).replace(
            b'"firmware":' + firmware, b'"firmware":"\xff\xfe-bad"', 1
        )
        return key, value, "firmware holds bytes 0xff 0xfe"
    elif reason == c.REASON_KEY_MISMATCH:
        return other_key, event_json(event), "key of another device"
    else:
        raise ValueError(f"no malformed message for reason {reason!r}")
    return key, event_json(event), detail


# Every scenario kind, by its name in ``infra.contract.SCENARIOS``.
KINDS: dict[str, type[Scenario]] = {
    kind.name: kind
    for kind in (
        Tampering, Spike, Dip, StuckSensor, Drift, ImpossibleTravel, ClonedDevice, Replay, Flood,
        RogueDevice, FirmwareChange, ClockSkew, Malformed, Silence, StoreAndForward,
    )
}  # fmt: skip
if set(KINDS) != set(c.SCENARIOS):
    raise RuntimeError(f"scenario kinds {sorted(KINDS)} differ from the contract's {c.SCENARIOS}")


def ground_truth_table(rows: list[GroundTruthRow]) -> pa.Table:
    """Rows as a pyarrow Table with the ``ground_truth`` schema."""
    return pa.Table.from_pylist(
        [r.as_dict() for r in rows], schema=c.arrow_schema(c.GROUND_TRUTH_COLUMNS)
    )


def write_ground_truth(rows: list[GroundTruthRow], lake_root: str) -> None:
    """Append rows to ``<lake_root>/ground_truth`` (creating the table)."""
    if not rows:
        return
    from deltalake import write_deltalake

    lake.ensure_lake(lake_root)
    write_deltalake(
        lake.table_path(lake_root, lake.GROUND_TRUTH), ground_truth_table(rows), mode="append"
    )
    log.info("ground_truth: %d injections appended", len(rows))


def utc(value: datetime) -> datetime:
    return value if value.tzinfo else value.replace(tzinfo=timezone.utc)
