"""Train/serve parity: the rows the stream's model scores are exactly the rows training builds
from the same events (window features and their relative features), across a restart."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from infra import lake as lake_paths
from models.dataset import scoring_rows
from pipeline import job
from pipeline.features import features_from_events
from pipeline.profiles import RELATIVE_FEATURES
from pipeline.settings import PipelineSettings, seconds
from tests.pipeline_helpers import make_event, normal_metrics, write_registry

pytestmark = pytest.mark.integration

DEVICES = ["meter-a", "meter-b", "meter-c"]


def history(start: datetime) -> list[dict[str, Any]]:
    """2.5 hours of three meters at other levels and rates; meter-c's temperature jumps by
    15 degrees for 20 minutes two hours in."""
    events = []
    for n, device in enumerate(DEVICES):
        every = 20 + 10 * n
        for i in range(int(2.5 * 3600 / every)):
            at = start + timedelta(seconds=i * every + n)
            metrics = {k: v * (1 + 0.2 * n) for k, v in normal_metrics(i).items()}
            if device == "meter-c" and timedelta(hours=2) <= at - start < timedelta(hours=2.33):
                metrics["temperature_c"] += 15.0
            events.append(make_event(device, i, at, metrics=metrics))
    return sorted(events, key=lambda e: e["event_time"])


def test_stream_scores_exactly_the_rows_training_builds(
    spark: Any, lake: str, tmp_path: Path
) -> None:
    start = datetime.now(timezone.utc).replace(second=0, microsecond=0) - timedelta(hours=3)
    write_registry(lake, DEVICES)
    settings = PipelineSettings(
        lake_root=lake, checkpoint_root=str(tmp_path / "checkpoints"), source="files",
        landing_dir=str(tmp_path / "landing"), firmware_topic="",
        mlflow_tracking_uri=f"sqlite:///{tmp_path / 'none.db'}",
    )  # fmt: skip
    events = history(start)
    landing = Path(settings.landing_dir)
    landing.mkdir(parents=True)
    scored: list[pd.DataFrame] = []
    # Two runs, the second from the first's checkpoint: the driver's state is rebuilt from the
    # features table in between.
    cut = len(events) * 3 // 5
    for part, chunk in enumerate((events[:cut], events[cut:])):
        (landing / f"part-{part}.jsonl").write_text("\n".join(json.dumps(e) for e in chunk))
        job.run_available_now(spark, settings, on_scoring=scored.append)
    streamed = pd.concat(scored, ignore_index=True)

    telemetry = spark.read.format("delta").load(lake_paths.table_path(lake, lake_paths.TELEMETRY))
    devices = spark.read.format("delta").load(lake_paths.table_path(lake, lake_paths.DEVICES))
    windows = features_from_events(telemetry, devices, window=settings.window,
                                   slide=settings.slide).toPandas()  # fmt: skip
    # What the watermark has closed at the end: windows that end a watermark before the last event.
    trained, _ = scoring_rows(windows, settings.profile_spec(),
                              watermark_s=seconds(settings.watermark))  # fmt: skip
    trained = trained[trained["scorable"]]

    keys = ["device_id", "window_start"]
    streamed = streamed.sort_values(keys).reset_index(drop=True)
    trained = trained.sort_values(keys).reset_index(drop=True)
    assert len(streamed) > 20 and set(streamed["device_id"]) == set(DEVICES)
    assert streamed[keys].equals(trained[keys])
    numeric = [*RELATIVE_FEATURES, "event_count", "temperature_c_mean", "power_w_std",
               "events_per_min", "profile_windows", "fill"]  # fmt: skip
    # Equal up to the order of floating-point sums (a streaming aggregate adds in its own order).
    np.testing.assert_allclose(
        streamed[numeric].to_numpy(float), trained[numeric].to_numpy(float), rtol=1e-7, atol=1e-7
    )
    jump = streamed[(streamed["device_id"] == "meter-c")]["rel_temperature_c_level"]
    assert jump.max() > 10, "the temperature jump stands out against meter-c's own normal"
