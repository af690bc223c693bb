"""Scenarios seen in what a device does not send: silence withholds its readings, store_and_forward
sends them later in a burst. Each run is compared with a reference run whose only difference is
that the injection never starts (same random draws), so every other message must be identical."""

from __future__ import annotations

import json
import math
import threading
from datetime import datetime, timedelta
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from pydantic import ValidationError

from infra import contract as c
from simulator import scenarios as sc
from simulator.fleet import Fleet
from simulator.producer import run_simulation
from simulator.settings import SimulatorSettings
from simulator.telemetry import Batch, Simulation
from tests.unit.simulator.conftest import START
from tests.unit.simulator.test_scenarios import MemorySender, readings

DEVICE = "dev-000003"
KEY = DEVICE.encode()
NEVER = 1e9  # a start no run reaches: the reference injection makes the same draws, no effect
SLICE_S = 60.0
SECONDS = 1800.0
# (key, value, send time, scenario tag) of every message, in send order.
Message = tuple[bytes, bytes, float, int]


def _messages(batches: list[Batch]) -> list[Message]:
    return [
        (key, value, float(b.send_times[i]), int(b.tags[i]))
        for b in batches
        for i, (key, value) in enumerate(zip(b.keys, b.values, strict=True))
    ]


def _run(
    registry: pa.Table, kind: str, start: float, duration: float, **params: Any
) -> tuple[sc.Scenario, list[Message], list[sc.GroundTruthRow]]:
    settings = SimulatorSettings(devices=200, seed=21, scenarios=[], batch_events=3000)
    sim = Simulation(settings, registry, start_time=START, run_id="r")
    injection = sim.inject(kind, device_id=DEVICE, start_s=start, duration_s=duration, **params)
    batches = list(sim.batches(sim_seconds=SECONDS, slice_s=SLICE_S))
    return injection, _messages(batches), sim.finish()


def _time(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def _sent_at(t: float) -> datetime:
    return START + timedelta(seconds=round(t, 3))


def test_silence_withholds_exactly_the_device_s_readings_of_the_window(
    registry: pa.Table,
) -> None:
    start, span = 300.5, 900.0
    silence, got, truth = _run(registry, "silence", start, span, resumes=True)
    _, reference, _ = _run(registry, "silence", NEVER, span, resumes=True)

    def withheld(m: Message) -> bool:
        return m[0] == KEY and start <= m[2] < start + span

    assert sum(map(withheld, reference)) >= 30  # a 10-30 s device: the case is exercised
    assert got == [m for m in reference if not withheld(m)]
    assert any(m[0] == KEY and m[2] >= start + span for m in got)  # it resumed
    (row,) = truth
    assert (row.scenario, row.device_id) == ("silence", DEVICE)
    assert (row.start_time, row.end_time) == (_sent_at(start), _sent_at(start + span))
    assert json.loads(row.details) == {"resumes": True, "span_s": span, "messages": 0,
                                       "withheld": sum(map(withheld, reference))}  # fmt: skip
    assert silence.sent == 0


def test_a_silence_that_does_not_resume_never_sends_again_and_ends_where_the_run_stops(
    registry: pa.Table,
) -> None:
    start = 400.0
    silence, got, truth = _run(registry, "silence", start, 600.0, resumes=False)
    _, reference, _ = _run(registry, "silence", NEVER, 600.0, resumes=False)

    def withheld(m: Message) -> bool:
        return m[0] == KEY and m[2] >= start

    assert got == [m for m in reference if not withheld(m)]
    assert any(m[0] == KEY for m in got)  # it reported before the silence
    assert silence.end == math.inf
    (row,) = truth
    assert (row.start_time, row.end_time) == (_sent_at(start), _sent_at(SECONDS))
    assert json.loads(row.details) == {"resumes": False, "span_s": None, "messages": 0,
                                       "withheld": sum(map(withheld, reference))}  # fmt: skip


def test_store_and_forward_sends_the_withheld_messages_byte_for_byte_at_the_end(
    registry: pa.Table,
) -> None:
    start, span = 300.5, 900.0
    end = start + span
    gateway, got, truth = _run(registry, "store_and_forward", start, span)
    _, reference, _ = _run(registry, "store_and_forward", NEVER, span)

    buffered = [m for m in reference if m[0] == KEY and start <= m[2] < end]
    assert len(buffered) >= 30
    # Back online at the end: the burst, a few ms apart, before the device's next reading.
    gap = sc.StoreAndForward.BURST_GAP_S
    next_reading = min(m[2] for m in reference if m[0] == KEY and m[2] >= end)
    assert next_reading > end + gap * len(buffered)  # else the gap shrinks: not this case
    code = sc.SCENARIO_CODE["store_and_forward"]
    burst = [(key, value, end + k * gap, code) for k, (key, value, _t, _) in enumerate(buffered)]
    others = [m for m in reference if m not in set(buffered)]
    # In send order: the burst after whatever was sent before the end (a stable sort).
    assert got == sorted(others + burst, key=lambda m: m[2])

    events = [json.loads(m[1]) for m in burst]
    assert [_time(e["event_time"]) for e in events] == [_sent_at(m[2]) for m in buffered]
    seqs = [e["seq"] for e in events]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))  # original seq, in order
    (row,) = truth
    assert (row.scenario, row.device_id) == ("store_and_forward", DEVICE)
    assert (row.start_time, row.end_time) == (_sent_at(start), _sent_at(end))
    assert json.loads(row.details) == {"messages": len(buffered), "withheld": len(buffered)}
    assert gateway.sent == len(buffered)


def test_a_run_stopped_before_the_end_of_store_and_forward_never_sends_the_burst(
    registry: pa.Table,
) -> None:
    start = 1200.0
    gateway, got, truth = _run(registry, "store_and_forward", start, 900.0)
    _, reference, _ = _run(registry, "store_and_forward", NEVER, 900.0)

    def withheld(m: Message) -> bool:
        return m[0] == KEY and m[2] >= start

    assert got == [m for m in reference if not withheld(m)]
    (row,) = truth
    assert row.end_time == _sent_at(SECONDS)
    assert json.loads(row.details) == {"messages": 0,
                                       "withheld": sum(map(withheld, reference))}  # fmt: skip
    assert isinstance(gateway, sc.StoreAndForward)
    assert gateway.sent == 0 and gateway.buffered  # kept, never sent


def _gateway(start: float = 30.0, end: float = 60.0) -> sc.StoreAndForward:
    return sc.StoreAndForward(scenario_id="s", dev=0, start=start, end=end, index=1)


def _slice(
    fleet: Fleet, t0: float, t1: float, withheld: list[sc.Withheld], sent: tuple[float, ...] = ()
) -> sc.Slice:
    """A slice whose only readings sent are device 0's at ``sent``."""
    events = readings().take(np.arange(len(sent)))
    events.t = np.asarray(sent, dtype=float)
    n = len(events)
    return sc.Slice(t0, t1, fleet, np.random.default_rng(0), START.timestamp(), events,
                    [b"k"] * n, [b"v"] * n, withheld)  # fmt: skip


def test_store_and_forward_buffers_across_slices_and_bursts_in_the_slice_of_its_end(
    registry: pa.Table,
) -> None:
    fleet = Fleet(registry, SimulatorSettings(), np.random.default_rng(0))
    gateway, other = _gateway(), _gateway()
    held = [sc.Withheld(gateway, t, b"dev-000000", f"value {t:.0f}".encode()) for t in (30, 40, 50)]
    mine = [(h.send_s, h.value) for h in held]
    stranger = sc.Withheld(other, 35.0, b"dev-000000", b"not mine")

    first = sc.StoreAndForward.messages([gateway], _slice(fleet, 0.0, 45.0, [held[0], stranger,
                                                                             held[1]]))  # fmt: skip
    assert first == []
    burst = sc.StoreAndForward.messages([gateway], _slice(fleet, 45.0, 90.0, [held[2]]))
    gap = sc.StoreAndForward.BURST_GAP_S
    assert [(m.send_s, m.key, m.value, m.label) for m in burst] == [
        (60.0 + k * gap, b"dev-000000", value, None) for k, (_t, value) in enumerate(mine)
    ]
    assert all(m.scenario is gateway for m in burst) and gateway.sent == 3
    assert sc.StoreAndForward.messages([gateway], _slice(fleet, 90.0, 120.0, [])) == []


def test_the_burst_fits_before_the_device_s_next_reading_and_the_slice_end(
    registry: pa.Table,
) -> None:
    fleet = Fleet(registry, SimulatorSettings(), np.random.default_rng(0))
    gateway = _gateway()
    held = [sc.Withheld(gateway, t, b"k", b"v") for t in (30.0, 40.0, 50.0, 55.0)]
    # The device reports again 4 ms after the end: 1 ms apart, all before that reading.
    burst = sc.StoreAndForward.messages([gateway], _slice(fleet, 0.0, 90.0, held, (60.004,)))
    assert [round(m.send_s, 6) for m in burst] == [60.0, 60.001, 60.002, 60.003]
    # A slice ending 2 ms after it: 0.5 ms apart.
    gateway = _gateway()
    held = [sc.Withheld(gateway, t, b"k", b"v") for t in (30.0, 40.0, 50.0, 55.0)]
    burst = sc.StoreAndForward.messages([gateway], _slice(fleet, 0.0, 60.002, held))
    assert [round(m.send_s, 6) for m in burst] == [60.0, 60.0005, 60.001, 60.0015]


def test_silence_lasts_log_uniformly_between_its_bounds() -> None:
    settings = SimulatorSettings(silence_min_s=300, silence_max_s=3600)
    rng = np.random.default_rng(3)
    spans = np.asarray([sc.Silence.lasts(rng, settings) for _ in range(4000)])
    assert spans.min() >= 300 and spans.max() <= 3600
    # Log-uniform: as many below the geometric mean as above it (uniform would put ~25 % below).
    below = float(np.mean(spans < math.sqrt(300 * 3600)))
    assert 0.46 < below < 0.54
    fixed = SimulatorSettings(silence_min_s=900, silence_max_s=900)
    assert sc.Silence.lasts(rng, fixed) == pytest.approx(900.0)
    # The other kinds keep the usual window.
    usual = SimulatorSettings(scenario_min_s=700, scenario_max_s=700)
    assert sc.StoreAndForward.lasts(rng, usual) == 700.0


def test_silence_resumes_with_the_configured_probability(registry: pa.Table) -> None:
    def resumed(probability: float) -> list[bool]:
        settings = SimulatorSettings(devices=200, seed=2, scenarios=[],
                                     silence_resume_probability=probability)  # fmt: skip
        sim = Simulation(settings, registry, start_time=START)
        return [sim.inject("silence", start_s=0.0).params["resumes"] for _ in range(40)]

    assert resumed(1.0) == [True] * 40
    assert resumed(0.0) == [False] * 40
    assert 10 < sum(resumed(0.5)) < 30


@pytest.mark.parametrize(
    "bad",
    [
        {"silence_min_s": 4000.0, "silence_max_s": 3600.0},
        {"silence_min_s": 0.0},
        {"silence_resume_probability": -0.1},
        {"silence_resume_probability": 1.5},
    ],
)
def test_silence_settings_are_validated(bad: dict[str, float]) -> None:
    with pytest.raises(ValidationError):
        SimulatorSettings(**bad)


def test_silence_settings_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IOT_SIM_SILENCE_MIN_S", "60")
    monkeypatch.setenv("IOT_SIM_SILENCE_MAX_S", "120")
    monkeypatch.setenv("IOT_SIM_SILENCE_RESUME_PROBABILITY", "0.5")
    settings = SimulatorSettings()
    assert (settings.silence_min_s, settings.silence_max_s) == (60.0, 120.0)
    assert settings.silence_resume_probability == 0.5
    # On by default, like every scenario.
    assert {"silence", "store_and_forward"} <= set(settings.scenarios)
    assert settings.rate_of("silence") == settings.rate_of("store_and_forward") == 6.0


def test_absence_kinds_draw_their_injections_from_the_scenario_rates(registry: pa.Table) -> None:
    settings = SimulatorSettings(devices=200, seed=8, scenarios=list(c.ABSENCE_SCENARIOS),
                                 scenario_rate=300, scenario_warmup_s=600)  # fmt: skip
    sim = Simulation(settings, registry, start_time=START, run_id="r")
    for _ in sim.batches(sim_seconds=3600, slice_s=300):
        pass
    rows = sim.finish()
    assert {r.scenario for r in rows} == set(c.ABSENCE_SCENARIOS)
    assert min(r.start_time for r in rows) >= START + timedelta(seconds=600)
    end = START + timedelta(seconds=3600)
    silences = [(r, json.loads(r.details)) for r in rows if r.scenario == "silence"]
    resumed = [(r, d["span_s"]) for r, d in silences if d["resumes"]]
    assert resumed and all(300 <= span <= 3600 for _r, span in resumed)
    ended = [(r, span) for r, span in resumed if r.end_time < end]
    assert ended and all(
        (r.end_time - r.start_time).total_seconds() == pytest.approx(span, abs=0.05)
        for r, span in ended
    )
    # Those that never resume run to the end of the run.
    assert all(r.end_time == end for r, d in silences if not d["resumes"])
    assert any(not d["resumes"] for _r, d in silences)


def test_the_producer_counts_only_what_it_sent(registry: pa.Table, tmp_path: Any) -> None:
    def sim() -> Simulation:
        settings = SimulatorSettings(devices=200, seed=21, scenarios=[], accelerate=0.0,
                                     lake_root=str(tmp_path), write_ground_truth=False)  # fmt: skip
        simulation = Simulation(settings, registry, start_time=START, run_id="r")
        simulation.inject("silence", device_id=DEVICE, start_s=0.0, resumes=False)
        return simulation

    stop = threading.Event()
    sender = MemorySender(stop, stop_after=20_000)
    simulation = sim()
    stats = run_simulation(simulation.settings, simulation, stop=stop,
                           sender=sender)  # type: ignore[arg-type]  # fmt: skip
    assert stats.sent == len(sender.values) >= 20_000
    assert not any(json.loads(v)["device_id"] == DEVICE for v in sender.values)
    reference = sim()
    values: list[bytes] = []
    while len(values) < stats.sent:
        values += reference.next_batch(reference.default_slice_s()).values
    assert values == sender.values
