"""Telemetry generation: determinism, the wire format, clean signals and every scenario's effect."""

from __future__ import annotations

import itertools
import json
import math
from collections import defaultdict
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from infra import contract as c
from simulator.events import fixed_point, iso_times, uuid4_rows
from simulator.settings import SimulatorSettings
from simulator.telemetry import Simulation, write_jsonl
from tests.unit.simulator.conftest import START, Run


def _events(batches: Any) -> list[tuple[bytes, bytes, float, str | None, str | None]]:
    """(key, value, send time, scenario, malformed label) of every message."""
    out = []
    for b in batches:
        for i, (key, value) in enumerate(zip(b.keys, b.values, strict=True)):
            out.append((key, value, float(b.send_times[i]), b.scenario_of(i), b.labels.get(i)))
    return out


def _time(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def _km(lat1: float, lon1: float, lat2: float, lon2: float) -> float:
    p1, p2 = math.radians(lat1), math.radians(lat2)
    a = (
        math.sin((p2 - p1) / 2) ** 2
        + math.cos(p1) * math.cos(p2) * math.sin(math.radians(lon2 - lon1) / 2) ** 2
    )
    return 2 * 6371.0 * math.asin(math.sqrt(min(1.0, a)))


def _ratio(event: dict[str, Any]) -> float:
    m = event["metrics"]
    return float(m["power_w"] / (m["voltage_v"] * m["current_a"]))


def _out_of_range(event: dict[str, Any]) -> list[str]:
    values = {"lat": event["lat"], "lon": event["lon"], **event["metrics"]}
    return [
        name
        for name, v in values.items()
        if v is not None and not c.VALID_RANGES[name][0] <= v <= c.VALID_RANGES[name][1]
    ]


def _clean_run(registry: pa.Table, seed: int = 3, seconds: float = 1800) -> list[Any]:
    settings = SimulatorSettings(devices=200, seed=seed, scenarios=[], batch_events=4000)
    sim = Simulation(settings, registry, start_time=START)
    return list(sim.batches(sim_seconds=seconds))


def test_same_seed_gives_the_same_messages(registry: pa.Table) -> None:
    first = _clean_run(registry, seed=5, seconds=600)
    second = _clean_run(registry, seed=5, seconds=600)
    other = _clean_run(registry, seed=6, seconds=600)
    assert [b.values for b in first] == [b.values for b in second]
    assert [b.keys for b in first] == [b.keys for b in second]
    assert [b.values for b in first] != [b.values for b in other]


def test_same_seed_gives_the_same_scenarios(registry: pa.Table) -> None:
    def run() -> tuple[list[bytes], list[tuple[str, str]]]:
        settings = SimulatorSettings(devices=200, seed=9, scenario_rate=200.0)
        sim = Simulation(settings, registry, start_time=START, run_id="r")
        values = [v for b in sim.batches(sim_seconds=1200) for v in b.values]
        return values, [(r.scenario, r.device_id) for r in sim.finish()]

    values_a, truth_a = run()
    values_b, truth_b = run()
    assert values_a == values_b
    assert truth_a == truth_b
    assert len(truth_a) > 10


def test_clean_messages_follow_the_contract(registry: pa.Table) -> None:
    batches = _clean_run(registry)
    types = dict(zip(registry.column("device_id").to_pylist(),
                     registry.column("device_type").to_pylist(), strict=True))  # fmt: skip
    messages = _events(batches)
    assert len(messages) > 10_000
    ids = set()
    for key, value, _t, scenario, _label in messages[:5000]:
        assert scenario is None
        event = json.loads(value)
        assert [k for k, _ in c.EVENT_FIELDS] == list(event)
        assert list(event["metrics"]) == list(c.METRICS)
        assert key.decode() == event["device_id"]
        assert event["event_time"].endswith("Z")
        assert _time(event["event_time"]).tzinfo is not None
        sensors = c.DEVICE_TYPES[types[event["device_id"]]]
        for metric, reading in event["metrics"].items():
            if metric in sensors:
                low, high = c.VALID_RANGES[metric]
                assert isinstance(reading, float) and low <= reading <= high, (metric, reading)
            else:
                assert reading is None
        ids.add(event["event_id"])
    assert len(ids) == 5000


def test_clean_devices_report_steadily_with_consistent_signals(registry: pa.Table) -> None:
    per_device: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for _key, value, _t, _s, _l in _events(_clean_run(registry)):
        per_device[json.loads(value)["device_id"]].append(json.loads(value))
    active = registry.filter(pa.compute.equal(registry.column("status"), "active")).num_rows
    assert len(per_device) == active  # retired devices stay silent
    site = {r["device_id"]: r for r in registry.to_pylist()}
    for device_id, events in per_device.items():
        seqs = [e["seq"] for e in events]
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), device_id
        times = [_time(e["event_time"]) for e in events]
        gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(times)]
        assert min(gaps) >= 9.9 and max(gaps) <= 30.1, device_id
        first = events[0]["metrics"]
        if first["power_w"] is not None:
            ratios = [_ratio(e) for e in events]
            assert min(ratios) > 0.8 and max(ratios) < 1.0
        for metric in c.METRICS:
            if first[metric] is not None and metric != "battery_pct":
                assert len({e["metrics"][metric] for e in events[:10]}) > 1, (device_id, metric)
        speeds = [
            _km(a["lat"], a["lon"], b["lat"], b["lon"]) / (gap / 3600)
            for a, b, gap in zip(events, events[1:], gaps, strict=False)
        ]
        assert max(speeds) < 130, device_id
        far = max(_km(e["lat"], e["lon"], site[device_id]["site_lat"], site[device_id]["site_lon"])
                  for e in events)  # fmt: skip
        assert far < 40, device_id


def test_every_scenario_is_in_the_stream_and_in_ground_truth(scenario_run: Run) -> None:
    truth = {row.scenario: row for row in scenario_run.ground_truth}
    assert set(truth) == set(c.SCENARIOS)
    for i, scenario in enumerate(c.SCENARIOS):
        row = truth[scenario]
        assert row.start_time == START + timedelta(seconds=120 + 30 * i)
        assert row.end_time == row.start_time + timedelta(seconds=900)
        assert row.run_id == "test-run"
        details = json.loads(row.details)
        # A silence sends nothing: what it withheld is its effect.
        assert details["withheld" if scenario == "silence" else "messages"] > 0, scenario
    tagged: dict[str, list[tuple[bytes, float]]] = defaultdict(list)
    for key, _value, t, tag, _label in _events(scenario_run.batches):
        if tag:
            tagged[tag].append((key, t))
    assert set(tagged) == set(c.SCENARIOS) - {"silence"}
    for scenario, messages in tagged.items():
        row = truth[scenario]
        start = (row.start_time - START).total_seconds()
        end = (row.end_time - START).total_seconds()
        if scenario == "store_and_forward":  # the burst, when the device is back online
            assert all(end <= t < end + 1.0 for _k, t in messages), scenario
            continue
        assert all(start <= t < end for _k, t in messages), scenario
        if scenario != "malformed":  # a key_mismatch message carries another device's key
            assert {k.decode() for k, _t in messages} == {row.device_id}, scenario
    registered = set(scenario_run.registry.column("device_id").to_pylist())
    assert truth["rogue_device"].device_id not in registered
    assert all(r.device_id in registered for r in truth.values() if r.scenario != "rogue_device")


def _device_events(run: Run, scenario: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(events of the scenario's device inside the window, the device's events outside it)."""
    row = next(r for r in run.ground_truth if r.scenario == scenario)
    inside: list[dict[str, Any]] = []
    outside: list[dict[str, Any]] = []
    for _key, value, t, tag, _label in _events(run.batches):
        try:
            event = json.loads(value)
        except ValueError:
            continue
        if event.get("device_id") != row.device_id:
            continue
        send = START + timedelta(seconds=t)
        (inside if row.start_time <= send < row.end_time and tag else outside).append(event)
    return inside, outside


def test_scenario_effects(scenario_run: Run) -> None:
    details = {r.scenario: json.loads(r.details) for r in scenario_run.ground_truth}

    inside, outside = _device_events(scenario_run, "tampering")
    ratio = [_ratio(e) for e in inside]
    assert max(ratio) < 0.4 and len(inside) >= 20

    inside, outside = _device_events(scenario_run, "stuck_sensor")
    metric = details["stuck_sensor"]["metric"]
    assert len({e["metrics"][metric] for e in inside}) == 1 and len(inside) >= 20
    assert len({e["metrics"][metric] for e in outside}) > 1

    inside, _ = _device_events(scenario_run, "flood")
    assert len(inside) / 15 > 60  # per minute, over the 15-minute window

    inside, outside = _device_events(scenario_run, "impossible_travel")
    assert min(_km(e["lat"], e["lon"], outside[0]["lat"], outside[0]["lon"]) for e in inside) > 1000

    inside, _ = _device_events(scenario_run, "cloned_device")
    far = [e for e in inside if _km(e["lat"], e["lon"], inside[0]["lat"], inside[0]["lon"]) > 300]
    near = [e for e in inside if e not in far]
    assert far and near
    assert len({e["seq"] for e in inside}) < len(inside)  # both senders use the same seq numbers

    inside, _ = _device_events(scenario_run, "firmware_change")
    assert {e["firmware"] for e in inside} == {details["firmware_change"]["firmware"]}

    inside, _ = _device_events(scenario_run, "clock_skew")
    skew = details["clock_skew"]["skew_s"]
    row = next(r for r in scenario_run.ground_truth if r.scenario == "clock_skew")
    offsets = [(_time(e["event_time"]) - row.start_time).total_seconds() for e in inside]
    assert all(skew - 1 <= o <= skew + 901 for o in offsets)

    row = next(r for r in scenario_run.ground_truth if r.scenario == "replay")
    seen: dict[str, bytes] = {}
    replayed = 0
    for _key, value, _t, tag, _label in _events(scenario_run.batches):
        if tag == "malformed":
            continue
        event_id = json.loads(value)["event_id"]
        if tag == "replay":
            assert seen[event_id] == value  # an earlier message, byte for byte
            replayed += 1
        elif event_id:
            seen.setdefault(event_id, value)
    assert replayed == details["replay"]["messages"] > 10


def test_malformed_messages_are_malformed_as_labelled(scenario_run: Run) -> None:
    labelled = [(k, v, label) for k, v, _t, _s, label in _events(scenario_run.batches) if label]
    assert {label for _k, _v, label in labelled} == set(SimulatorSettings().malformed_reasons)
    for key, value, label in labelled:
        if label == c.REASON_OVERSIZE:
            assert len(value) > c.MAX_MESSAGE_BYTES
            assert json.loads(value)["device_id"] == key.decode()
            continue
        assert len(value) <= c.MAX_MESSAGE_BYTES
        if label == c.REASON_INVALID_UTF8:
            with pytest.raises(UnicodeDecodeError):
                value.decode("utf-8")
            continue
        if label == c.REASON_INVALID_JSON:
            with pytest.raises(ValueError):
                json.loads(value)
            continue
        event = json.loads(value)
        missing = [f for f in c.REQUIRED_FIELDS if f not in event]
        assert bool(missing) == (label == c.REASON_MISSING_FIELD), (label, value)
        if label == c.REASON_WRONG_TYPE:
            assert (
                isinstance(event["seq"], str)
                or isinstance(event["lat"], str)
                or isinstance(event["metrics"]["temperature_c"], str)
            )
        if label == c.REASON_BAD_TIMESTAMP:
            text = event["event_time"]
            try:
                bad = _time(text) < datetime(2000, 1, 1, tzinfo=timezone.utc)
            except ValueError:
                bad = True
            assert bad, text
        if label == c.REASON_OUT_OF_RANGE:
            assert len(_out_of_range(event)) == 1
        if label == c.REASON_KEY_MISMATCH:
            assert key.decode() != event["device_id"]
        else:
            assert key.decode() == event.get("device_id", key.decode())


def test_write_jsonl_writes_one_message_a_line(registry: pa.Table, tmp_path: Path) -> None:
    batches = _clean_run(registry, seconds=300)
    files = write_jsonl(batches, tmp_path / "landing", events_per_file=1000)
    lines = [line for f in files for line in f.read_bytes().splitlines()]
    assert lines == [v for b in batches for v in b.values]
    assert len(files) > 1 and not list((tmp_path / "landing").glob(".*"))


def test_count_cuts_the_last_batch(registry: pa.Table) -> None:
    settings = SimulatorSettings(devices=200, seed=1, batch_events=1000)
    sim = Simulation(settings, registry, start_time=START)
    assert sum(len(b) for b in sim.batches(count=2500)) == 2500


def test_fixed_point_round_trips() -> None:
    values = np.random.default_rng(0).uniform(-2000, 2000, 10_000)
    values[:4] = [0.0, -0.001, -0.5, 999.999]
    rows = np.ascontiguousarray(fixed_point(values, 2))
    text = rows.view(f"S{rows.shape[1]}").ravel()
    assert np.allclose([float(t) for t in text], values, atol=0.0051)
    assert [t.strip() for t in text[:4]] == [b"0.00", b"0.00", b"-0.50", b"1000.00"]


def test_iso_times_and_uuids() -> None:
    ms = np.array([0, 1_767_225_600_123, 1_767_225_599_999, 951_782_400_000], dtype=np.int64)
    text = [bytes(r).decode() for r in iso_times(ms)]
    assert text == ["1970-01-01T00:00:00.000Z", "2026-01-01T00:00:00.123Z",
                    "2025-12-31T23:59:59.999Z", "2000-02-29T00:00:00.000Z"]  # fmt: skip
    import uuid

    ids = [bytes(r).decode() for r in uuid4_rows(np.random.default_rng(1), 100)]
    assert all(uuid.UUID(i).version == 4 and str(uuid.UUID(i)) == i for i in ids)
    assert len(set(ids)) == 100


@pytest.mark.parametrize("pause_min", [5, -15], ids=["after-a-pause", "clocks-overlapping"])
def test_a_rerun_numbers_each_devices_readings_after_the_last_run(
    registry: pa.Table, pause_min: int
) -> None:
    # The same command again (same seed), five minutes after the first run ended; or an
    # accelerated demo's rerun, whose simulated clock starts before the last run's ended.
    settings = SimulatorSettings(devices=200, seed=3, scenarios=[], batch_events=4000)
    runs = []
    for start in (START, START + timedelta(minutes=20 + pause_min)):
        sim = Simulation(settings, registry, start_time=start)
        runs.append([json.loads(v) for b in sim.batches(sim_seconds=1200) for v in b.values])
    seqs: dict[str, list[list[int]]] = defaultdict(lambda: [[], []])
    for run, events in enumerate(runs):
        for e in events:
            seqs[e["device_id"]][run].append(e["seq"])

    for device_id, (first, second) in seqs.items():
        assert first and second and max(first) < min(second), device_id
        # The clone rule's signal over both runs' readings: more readings than numbers.
        both = first + second
        assert len(both) - (max(both) - min(both) + 1) <= 0, device_id
