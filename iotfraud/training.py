"""``iotfraud train``: the models component trains on history that the simulator makes.

``models`` knows only a ``models.dataset.HistorySource``; this module is the one place that hands
it the simulator, so neither component imports the other.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from infra import contract as c
from infra.commandline import run
from models.cli import commands, train_command

if TYPE_CHECKING:
    from models.dataset import Fleet
    from simulator.telemetry import Batch

__all__ = ["main", "simulate", "train"]

log = logging.getLogger(__name__)


def simulate(fleet: Fleet, folder: Path) -> tuple[Path, pd.DataFrame]:
    """Generate ``fleet.hours`` of the fleet with every fraud scenario but the absence ones
    (``infra.contract.ABSENCE_SCENARIOS``) into ``folder``, then a quiet tail
    (``scenario_max_s``) in which the injections still running end.

    Writes the registry (a Delta table under ``folder/lake``) and the telemetry (JSON lines
    under ``folder/landing``); returns the lake root and the ground truth.
    """
    from simulator.registry import build_registry, write_registry
    from simulator.settings import SimulatorSettings
    from simulator.telemetry import Simulation, write_jsonl

    if folder.exists():
        shutil.rmtree(folder)
    lake_root = folder / "lake"
    registry = build_registry(fleet.devices, fleet.seed, now=fleet.start_time)
    write_registry(registry, str(lake_root))
    settings = SimulatorSettings(
        devices=fleet.devices,
        seed=fleet.seed,
        # Absence scenarios show in no window of readings: the model learns nothing from them.
        scenarios=[s for s in c.FRAUD_SCENARIOS if s not in c.ABSENCE_SCENARIOS],
        scenario_rate=fleet.scenario_rate,
        # A flood sends 20-60x a device's normal rate: a few are enough, many swamp the history.
        scenario_rates={"flood": fleet.scenario_rate / 10},
        write_ground_truth=False,
        scenario_warmup_s=fleet.scenario_warmup_s,
    )
    sim = Simulation(settings, registry, start_time=fleet.start_time,
                     run_id=f"history-{fleet.seed}")  # fmt: skip

    def batches() -> Iterator[Batch]:
        yield from sim.batches(sim_seconds=fleet.hours * 3600)
        # A quiet tail with no new injection: those still running end inside the history, so
        # none is cut short (a replay cut before its first copy cannot be detected at all).
        sim.settings = settings.model_copy(update={"scenarios": []})
        yield from sim.batches(sim_seconds=settings.scenario_max_s)

    files = write_jsonl(batches(), folder / "landing")
    truth = pd.DataFrame([row.as_dict() for row in sim.finish()],
                         columns=c.column_names(c.GROUND_TRUTH_COLUMNS))  # fmt: skip
    log.info("simulated %.1f h of %d devices (seed %d): %d files, %d injections",
             fleet.hours, fleet.devices, fleet.seed, len(files), len(truth))  # fmt: skip
    return lake_root, truth


def main(argv: list[str] | None = None) -> int:
    """``models``' command line, training on the simulator's history."""
    return run(commands(simulate), argv)


train = train_command(simulate)
