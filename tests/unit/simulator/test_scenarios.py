"""Scenario kinds one by one: which devices they fit, when they may start, what they do to the
readings of their window (and only those), their own messages and their ground-truth window."""

from __future__ import annotations

import itertools
import json
import threading
from datetime import timedelta
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from deltalake import DeltaTable

from infra import contract as c
from infra import lake
from simulator import scenarios as sc
from simulator.events import METRIC_INDEX, Events
from simulator.fleet import Fleet
from simulator.producer import RunStats, run_simulation
from simulator.settings import SimulatorSettings
from simulator.telemetry import Batch, Simulation
from tests.unit.simulator.conftest import START

VOLT, AMP, WATT = METRIC_INDEX["voltage_v"], METRIC_INDEX["current_a"], METRIC_INDEX["power_w"]
TEMP = METRIC_INDEX["temperature_c"]
# Readings of device 0 every 10 s from 0 to 90 s; an injection runs over [30, 60).
TIMES = np.arange(0.0, 100.0, 10.0)
INSIDE = (TIMES >= 30) & (TIMES < 60)


def readings(clone: np.ndarray | None = None) -> Events:
    """Device 0's readings at ``TIMES``: 230 V, 4 A, 828 W (power factor 0.9), 20 °C."""
    n = TIMES.size
    metrics = np.full((n, len(c.METRICS)), np.nan)
    metrics[:, VOLT], metrics[:, AMP], metrics[:, WATT], metrics[:, TEMP] = 230.0, 4.0, 828.0, 20.0
    metrics[:, TEMP] += np.arange(n)  # a different value each time: stuck_sensor must freeze it
    return Events(
        dev=np.zeros(n, np.int64), t=TIMES.copy(), t_event=TIMES.copy(), lat=np.full(n, 40.0),
        lon=np.full(n, -74.0), metrics=metrics, firmware=np.zeros(n, np.int64),
        seq=np.arange(1, n + 1), tag=np.zeros(n, np.int8),
        clone=np.full(n, -1, np.int64) if clone is None else clone,
    )  # fmt: skip


def injection(kind: str, **params: Any) -> sc.Scenario:
    return sc.KINDS[kind](scenario_id="s-1", dev=0, start=30.0, end=60.0, index=1, params=params)


def applied(scenario: sc.Scenario, events: Events | None = None) -> tuple[Events, Events]:
    """(readings before, after) the scenario's effect."""
    before = readings() if events is None else events
    after = before.take(np.arange(len(before)))
    scenario.apply(after, np.arange(len(after)), np.full(len(after), 0.9))
    return before, after


def test_every_kind_of_the_contract_has_one_class() -> None:
    assert set(sc.KINDS) == set(c.SCENARIOS)
    assert all(kind.name == name for name, kind in sc.KINDS.items())
    assert len(set(sc.KINDS.values())) == len(c.SCENARIOS)


def test_the_window_starts_inclusive_and_ends_exclusive() -> None:
    scenario = injection("flood")
    assert scenario.window(TIMES).tolist() == INSIDE.tolist()
    assert scenario.overlaps(59.9, 70.0) and scenario.overlaps(0.0, 30.1)
    assert not scenario.overlaps(60.0, 70.0) and not scenario.overlaps(0.0, 30.0)


@pytest.mark.parametrize(
    ("kind", "fits"),
    [
        ("tampering", {"smart_meter", "industrial_sensor"}),
        ("spike", set(c.DEVICE_TYPES)),
        ("dip", set(c.DEVICE_TYPES)),
        ("drift", set(c.DEVICE_TYPES)),
        ("stuck_sensor", set(c.DEVICE_TYPES)),
        ("flood", set(c.DEVICE_TYPES)),
    ],
)
def test_kinds_fit_the_devices_whose_sensors_they_change(kind: str, fits: set[str]) -> None:
    assert {t for t in c.DEVICE_TYPES if sc.KINDS[kind].fits(t)} == fits


def test_kinds_that_change_or_withhold_readings_wait_for_the_warm_up_none_in_the_tail() -> None:
    settings = SimulatorSettings(scenario_warmup_s=600, duration=60, accelerate=60,
                                 quiet_tail_s=300)  # fmt: skip
    waiting = {k for k, kind in sc.KINDS.items() if not kind.may_start(100.0, settings)}
    assert waiting == {"tampering", "spike", "dip", "stuck_sensor", "drift", "silence",
                       "store_and_forward"}  # fmt: skip
    assert all(kind.may_start(700.0, settings) for kind in sc.KINDS.values())
    assert not any(kind.may_start(3300.0, settings) for kind in sc.KINDS.values())


def test_tampering_lowers_power_inside_the_window_only() -> None:
    before, after = applied(injection("tampering", power_factor=0.2))
    assert np.allclose(after.metrics[INSIDE, WATT], 230.0 * 4.0 * 0.2)
    assert np.array_equal(after.metrics[~INSIDE], before.metrics[~INSIDE], equal_nan=True)
    assert after.tag.tolist() == [sc.SCENARIO_CODE["tampering"] if i else 0 for i in INSIDE]


def test_spike_multiplies_current_and_power_follows() -> None:
    _, after = applied(injection("spike", metric="current_a", how="mul", amount=4.0))
    assert np.allclose(after.metrics[INSIDE, AMP], 16.0)
    assert np.allclose(after.metrics[INSIDE, WATT], 230.0 * 16.0 * 0.9)
    assert np.allclose(after.metrics[~INSIDE, AMP], 4.0)


def test_drift_ramps_from_the_window_start() -> None:
    before, after = applied(injection("drift", metric="voltage_v", how="ramp", amount=2.0))
    minutes = (TIMES[INSIDE] - 30.0) / 60.0
    assert np.allclose(after.metrics[INSIDE, VOLT], 230.0 + 2.0 * minutes)
    assert np.array_equal(after.metrics[~INSIDE, VOLT], before.metrics[~INSIDE, VOLT])


def test_stuck_sensor_repeats_its_first_reading_of_the_window() -> None:
    scenario = injection("stuck_sensor", metric="temperature_c")
    before, after = applied(scenario)
    first = round(float(before.metrics[INSIDE, TEMP][0]), 2)
    assert after.metrics[INSIDE, TEMP].tolist() == [first] * int(INSIDE.sum())
    assert scenario.params["value"] == first  # recorded in the ground truth's details
    assert len(set(after.metrics[~INSIDE, TEMP].tolist())) == int((~INSIDE).sum())


def test_impossible_travel_jumps_and_comes_back() -> None:
    _, after = applied(injection("impossible_travel", dlat=12.0, dlon=-25.0))
    assert np.allclose(after.lat[INSIDE], 52.0) and np.allclose(after.lon[INSIDE], -99.0)
    assert np.allclose(after.lat[~INSIDE], 40.0) and np.allclose(after.lon[~INSIDE], -74.0)


def test_a_clone_moves_only_its_own_readings_and_both_senders_are_tagged() -> None:
    clone = np.where(TIMES == 50.0, 1, -1).astype(np.int64)  # one reading of the window
    scenario = injection("cloned_device", dlat=5.0, dlon=8.0)
    _, after = applied(scenario, readings(clone))
    assert after.lat[clone == 1].tolist() == [45.0] and after.lon[clone == 1].tolist() == [-66.0]
    assert np.allclose(after.lat[clone < 0], 40.0) and np.allclose(after.lon[clone < 0], -74.0)
    assert (after.tag != 0).tolist() == INSIDE.tolist()
    assert scenario.sent == int(INSIDE.sum())


def test_a_clone_counts_its_seq_up_from_the_device_s_own() -> None:
    clone = np.where(TIMES >= 50.0, 1, -1).astype(np.int64)
    events = readings(clone)
    scenario = injection("cloned_device", dlat=5.0, dlon=8.0)
    scenario.number(events, device_seq=41)
    assert events.seq[clone == 1].tolist() == [42, 43, 44, 45, 46]
    scenario.number(events, device_seq=99)  # the next slice goes on from where it stopped
    assert events.seq[clone == 1].tolist() == [47, 48, 49, 50, 51]


def test_firmware_change_and_clock_skew(registry: pa.Table) -> None:
    fleet = Fleet(registry, SimulatorSettings(), np.random.default_rng(0))
    firmware = injection("firmware_change", firmware="9.9.0-unsigned")
    firmware.prepare(fleet)
    _, after = applied(firmware)
    assert {fleet.firmware_table[f] for f in after.firmware[INSIDE]} == {"9.9.0-unsigned"}
    assert after.firmware[~INSIDE].tolist() == [0] * int((~INSIDE).sum())
    _, after = applied(injection("clock_skew", skew_s=-3600.0))
    assert np.array_equal(after.t_event, np.where(INSIDE, TIMES - 3600.0, TIMES))
    assert np.array_equal(after.t, TIMES)  # sent on time, stamped late


@pytest.mark.parametrize("kind", ["flood", "rogue_device", "replay", "malformed"])
def test_kinds_whose_messages_are_the_scenario_leave_readings_alone(kind: str) -> None:
    before, after = applied(injection(kind))
    assert np.array_equal(after.metrics, before.metrics, equal_nan=True)
    tagged = kind in ("flood", "rogue_device")  # their readings are the scenario's
    assert (after.tag != 0).tolist() == (INSIDE if tagged else np.zeros_like(INSIDE)).tolist()


def test_a_flood_reports_every_half_second_once_across_slices(registry: pa.Table) -> None:
    fleet = Fleet(registry, SimulatorSettings(), np.random.default_rng(0))
    flood = injection("flood", interval_s=0.5)
    edges = [0.0, 33.3, 41.7, 59.95, 90.0]
    times = [t for t0, t1 in itertools.pairwise(edges)
             for t in flood.extra_reports(fleet, t0, t1)[1].tolist()]  # fmt: skip
    assert times == [30.0 + 0.5 * k for k in range(60)]


def test_replay_resends_the_device_s_messages_byte_for_byte_after_the_delay(
    registry: pa.Table,
) -> None:
    fleet = Fleet(registry, SimulatorSettings(), np.random.default_rng(0))
    replay = sc.KINDS["replay"](scenario_id="s", dev=0, start=30.0, end=200.0, index=1,
                                params={"delay_s": 60.0})  # fmt: skip
    events = readings()
    values = [f"value {t:.0f}".encode() for t in TIMES]
    keys = [b"dev-000000"] * TIMES.size

    def resent(t0: float, t1: float) -> list[tuple[float, bytes]]:
        now = sc.Slice(t0, t1, fleet, np.random.default_rng(0), START.timestamp(), events,
                       keys, values)  # fmt: skip
        return [(m.send_s, m.value) for m in sc.Replay.messages([replay], now)]

    assert resent(0.0, 100.0) == [(90.0, b"value 30")]
    events, values = readings().take(np.arange(0)), []  # nothing more sent by the device
    assert resent(100.0, 200.0) == [(100.0, b"value 40"), (110.0, b"value 50"),
                                    (120.0, b"value 60"), (130.0, b"value 70"),
                                    (140.0, b"value 80"), (150.0, b"value 90")]  # fmt: skip
    assert replay.sent == 7


def test_ground_truth_is_the_window_clipped_where_the_run_stopped() -> None:
    scenario = injection("spike", metric="temperature_c", how="add", amount=30.0)
    scenario.sent = 3
    whole = scenario.ground_truth_row("dev-000000", START, 100.0, "run")
    assert (whole.start_time, whole.end_time) == (START + timedelta(seconds=30),
                                                  START + timedelta(seconds=60))  # fmt: skip
    assert scenario.ground_truth_row("d", START, 45.0, "run").end_time == START + timedelta(
        seconds=45
    )
    assert scenario.ground_truth_row("d", START, 10.0, "run").end_time == whole.start_time
    assert json.loads(whole.details) == {"metric": "temperature_c", "how": "add",
                                         "amount": 30.0, "messages": 3}  # fmt: skip
    assert (whole.scenario, whole.scenario_id, whole.run_id) == ("spike", "s-1", "run")


def busy_run(registry: pa.Table) -> Simulation:
    settings = SimulatorSettings(devices=200, seed=4, scenario_rate=400, batch_events=2000,
                                 scenario_min_s=60, scenario_max_s=240)  # fmt: skip
    return Simulation(settings, registry, start_time=START, run_id="r")


def truth(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows by scenario id, without ``details``: they count the messages an injection made,
    including those of batches generated but never sent."""
    return sorted(({k: v for k, v in r.items() if k != "details"} for r in rows),
                  key=lambda r: r["scenario_id"])  # fmt: skip


def test_injections_that_ended_in_unsent_batches_are_closed_where_sending_stopped(
    registry: pa.Table,
) -> None:
    sim = busy_run(registry)
    batches = [sim.next_batch(60.0) for _ in range(8)]
    sent, unsent = batches[:5], batches[5:]
    until = float(sent[-1].send_times[-1])
    rows = sim.finish(until, unsent=unsent)

    reference = busy_run(registry)
    for _ in sent:
        reference.next_batch(60.0)
    assert truth([r.as_dict() for r in rows]) == truth(
        [r.as_dict() for r in reference.finish(until)]
    )
    reopened = {s.scenario_id for b in unsent for s in b.ended if s.start < until}
    assert reopened, "no injection ended in the unsent batches: the case is not exercised"
    end = START + timedelta(seconds=until)
    assert all(r.end_time == end for r in rows if r.scenario_id in reopened)
    assert all(r.start_time < end for r in rows)


class MemorySender:
    """Keeps what ``run_simulation`` sends; stops the run after ``stop_after`` messages."""

    def __init__(self, stop: threading.Event, stop_after: int) -> None:
        self.stats = RunStats()
        self.stop, self.stop_after = stop, stop_after
        self.values: list[bytes] = []

    def send(self, keys: list[bytes], values: list[bytes]) -> None:
        self.values += values
        self.stats.sent += len(values)
        if len(self.values) >= self.stop_after:
            self.stop.set()

    def flush(self, timeout_s: float = 60.0) -> int:
        return 0

    def queue_length(self) -> int:
        return 0


def test_a_stopped_run_writes_the_ground_truth_of_what_it_sent(
    registry: pa.Table, tmp_path: Any
) -> None:
    # Generation runs ahead of sending; the injections it ended in batches never sent must be
    # clipped to the last message sent, as if the run had generated nothing beyond it.
    settings = busy_run(registry).settings.model_copy(
        update={"accelerate": 0.0, "lake_root": str(tmp_path)}
    )
    stop = threading.Event()
    sender = MemorySender(stop, stop_after=12_000)
    sim = Simulation(settings, registry, start_time=START, run_id="r")
    stats = run_simulation(settings, sim, stop=stop, sender=sender)  # type: ignore[arg-type]
    assert stats.stopped_by == "signal" and stats.sent == len(sender.values) >= 12_000

    reference = busy_run(registry)
    sent: list[Batch] = []
    while sum(len(b) for b in sent) < stats.sent:
        sent.append(reference.next_batch(reference.default_slice_s()))
    assert [v for b in sent for v in b.values] == sender.values
    expected = reference.finish(float(sent[-1].send_times[-1]))
    written = DeltaTable(lake.table_path(str(tmp_path), lake.GROUND_TRUTH)).to_pyarrow_table()
    assert truth(written.to_pylist()) == truth([r.as_dict() for r in expected])
    assert stats.injections == len(expected)
