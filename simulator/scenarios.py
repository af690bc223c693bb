"""Fraud and anomaly scenarios: what each one does to the telemetry, and its ground truth.

Every name in ``infra.contract.SCENARIOS`` is an ``Injection`` kind: one device (a new, unregistered
one for ``rogue_device``) over a window of simulated time, long enough (12-20 minutes by default)
to be seen by 10-minute sliding windows. Outside injections, telemetry is clean.

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

Ground truth rows (``GROUND_TRUTH_COLUMNS``) are produced when an injection ends.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

import numpy as np
import pyarrow as pa

from infra import contract as c
from infra import lake
from simulator.events import METRIC_INDEX, Events

log = logging.getLogger(__name__)

SCENARIO_CODE = {name: i + 1 for i, name in enumerate(c.SCENARIOS)}
REPLAY_DELAY_S = (60.0, 180.0)
FLOOD_INTERVAL_S = 0.5
MALFORMED_INTERVAL_S = 10.0
CLONE_DISTANCE_DEG = (6.0, 12.0)  # 400-1,000 km
TRAVEL_DISTANCE_DEG = (20.0, 36.0)  # 1,500-3,000 km

# (metric, how, low, high): "add" adds, "mul" multiplies, "ramp" adds per simulated minute.
_MODIFIERS: dict[str, tuple[tuple[str, str, float, float], ...]] = {
    "spike": (
        ("temperature_c", "add", 25.0, 40.0),
        ("current_a", "mul", 3.0, 5.0),
        ("humidity_pct", "add", 30.0, 40.0),
    ),
    "dip": (
        ("voltage_v", "mul", 0.45, 0.65),
        ("current_a", "mul", 0.05, 0.15),
        ("signal_dbm", "add", -35.0, -25.0),
        ("temperature_c", "add", -30.0, -20.0),
    ),
    "drift": (
        ("temperature_c", "ramp", 0.8, 1.5),
        ("humidity_pct", "ramp", 1.0, 2.0),
        ("voltage_v", "ramp", 1.5, 3.0),
    ),
}
# Scenarios that change a device's readings: seen against its own normal, once that is learned.
VALUE_SCENARIOS = ("tampering", "spike", "dip", "stuck_sensor", "drift")
# Scenarios that add messages of their own: the device's readings stay genuine and untagged.
EXTRA_MESSAGES = ("replay", "malformed")
_POWERED = tuple(t for t, sensors in c.DEVICE_TYPES.items() if "power_w" in sensors)


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


@dataclass
class Injection:
    """One scenario on one device over ``[start, end)`` simulated seconds."""

    scenario_id: str
    scenario: str
    dev: int
    start: float
    end: float
    params: dict[str, Any] = field(default_factory=dict)
    # Replay: (send time, key, value) of the device's messages waiting to be re-sent.
    recorded: list[tuple[float, bytes, bytes]] = field(default_factory=list)
    sent: int = 0

    @property
    def code(self) -> int:
        return SCENARIO_CODE[self.scenario]

    def window(self, t: np.ndarray) -> np.ndarray:
        inside: np.ndarray = (t >= self.start) & (t < self.end)
        return inside


def eligible(scenario: str, device_type: str) -> bool:
    """Whether ``scenario`` makes sense for a device of ``device_type``."""
    sensors = c.DEVICE_TYPES[device_type]
    if scenario == "tampering":
        return device_type in _POWERED
    if scenario in _MODIFIERS:
        return any(m in sensors for m, *_ in _MODIFIERS[scenario])
    if scenario == "stuck_sensor":
        return any(m in c.REPEAT_METRICS for m in sensors)
    return True


def choose_params(
    scenario: str, device_type: str, rng: np.random.Generator, malformed_reasons: list[str]
) -> dict[str, Any]:
    """Random parameters of one injection (recorded in its ground-truth details)."""
    sensors = c.DEVICE_TYPES[device_type]
    if scenario == "tampering":
        return {"power_factor": round(float(rng.uniform(0.15, 0.35)), 3)}
    if scenario in _MODIFIERS:
        options = [m for m in _MODIFIERS[scenario] if m[0] in sensors]
        metric, how, low, high = options[int(rng.integers(len(options)))]
        return {"metric": metric, "how": how, "amount": round(float(rng.uniform(low, high)), 3)}
    if scenario == "stuck_sensor":
        options_ = [m for m in sensors if m in c.REPEAT_METRICS]
        return {"metric": options_[int(rng.integers(len(options_)))]}
    if scenario == "impossible_travel":
        return _offset(rng, TRAVEL_DISTANCE_DEG)
    if scenario == "cloned_device":
        return _offset(rng, CLONE_DISTANCE_DEG)
    if scenario == "replay":
        return {"delay_s": round(float(rng.uniform(*REPLAY_DELAY_S)), 1)}
    if scenario == "flood":
        return {"interval_s": FLOOD_INTERVAL_S}
    if scenario == "firmware_change":
        return {"firmware": f"{int(rng.integers(5, 10))}.{int(rng.integers(0, 9))}.0-unsigned"}
    if scenario == "clock_skew":
        late = bool(rng.random() < 0.5)
        seconds = rng.uniform(1200, 21600) if late else rng.uniform(1200, 10800)
        return {"skew_s": round(float(-seconds if late else seconds), 1)}
    if scenario == "malformed":
        return {"reasons": list(malformed_reasons)}
    return {}


def _offset(rng: np.random.Generator, bounds: tuple[float, float]) -> dict[str, Any]:
    """A jump of ``bounds`` degrees both north-south (half of it) and east-west, random signs."""
    low, high = bounds
    north = float(rng.uniform(low / 2, high / 2)) * float(rng.choice([-1.0, 1.0]))
    east = float(rng.uniform(low, high)) * float(rng.choice([-1.0, 1.0]))
    return {"dlat": round(north, 4), "dlon": round(east, 4)}


def apply_values(inj: Injection, events: Events, power_factor: np.ndarray, own: np.ndarray) -> None:
    """Change the readings of ``events`` that fall in the injection (in place).

    ``own`` indexes the events of the injection's device (clone readings included), so the cost
    does not grow with the batch; ``power_factor`` is each event's true power factor, so power
    can follow a changed current or voltage.
    """
    s = inj.scenario
    if s in EXTRA_MESSAGES:
        return
    idx = own[inj.window(events.t[own]) & (events.clone[own] < 0)]
    p = inj.params
    m = events.metrics
    if s in ("spike", "dip", "drift"):
        col = METRIC_INDEX[p["metric"]]
        if p["how"] == "add":
            m[idx, col] += p["amount"]
        elif p["how"] == "mul":
            m[idx, col] *= p["amount"]
        else:
            m[idx, col] += p["amount"] * (events.t[idx] - inj.start) / 60.0
        if p["metric"] in ("current_a", "voltage_v"):
            _power_follows(events, idx, power_factor)
    elif s == "tampering":
        v, i, w = METRIC_INDEX["voltage_v"], METRIC_INDEX["current_a"], METRIC_INDEX["power_w"]
        m[idx, w] = m[idx, v] * m[idx, i] * p["power_factor"]
    elif s == "stuck_sensor" and idx.size:
        col = METRIC_INDEX[p["metric"]]
        if "value" not in p:
            p["value"] = round(float(m[idx[np.argmin(events.t[idx])], col]), 2)
        m[idx, col] = p["value"]
    elif s == "impossible_travel":
        events.lat[idx] += p["dlat"]
        events.lon[idx] += p["dlon"]
    elif s == "cloned_device":
        clone = own[events.clone[own] == p["index"]]
        events.lat[clone] += p["dlat"]
        events.lon[clone] += p["dlon"]
        idx = np.concatenate([idx, clone])
    elif s == "firmware_change":
        events.firmware[idx] = p["firmware_code"]
    elif s == "clock_skew":
        events.t_event[idx] += p["skew_s"]
    events.tag[idx] = inj.code


def _power_follows(events: Events, idx: np.ndarray, power_factor: np.ndarray) -> None:
    v, i, w = METRIC_INDEX["voltage_v"], METRIC_INDEX["current_a"], METRIC_INDEX["power_w"]
    m = events.metrics
    has_power = idx[~np.isnan(m[idx, w])]
    m[has_power, w] = m[has_power, v] * m[has_power, i] * power_factor[has_power]


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
        text = json.dumps(event, separators=(",", ":"))
        cut = int(rng.integers(5, 40))
        return key, text[:-cut].encode(), f"truncated by {cut} characters"
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
        raw = json.dumps(event, separators=(",", ":")).encode()
        padding = b',"padding":"' + b"x" * (c.MAX_MESSAGE_BYTES + 1024) + b'"}'
        return key, raw[:-1] + padding, f"more than {c.MAX_MESSAGE_BYTES} bytes"
    elif reason == c.REASON_INVALID_UTF8:
        raw = json.dumps(event, separators=(",", ":")).encode()
        firmware = json.dumps(event["firmware"]).encode()
        value = raw.replace(b'"firmware":' + firmware, b'"firmware":"\xff\xfe-bad"', 1)
        return key, value, "firmware holds bytes 0xff 0xfe"
    elif reason == c.REASON_KEY_MISMATCH:
        return other_key, json.dumps(event, separators=(",", ":")).encode(), "key of another device"
    else:
        raise ValueError(f"no malformed message for reason {reason!r}")
    return key, json.dumps(event, separators=(",", ":")).encode(), detail


def ground_truth_row(
    inj: Injection, device_id: str, start: datetime, end_s: float, run_id: str
) -> GroundTruthRow:
    """The ground-truth row of an injection that ran until ``end_s`` simulated seconds."""
    details = {k: v for k, v in inj.params.items() if k not in ("index", "firmware_code")}
    details["messages"] = inj.sent
    return GroundTruthRow(
        scenario_id=inj.scenario_id,
        device_id=device_id,
        scenario=inj.scenario,
        start_time=start + timedelta(seconds=inj.start),
        end_time=start + timedelta(seconds=max(inj.start, min(inj.end, end_s))),
        details=json.dumps(details, sort_keys=True),
        run_id=run_id,
    )


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
