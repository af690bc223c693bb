"""Telemetry generation, Kafka-free: the API the pipeline, the model trainer and the producer use.

Stable public API::

    from simulator.registry import build_registry
    from simulator.settings import SimulatorSettings
    from simulator.telemetry import Simulation, write_jsonl

    settings = SimulatorSettings(devices=200, seed=7, scenario_rate=30)
    start = datetime(2026, 1, 5, tzinfo=timezone.utc)
    sim = Simulation(settings, build_registry(200, seed=7), start_time=start)
    sim.inject("flood", device_id="dev-000003", start_s=60, duration_s=900)   # optional, explicit
    for batch in sim.batches(sim_seconds=3600):       # one simulated hour
        batch.keys, batch.values                       # list[bytes], list[bytes], in send order
        batch.tags                                     # scenario code per message (0 = clean)
        batch.labels                                   # {position: quarantine reason} (malformed)
    rows = sim.finish()                                # every GroundTruthRow, open ones clipped
    write_jsonl(sim2.batches(sim_seconds=3600), "landing/")   # or JSON-lines files

The simulated clock starts at ``start_time`` (default: now) and advances by slices; devices report
at a steady interval (10-30 s) with daily cycles and bounded noise. Same settings, registry,
start time and slice sizes give the same messages byte for byte.
"""

from __future__ import annotations

import logging
import math
import os
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from infra import contract as c
from simulator import scenarios as sc
from simulator.events import (
    METRIC_INDEX,
    TYPES,
    Events,
    StringTable,
    clamp_to_contract,
    encode,
    padded_strings,
    uuid4_rows,
)
from simulator.settings import SimulatorSettings

log = logging.getLogger(__name__)

DAY_S = 86400.0
_M = METRIC_INDEX


@dataclass
class Batch:
    """Messages of one slice of simulated time, in send order."""

    keys: list[bytes]
    values: list[bytes]
    send_times: np.ndarray  # simulated seconds since the start, one per message
    tags: np.ndarray  # int8: 0 clean, else infra.contract.SCENARIOS[tag - 1]
    labels: dict[int, str]  # position -> quarantine reason of each malformed message
    start_s: float
    end_s: float
    ground_truth: list[sc.GroundTruthRow] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.values)

    def scenario_of(self, position: int) -> str | None:
        tag = int(self.tags[position])
        return c.SCENARIOS[tag - 1] if tag else None


class Fleet:
    """Per-device arrays: identity, reporting interval and signal parameters."""

    def __init__(self, registry: pa.Table, settings: SimulatorSettings, rng: np.random.Generator):
        data = registry.select(
            ["device_id", "device_type", "site_lat", "site_lon", "expected_firmware", "status"]
        ).to_pydict()
        n = len(data["device_id"])
        self.ids = np.asarray(data["device_id"], dtype=object)
        self.keys = np.asarray([d.encode() for d in data["device_id"]], dtype=object)
        self.type_code = np.asarray([TYPES.index(t) for t in data["device_type"]], dtype=np.int64)
        self.site_lat = np.asarray(data["site_lat"], dtype=float)
        self.site_lon = np.asarray(data["site_lon"], dtype=float)
        self.firmware_table: list[str] = sorted(set(data["expected_firmware"]))
        lookup = {f: i for i, f in enumerate(self.firmware_table)}
        self.firmware = np.asarray([lookup[f] for f in data["expected_firmware"]], dtype=np.int64)
        self.registered = np.ones(n, dtype=bool)
        active = np.asarray([s == "active" for s in data["status"]], dtype=bool)
        self.live_from = np.where(active, -np.inf, np.inf)
        self.live_to = np.full(n, np.inf)
        self.seq = np.zeros(n, dtype=np.int64)
        self._id_rows: StringTable | None = None
        self._fw_rows: StringTable | None = None
        self.params = self._signal_params(n, settings.interval_min_s, settings.interval_max_s, rng)

    def __len__(self) -> int:
        return int(self.ids.shape[0])

    @staticmethod
    def _signal_params(
        n: int, interval_min: float, interval_max: float, rng: np.random.Generator
    ) -> dict[str, np.ndarray]:
        u = rng.uniform
        parked = rng.random(n) < 0.25
        return {
            "interval": u(interval_min, interval_max, n),
            "phase": u(0.0, 1.0, n),
            "temp_base": u(-1.0, 1.0, n),
            "hum_base": u(30.0, 55.0, n),
            "cur_base": u(0.0, 1.0, n),
            "pf": u(0.86, 0.97, n),
            "sig_base": u(-95.0, -65.0, n),
            "batt_phase": u(0.0, 1.0, n),
            "radius_km": u(2.0, 15.0, n),
            "speed_kmh": np.where(parked, 0.0, u(20.0, 90.0, n)),
            "theta0": u(0.0, 2 * np.pi, n),
        }

    def add_device(
        self, device_id: str, device_type: str, lat: float, lon: float, rng: np.random.Generator
    ) -> int:
        """Append a device that is not in the registry (a rogue one); returns its index."""
        index = len(self)
        self.ids = np.append(self.ids, np.asarray([device_id], dtype=object))
        self.keys = np.append(self.keys, np.asarray([device_id.encode()], dtype=object))
        self.type_code = np.append(self.type_code, TYPES.index(device_type))
        self.site_lat = np.append(self.site_lat, lat)
        self.site_lon = np.append(self.site_lon, lon)
        self.firmware = np.append(self.firmware, self.firmware_code(f"{device_type[:2]}-1.0.0"))
        self.registered = np.append(self.registered, False)
        self.live_from = np.append(self.live_from, np.inf)
        self.live_to = np.append(self.live_to, np.inf)
        self.seq = np.append(self.seq, 0)
        extra = self._signal_params(1, 10.0, 30.0, rng)
        for name, values in extra.items():
            self.params[name] = np.append(self.params[name], values)
        return index

    def id_rows(self) -> StringTable:
        """Device ids as a ``StringTable``, extended (not rebuilt) when rogue devices appear."""
        if self._id_rows is None:
            self._id_rows = padded_strings(self.ids.tolist())
        elif self._id_rows.rows.shape[0] != len(self):
            new = self.ids[self._id_rows.rows.shape[0] :].tolist()
            self._id_rows = self._id_rows.extended(new)
        return self._id_rows

    def firmware_rows(self) -> StringTable:
        if self._fw_rows is None or self._fw_rows.rows.shape[0] != len(self.firmware_table):
            self._fw_rows = padded_strings(self.firmware_table)
        return self._fw_rows

    def firmware_code(self, firmware: str) -> int:
        if firmware not in self.firmware_table:
            self.firmware_table.append(firmware)
        return self.firmware_table.index(firmware)

    def schedule(self, t0: float, t1: float) -> tuple[np.ndarray, np.ndarray]:
        """(device index, time) of every steady report in ``[t0, t1)``."""
        interval = self.params["interval"]
        phase = self.params["phase"] * interval
        k0 = np.ceil((t0 - phase) / interval)
        k1 = np.ceil((t1 - phase) / interval)
        counts = (k1 - k0).astype(np.int64)
        live = (self.live_from < t1) & (self.live_to > t0)
        counts[~live] = 0
        dev = np.repeat(np.arange(len(self)), counts)
        first = np.cumsum(counts) - counts
        k = k0[dev] + (np.arange(dev.size) - first[dev])
        t = phase[dev] + k * interval[dev]
        keep = (t >= self.live_from[dev]) & (t < self.live_to[dev])
        return dev[keep], t[keep]


def signals(
    fleet: Fleet, dev: np.ndarray, t: np.ndarray, start_epoch: float, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Clean readings: (metrics (n, 7), lat, lon, power factor) for devices ``dev`` at times ``t``.

    Daily cycles follow the site's local solar hour; power = voltage x current x power factor.
    """
    n = dev.size
    p = {name: values[dev] for name, values in fleet.params.items()}
    types = fleet.type_code[dev]
    is_meter = types == TYPES.index("smart_meter")
    is_industrial = types == TYPES.index("industrial_sensor")
    is_tracker = types == TYPES.index("gps_tracker")
    is_thermo = types == TYPES.index("thermostat")
    absolute = start_epoch + t
    site_lat, site_lon = fleet.site_lat[dev], fleet.site_lon[dev]
    hour = (absolute / 3600.0 + site_lon / 15.0) % 24.0
    day = np.sin(2 * np.pi * (hour - 9.0) / 24.0)  # peaks mid-afternoon
    noise = rng.standard_normal((n, 5))

    temp = np.select(
        [is_meter, is_tracker, is_industrial, is_thermo],
        [25.0 + 3 * p["temp_base"] + 3.0 * day, 15.0 + 8 * p["temp_base"] + 6.0 * day,
         55.0 + 10 * p["temp_base"] + 4.0 * day, 21.0 + 1.5 * p["temp_base"] + 1.2 * day],
    ) + 0.15 * noise[:, 0]  # fmt: skip
    humidity = np.clip(p["hum_base"] - 6.0 * day + 0.5 * noise[:, 1], 1.0, 99.0)
    nominal = np.where(is_industrial, 400.0, 230.0)
    voltage = nominal * (1.0 + 0.01 * day + 0.004 * noise[:, 2])
    evening = np.exp(-(((hour - 19.5 + 12) % 24 - 12) ** 2) / 4.5)
    morning = np.exp(-(((hour - 7.5 + 12) % 24 - 12) ** 2) / 2.0)
    load = 0.35 + 0.6 * morning + 0.9 * evening
    base_current = np.where(is_industrial, 20.0 + 60.0 * p["cur_base"], 2.0 + 10.0 * p["cur_base"])
    current = np.maximum(base_current * load * (1.0 + 0.05 * noise[:, 3]), 0.05)
    pf = np.minimum(p["pf"] + 0.01 * noise[:, 4], 0.999)
    power = voltage * current * pf
    signal = np.clip(p["sig_base"] + 2.0 * rng.standard_normal(n), -140.0, -30.0)
    # Trackers run down over two days and are recharged; thermostats drain over months.
    cycle = (absolute / (2 * DAY_S) + p["batt_phase"]) % 1.0
    battery = np.where(
        is_tracker, 100.0 - 85.0 * cycle, 95.0 - 40.0 * ((absolute / (180 * DAY_S)) % 1.0)
    )

    metrics = np.full((n, len(c.METRICS)), np.nan)
    metrics[:, _M["temperature_c"]] = temp
    metrics[:, _M["humidity_pct"]] = humidity
    metrics[:, _M["voltage_v"]] = voltage
    metrics[:, _M["current_a"]] = current
    metrics[:, _M["power_w"]] = power
    metrics[:, _M["battery_pct"]] = battery
    metrics[:, _M["signal_dbm"]] = signal

    # Trackers drive round a loop centred on their site at a steady speed.
    radius = p["radius_km"]
    theta = p["theta0"] + (p["speed_kmh"] / radius) * (absolute / 3600.0)
    coslat = np.cos(np.radians(site_lat))
    jitter = rng.normal(0.0, 2e-5, (n, 2))
    lat = site_lat + jitter[:, 0] + np.where(is_tracker, radius / 111.0 * np.sin(theta), 0.0)
    lon = (
        site_lon
        + jitter[:, 1]
        + np.where(is_tracker, radius / (111.0 * coslat) * np.cos(theta), 0.0)
    )
    return metrics, lat, lon, pf


class Simulation:
    """A seeded fleet sending telemetry with injected scenarios, slice by slice (no Kafka)."""

    def __init__(
        self,
        settings: SimulatorSettings,
        registry: pa.Table,
        *,
        start_time: datetime | None = None,
        run_id: str | None = None,
    ) -> None:
        self.settings = settings
        self.rng = np.random.default_rng(settings.seed)
        self.fleet = Fleet(registry, settings, self.rng)
        start = start_time or settings.start_time or datetime.now(timezone.utc)
        self.start_time = sc.utc(start)
        self.start_epoch = self.start_time.timestamp()
        self.start_ms = round(self.start_epoch * 1000)
        self.run_id = run_id or settings.run_id or str(uuid.uuid4())
        self.t = 0.0
        self.active: list[sc.Injection] = []
        self.ground_truth: list[sc.GroundTruthRow] = []
        self._busy: set[int] = set()
        self._injections = 0
        self._registered = int(self.fleet.registered.sum())
        # Send time of the last message kept when ``batches(count=...)`` cut a batch short.
        self.cut_at: float | None = None

    @property
    def now(self) -> datetime:
        """The simulated clock."""
        from datetime import timedelta

        return self.start_time + timedelta(seconds=self.t)

    @property
    def natural_rate(self) -> float:
        """Clean events per simulated second of the whole fleet."""
        live = self.fleet.live_from == -np.inf
        return float((1.0 / self.fleet.params["interval"][live]).sum())

    def default_slice_s(self) -> float:
        """The slice that yields about ``settings.batch_events`` events."""
        return float(np.clip(self.settings.batch_events / max(self.natural_rate, 1e-9), 0.5, 600))

    # --- scenarios -------------------------------------------------------------------------------
    def inject(
        self,
        scenario: str,
        *,
        device_id: str | None = None,
        start_s: float | None = None,
        duration_s: float | None = None,
        **params: Any,
    ) -> sc.Injection:
        """Schedule one injection explicitly (tests, demos); random parts come from the seed."""
        if scenario not in c.SCENARIOS:
            raise ValueError(f"unknown scenario {scenario!r}")
        start = self.t if start_s is None else float(start_s)
        duration = duration_s or float(
            self.rng.uniform(self.settings.scenario_min_s, self.settings.scenario_max_s)
        )
        if scenario == "rogue_device":
            dev = self._new_rogue(start, start + duration)
        elif device_id is not None:
            matches = np.flatnonzero(self.fleet.ids == device_id)
            if matches.size == 0:
                raise ValueError(f"device {device_id!r} is not in the fleet")
            dev = int(matches[0])
        else:
            picked = self._pick_device(scenario)
            if picked is None:
                raise ValueError(f"no free device fits scenario {scenario!r}")
            dev = picked
        device_type = TYPES[int(self.fleet.type_code[dev])]
        chosen = sc.choose_params(scenario, device_type, self.rng, self.settings.malformed_reasons)
        if scenario == "clock_skew" and chosen["skew_s"] > 0:
            chosen["skew_s"] = round(chosen["skew_s"] + self._behind_wall_clock(start), 1)
        chosen.update(params)
        self._injections += 1
        injection = sc.Injection(
            scenario_id=str(uuid.UUID(bytes=self.rng.bytes(16), version=4)),
            scenario=scenario,
            dev=dev,
            start=start,
            end=start + duration,
            params=chosen,
        )
        chosen["index"] = self._injections
        if scenario == "firmware_change":
            chosen["firmware_code"] = self.fleet.firmware_code(chosen["firmware"])
        self.active.append(injection)
        self._busy.add(dev)
        log.debug("inject %s on %s at %.0f s", scenario, self.fleet.ids[dev], start)
        return injection

    def _new_rogue(self, start: float, end: float) -> int:
        near = int(self.rng.integers(self._registered))
        lat = float(self.fleet.site_lat[near] + self.rng.uniform(-0.2, 0.2))
        lon = float(self.fleet.site_lon[near] + self.rng.uniform(-0.2, 0.2))
        device_type = TYPES[int(self.rng.integers(len(TYPES)))]
        rogue_id = f"rogue-{self.rng.bytes(2).hex()}"
        dev = self.fleet.add_device(rogue_id, device_type, lat, lon, self.rng)
        self.fleet.live_from[dev] = start
        self.fleet.live_to[dev] = end
        return dev

    def _pick_device(self, scenario: str) -> int | None:
        for _ in range(50):
            dev = int(self.rng.integers(self._registered))
            if dev in self._busy or self.fleet.live_from[dev] != -np.inf:
                continue
            if sc.eligible(scenario, TYPES[int(self.fleet.type_code[dev])]):
                return dev
        return None

    def _plan(self, t0: float, t1: float) -> None:
        per_thousand = self._registered / 1000.0
        for scenario in c.SCENARIOS:
            rate = self.settings.rate_of(scenario) * per_thousand
            if rate <= 0:
                continue
            for _ in range(int(self.rng.poisson(rate * (t1 - t0) / 3600.0))):
                start = float(self.rng.uniform(t0, t1))
                if not self._may_start(scenario, start):
                    continue
                try:
                    self.inject(scenario, start_s=start)
                except ValueError:
                    log.debug("no free device for %s; skipped", scenario)

    def _behind_wall_clock(self, t: float) -> float:
        """How far the simulated clock is behind the wall clock at ``t`` simulated seconds, in a
        run faster than real time that ends near now (0 otherwise). A device clock "ahead" is
        ahead of real time, as in production, so the pipeline's clock check sees it: ahead of
        a simulated clock that lags by an hour it would pass as on time, and move the watermark
        past every other device's events."""
        s = self.settings
        if not (s.duration and s.accelerate > 1.0) or s.start_time is not None:
            return 0.0
        span = s.duration * s.accelerate
        return max(0.0, (span - t) * (1.0 - 1.0 / s.accelerate))

    def _may_start(self, scenario: str, start: float) -> bool:
        """Whether an injection may start at ``start`` simulated seconds: after the warm-up for
        scenarios that change readings, and before a bounded run's quiet tail."""
        s = self.settings
        if scenario in sc.VALUE_SCENARIOS and start < s.scenario_warmup_s:
            return False
        span = s.duration * s.accelerate if s.duration and s.accelerate > 0 else None
        return span is None or s.quiet_tail_s <= 0 or start < span - s.quiet_tail_s

    # --- generation ------------------------------------------------------------------------------
    def next_batch(self, slice_s: float | None = None) -> Batch:
        """Generate the messages of the next ``slice_s`` simulated seconds."""
        t0 = self.t
        t1 = t0 + (slice_s or self.default_slice_s())
        self._plan(t0, t1)
        dev, t = self.fleet.schedule(t0, t1)
        parts = [(dev, t, np.full(dev.size, -1, np.int64))]
        for inj in self.active:
            if inj.scenario in ("flood", "cloned_device") and inj.start < t1 and inj.end > t0:
                parts.append(self._extra_reports(inj, t0, t1))
        dev = np.concatenate([p[0] for p in parts])
        t = np.concatenate([p[1] for p in parts])
        clone = np.concatenate([p[2] for p in parts])
        metrics, lat, lon, pf = signals(self.fleet, dev, t, self.start_epoch, self.rng)
        events = Events(
            dev=dev,
            t=t,
            t_event=t.copy(),
            lat=lat,
            lon=lon,
            metrics=metrics,
            firmware=self.fleet.firmware[dev],
            seq=np.zeros(dev.size, np.int64),
            tag=np.zeros(dev.size, np.int8),
            clone=clone,
        )
        self._assign_seq(events)
        by_device = np.argsort(events.dev, kind="stable")
        sorted_devices = events.dev[by_device]
        for inj in self.active:
            if inj.start < t1 and inj.end > t0 and inj.scenario not in sc.EXTRA_MESSAGES:
                lo, hi = np.searchsorted(sorted_devices, [inj.dev, inj.dev + 1])
                own = by_device[lo:hi]
                sc.apply_values(inj, events, pf, own)
                inj.sent += int(np.count_nonzero(events.tag[own] == inj.code))
        clamp_to_contract(events)
        order = np.argsort(events.t, kind="stable")
        events = events.take(order)
        values = encode(
            events,
            type_code=self.fleet.type_code,
            device_ids=self.fleet.id_rows(),
            firmware_table=self.fleet.firmware_rows(),
            start_ms=self.start_ms,
            event_ids=uuid4_rows(self.rng, len(events)),
        )
        keys: list[bytes] = self.fleet.keys[events.dev].tolist()
        send_times = events.t
        tags = events.tag
        # Messages of their own (replays, malformed ones): (injection, send time, key, value,
        # quarantine label or None).
        extras: list[tuple[sc.Injection, float, bytes, bytes, str | None]] = []
        malformed: list[sc.Injection] = []
        for inj in self.active:
            if inj.start >= t1 or inj.end <= t0:
                continue
            if inj.scenario == "replay":
                replays = self._replay(inj, events, values, keys, (t0, t1))
                extras += [(inj, ts, key, value, None) for ts, key, value in replays]
            elif inj.scenario == "malformed":
                malformed.append(inj)
        extras += self._malformed(malformed, t0, t1)
        for inj, *_ in extras:
            inj.sent += 1
        extra_t = [e[1] for e in extras]
        extra_keys = [e[2] for e in extras]
        extra_values = [e[3] for e in extras]
        extra_labels = [e[4] for e in extras]
        extra_tags = [e[0].code for e in extras]
        labels: dict[int, str] = {}
        if extra_values:
            # The few extra messages are spliced into the time-ordered batch (after the events
            # sent at the same time, like a stable sort), not sorted with it: re-ordering the
            # batch as Python objects cost more than all the extras.
            first = np.argsort(np.asarray(extra_t), kind="stable")
            extra_at = np.asarray(extra_t)[first]
            at = np.searchsorted(events.t, extra_at, side="right")
            keys = _splice(keys, at, [extra_keys[i] for i in first])
            values = _splice(values, at, [extra_values[i] for i in first])
            send_times = np.insert(events.t, at, extra_at)
            tags = np.insert(events.tag, at, np.asarray(extra_tags, np.int8)[first])
            labels = {
                int(position): reason
                for position, reason in zip(
                    at + np.arange(at.size), [extra_labels[i] for i in first], strict=True
                )
                if reason is not None
            }
        self.t = t1
        finished = self._close_finished(t1)
        return Batch(
            keys=keys,
            values=values,
            send_times=send_times,
            tags=tags,
            labels=labels,
            start_s=t0,
            end_s=t1,
            ground_truth=finished,
        )

    def _extra_reports(
        self, inj: sc.Injection, t0: float, t1: float
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        lo, hi = max(t0, inj.start), min(t1, inj.end)
        if inj.scenario == "flood":
            step = float(inj.params["interval_s"])
            offset = 0.0
        else:
            step = float(self.fleet.params["interval"][inj.dev])
            offset = step / 2  # the clone reports between the real device's readings
        first = np.ceil((lo - inj.start - offset) / step)
        last = np.ceil((hi - inj.start - offset) / step)
        t = inj.start + offset + np.arange(first, last) * step
        t = t[(t >= lo) & (t < hi)]
        dev = np.full(t.size, inj.dev, np.int64)
        marker = -1 if inj.scenario == "flood" else int(inj.params["index"])
        return dev, t, np.full(t.size, marker, np.int64)

    def _assign_seq(self, events: Events) -> None:
        """Per-device seq counting up by 1 in time order; clones count up on their own."""
        own = np.flatnonzero(events.clone < 0)
        order = own[np.lexsort((events.t[own], events.dev[own]))]
        devs = events.dev[order]
        counts = np.bincount(devs, minlength=len(self.fleet))
        first = np.cumsum(counts) - counts
        rank = np.arange(order.size) - first[devs]
        events.seq[order] = self.fleet.seq[devs] + rank + 1
        self.fleet.seq += counts
        for inj in self.active:
            if inj.scenario != "cloned_device":
                continue
            idx = np.flatnonzero(events.clone == inj.params["index"])
            if idx.size == 0:
                continue
            if "next_seq" not in inj.params:
                # The clone copied the device's state, seq counter included.
                inj.params["next_seq"] = int(self.fleet.seq[inj.dev]) - int(counts[inj.dev]) + 1
            idx = idx[np.argsort(events.t[idx], kind="stable")]
            events.seq[idx] = inj.params["next_seq"] + np.arange(idx.size)
            inj.params["next_seq"] += idx.size

    def _replay(
        self,
        inj: sc.Injection,
        events: Events,
        values: list[bytes],
        keys: list[bytes],
        span: tuple[float, float],
    ) -> list[tuple[float, bytes, bytes]]:
        """Record the device's messages; return those due for re-sending in ``span``."""
        t0, t1 = span
        delay = float(inj.params["delay_s"])
        own = np.flatnonzero((events.dev == inj.dev) & inj.window(events.t))
        inj.recorded.extend((float(events.t[i]) + delay, keys[i], values[i]) for i in own)
        due = [r for r in inj.recorded if t0 <= r[0] < t1 and r[0] < inj.end]
        inj.recorded = [r for r in inj.recorded if r[0] >= t1 and r[0] < inj.end]
        return due

    def _malformed(
        self, injections: list[sc.Injection], t0: float, t1: float
    ) -> list[tuple[sc.Injection, float, bytes, bytes, str]]:
        """The malformed messages of ``injections`` due in ``[t0, t1)``, in injection order.

        One ``signals`` call serves every injection: called per injection, its fixed cost made
        the few malformed messages cost as much as 15 % of a batch.
        """
        step = sc.MALFORMED_INTERVAL_S
        due: list[tuple[sc.Injection, list[int]]] = []
        for inj in injections:
            lo, hi = max(t0, inj.start), min(t1, inj.end)
            first = math.ceil((lo - inj.start) / step)
            last = math.ceil((hi - inj.start) / step)
            ks = [k for k in range(first, last) if inj.start + k * step < hi]
            if inj.params["reasons"] and ks:
                due.append((inj, ks))
        if not due:
            return []
        dev = np.asarray([inj.dev for inj, ks in due for _ in ks], dtype=np.int64)
        times = np.asarray([inj.start + k * step for inj, ks in due for k in ks])
        metrics, lat, lon, _ = signals(self.fleet, dev, times, self.start_epoch, self.rng)
        out: list[tuple[sc.Injection, float, bytes, bytes, str]] = []
        i = 0
        for inj, ks in due:
            reasons: list[str] = inj.params["reasons"]
            sensors = c.DEVICE_TYPES[TYPES[int(self.fleet.type_code[inj.dev])]]
            other = self.fleet.keys[(inj.dev + 1) % self._registered]
            counts = inj.params.setdefault("counts", {})
            for k in ks:
                ts = float(times[i])
                event = {
                    "event_id": str(uuid.UUID(bytes=self.rng.bytes(16), version=4)),
                    "device_id": str(self.fleet.ids[inj.dev]),
                    "event_time": _iso(self.start_ms + round(ts * 1000)),
                    "seq": int(self.fleet.seq[inj.dev]),
                    "firmware": self.fleet.firmware_table[int(self.fleet.firmware[inj.dev])],
                    "lat": round(float(lat[i]), 6),
                    "lon": round(float(lon[i]), 6),
                    "metrics": {
                        m: (round(float(metrics[i, _M[m]]), 2) if m in sensors else None)
                        for m in c.METRICS
                    },
                }
                reason = reasons[k % len(reasons)]
                key, value, _detail = sc.malformed_message(
                    reason, event, self.fleet.keys[inj.dev], other, self.rng
                )
                counts[reason] = counts.get(reason, 0) + 1
                out.append((inj, ts, key, value, reason))
                i += 1
        return out

    def _close_finished(self, t1: float) -> list[sc.GroundTruthRow]:
        finished = [inj for inj in self.active if inj.end <= t1]
        self.active = [inj for inj in self.active if inj.end > t1]
        return [self._record(inj, inj.end) for inj in finished]

    def _record(self, inj: sc.Injection, end_s: float) -> sc.GroundTruthRow:
        self._busy.discard(inj.dev)
        row = sc.ground_truth_row(
            inj, str(self.fleet.ids[inj.dev]), self.start_time, end_s, self.run_id
        )
        self.ground_truth.append(row)
        return row

    def finish(self, until_s: float | None = None) -> list[sc.GroundTruthRow]:
        """Close the injections still running, clipped to ``until_s`` (default: the clock).

        Pass the send time of the last message actually sent when a batch was cut short.
        Returns every ground-truth row so far.
        """
        until = self.t if until_s is None else min(until_s, self.t)
        for inj in self.active:
            if inj.start < until:
                self._record(inj, until)
        self.active = []
        return list(self.ground_truth)

    def batches(
        self,
        *,
        sim_seconds: float | None = None,
        count: int | None = None,
        slice_s: float | None = None,
    ) -> Iterator[Batch]:
        """Batches until ``sim_seconds`` of simulated time or ``count`` messages (last one cut)."""
        end = None if sim_seconds is None else self.t + sim_seconds
        sent = 0
        while end is None or self.t < end - 1e-9:
            step = slice_s or self.default_slice_s()
            if end is not None:
                step = min(step, end - self.t)
            batch = self.next_batch(step)
            if count is not None and sent + len(batch) >= count:
                cut = _cut(batch, count - sent)
                self.cut_at = float(cut.send_times[-1]) if len(cut) else batch.start_s
                yield cut
                return
            sent += len(batch)
            yield batch


def _splice(items: list[bytes], at: np.ndarray, extra: list[bytes]) -> list[bytes]:
    """``items`` with ``extra[j]`` inserted before ``items[at[j]]`` (``at`` ascending)."""
    out: list[bytes] = []
    done = 0
    for position, item in zip(at.tolist(), extra, strict=True):
        out += items[done:position]
        out.append(item)
        done = position
    out += items[done:]
    return out


def _iso(epoch_ms: int) -> str:
    return str(np.datetime64(epoch_ms, "ms")) + "Z"


def _cut(batch: Batch, n: int) -> Batch:
    return Batch(
        keys=batch.keys[:n],
        values=batch.values[:n],
        send_times=batch.send_times[:n],
        tags=batch.tags[:n],
        labels={i: r for i, r in batch.labels.items() if i < n},
        start_s=batch.start_s,
        end_s=batch.end_s,
        ground_truth=batch.ground_truth,
    )


def write_jsonl(
    batches: Iterable[Batch], folder: str | os.PathLike[str], *, events_per_file: int = 100_000
) -> list[Path]:
    """Write message values as JSON-lines files (one message a line) into ``folder``.

    Files appear atomically (written under a dot-name, then renamed) so a streaming file source
    never reads half a file. Keys are not written: generate with ``malformed_reasons`` without
    key_mismatch for files. Returns the files written, in order.
    """
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    buffer: list[bytes] = []

    def flush() -> None:
        if not buffer:
            return
        final = out / f"telemetry-{len(written):06d}-{uuid.uuid4().hex[:8]}.jsonl"
        tmp = out / f".{final.name}.tmp"
        tmp.write_bytes(b"\n".join(buffer) + b"\n")
        tmp.rename(final)
        written.append(final)
        buffer.clear()

    for batch in batches:
        for value in batch.values:
            buffer.append(value)
            if len(buffer) >= events_per_file:
                flush()
    flush()
    return written
