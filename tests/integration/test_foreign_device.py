"""A device that is nothing like the simulator's (a pump test rig: 1 Hz, no GPS, its own
levels), replayed from a CSV file with ``--register``, raises no alert once the pipeline has
learned its normal, while a model trained on simulated fleets scores its windows."""

from __future__ import annotations

import csv
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from infra import lake as lake_paths
from iotfraud.training import simulate
from models.settings import ModelSettings
from models.train import train
from pipeline import job
from pipeline.settings import PipelineSettings, seconds
from simulator import cli as simulator_cli

pytestmark = [pytest.mark.integration, pytest.mark.slow]

RIGS = ["pump-rig-1", "pump-rig-2", "pump-rig-3"]
MINUTES = 75


def write_rig_csv(path: Path, start: datetime) -> None:
    """Once a second per rig: temperature, volts, amps, watts around the rig's own levels."""
    rng = np.random.default_rng(5)
    with path.open("w", newline="") as handle:
        out = csv.writer(handle)
        out.writerow(["rig", "ts", "temp", "volts", "amps", "watts"])
        for second in range(MINUTES * 60):
            for n, rig in enumerate(RIGS):
                volts = 400.0 + 20 * n + rng.normal(0, 1.5)
                amps = 12.0 + 3 * n + rng.normal(0, 0.2)
                out.writerow([rig, f"{(start + timedelta(seconds=second)).timestamp():.3f}",
                              f"{45 + 4 * n + rng.normal(0, 0.3):.2f}", f"{volts:.1f}",
                              f"{amps:.2f}", f"{volts * amps * 0.8:.1f}"])  # fmt: skip


def test_steady_foreign_device_raises_no_alert_after_warm_up(
    spark: Any, bootstrap: str, make_topic: Callable[..., str], lake: str, tmp_path: Path,
    mlflow_uri: str, monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    settings = PipelineSettings(
        lake_root=lake, checkpoint_root=str(tmp_path / "cp"), bootstrap_servers=bootstrap,
        topic=make_topic(partitions=2), firmware_topic="", mlflow_tracking_uri=mlflow_uri,
    )  # fmt: skip
    # A champion trained on a small simulated fleet, as `iotfraud train` does.
    model = ModelSettings(devices=30, hours=1.0, holdout_hours=0.5,
                          workdir=str(tmp_path / "training"))  # fmt: skip
    result = train(spark, model, mlflow_uri, window=settings.window, slide=settings.slide,
                   spec=settings.profile_spec(), history_source=simulate)  # fmt: skip
    assert result.promoted

    start = datetime.now(timezone.utc).replace(microsecond=0) - timedelta(minutes=MINUTES + 5)
    rigs = tmp_path / "rigs.csv"
    write_rig_csv(rigs, start)
    monkeypatch.setenv("IOT_LAKE_ROOT", lake)
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", bootstrap)
    monkeypatch.setenv("IOT_TOPIC", settings.topic)
    mapping = "device_id=rig,event_time=ts,temperature_c=temp,voltage_v=volts,current_a=amps"
    code = simulator_cli.main(["replay", str(rigs), "--register", "--map",
                               mapping + ",power_w=watts"])  # fmt: skip
    assert code == 0

    scored: list[pd.DataFrame] = []
    job.run_available_now(spark, settings, on_scoring=scored.append)

    # Warm-up: the cold start (profile_min_windows closed windows) and the window after it.
    warm = start + timedelta(seconds=(settings.profile_min_windows + 2) * seconds(settings.slide)
                             + seconds(settings.window))  # fmt: skip
    warm_naive = warm.replace(tzinfo=None)
    windows = pd.concat(scored, ignore_index=True)
    after = windows[windows["window_start"] >= warm_naive]
    assert len(after) >= 3 * len(RIGS), "the model scored the rigs' windows after warm-up"
    assert set(after["device_id"]) == set(RIGS)
    assert after["rel_temperature_c_level"].abs().max() < 10  # compared with itself only

    alerts = spark.read.format("delta").load(lake_paths.table_path(lake, lake_paths.ALERTS))
    late = alerts.where(alerts.window_start >= warm_naive).collect()
    assert late == [], [(a.device_id, a.alert_type, a.reasons) for a in late]
    # Before its rate is learned, a 1 Hz rig floods by the type's threshold: the only alerts.
    assert {a.alert_type for a in alerts.collect()} <= {"flood"}
