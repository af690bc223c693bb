"""Shared fixtures of the simulator unit tests: one small fleet and one run with every scenario."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone

import pyarrow as pa
import pytest

from infra import contract as c
from simulator.registry import build_registry
from simulator.scenarios import GroundTruthRow
from simulator.settings import SimulatorSettings
from simulator.telemetry import Batch, Simulation

START = datetime(2026, 1, 5, 8, 0, tzinfo=timezone.utc)
NOW = datetime(2026, 1, 4, tzinfo=timezone.utc)


@dataclass
class Run:
    registry: pa.Table
    batches: list[Batch]
    ground_truth: list[GroundTruthRow]
    sim: Simulation


@pytest.fixture(scope="session")
def registry() -> pa.Table:
    return build_registry(200, seed=11, now=NOW)


@pytest.fixture(scope="session")
def scenario_run(registry: pa.Table) -> Run:
    """40 simulated minutes of 200 devices with each scenario injected once at a known time."""
    settings = SimulatorSettings(devices=200, seed=11, scenarios=[], batch_events=3000)
    sim = Simulation(settings, registry, start_time=START, run_id="test-run")
    for i, scenario in enumerate(c.SCENARIOS):
        params = {"resumes": True} if scenario == "silence" else {}
        sim.inject(scenario, start_s=120.0 + 30 * i, duration_s=900.0, **params)
    batches = list(sim.batches(sim_seconds=2400))
    return Run(registry, batches, sim.finish(), sim)
