"""The fleet and its clean signals: who reports, when, and what an untouched device reads.

``Fleet`` holds one numpy array per device attribute (identity, site, expected firmware, reporting
interval, signal parameters), so a slice of simulated time is generated for every device at once.
``signals`` gives the clean readings; scenarios (``simulator.scenarios``) change them afterwards.
"""

from __future__ import annotations

import logging
from datetime import datetime

import numpy as np
import pyarrow as pa

from infra import contract as c
from simulator.events import METRIC_INDEX, TYPES, StringTable, padded_strings
from simulator.settings import SimulatorSettings

log = logging.getLogger(__name__)

DAY_S = 86400.0
_M = METRIC_INDEX
# How fast a device's reading counter is taken to have counted since 1970 when a run starts.
SEQ_PER_SECOND = 10


def first_seq(start: datetime) -> int:
    """The counter every device has reached when a run's simulated clock starts at ``start``.

    A real device's counter goes on when whatever relays its readings restarts. Counted from 0 in
    every run, a rerun's first readings had the sequence numbers of the last run's in every window
    holding both: more readings than numbers, which the clone rule reads as a second sender with
    the device's id (the whole fleet, on a demo run again within ten minutes). Counted from the
    start time at a pace no device reaches (a flood sends 2 readings a second), a later run's
    numbers begin past every number an earlier one used.
    """
    return int(start.timestamp()) * SEQ_PER_SECOND


class Fleet:
    """Per-device arrays: identity, reporting interval and signal parameters.

    The registry's devices come first (``n_registered`` of them); rogue devices, which are not in
    the registry, are appended while the simulation runs.
    """

    def __init__(
        self,
        registry: pa.Table,
        settings: SimulatorSettings,
        rng: np.random.Generator,
        *,
        first_seq: int = 0,
    ):
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
        self.n_registered = n
        active = np.asarray([s == "active" for s in data["status"]], dtype=bool)
        self.live_from = np.where(active, -np.inf, np.inf)
        self.live_to = np.full(n, np.inf)
        self.first_seq = first_seq  # each device's counter before its first reading
        self.seq = np.full(n, first_seq, dtype=np.int64)
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
        self.live_from = np.append(self.live_from, np.inf)
        self.live_to = np.append(self.live_to, np.inf)
        self.seq = np.append(self.seq, self.first_seq)
        extra = self._signal_params(1, 10.0, 30.0, rng)
        for name, values in extra.items():
            self.params[name] = np.append(self.params[name], values)
        return index

    def index_of(self, device_id: str) -> int:
        """The index of ``device_id``; ValueError when the fleet has no such device."""
        matches = np.flatnonzero(self.ids == device_id)
        if matches.size == 0:
            raise ValueError(f"device {device_id!r} is not in the fleet")
        return int(matches[0])

    def device_type(self, dev: int) -> str:
        return TYPES[int(self.type_code[dev])]

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
