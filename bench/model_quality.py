"""Detection quality on a held-out seed: rules and model together, per injected scenario.

Simulates a training history and a held-out history (another seed, so other devices and other
injections), computes both with the pipeline's feature code (``pipeline.features``) and rules
(``pipeline.rules``), fits the detector as ``iotfraud train`` does (thresholds on a validation
split of training devices), then scores the held-out windows and evaluates rules and model
together as ``models.evaluation.evaluate`` defines detection. No MLflow: nothing is registered.

Usage::

    flock /tmp/bench.lock .venv/bin/python bench/model_quality.py \\
        [--devices 400] [--hours 6] [--holdout-hours 4] [--seed 7] [--holdout-seed 1007]

Defaults come from ``IOT_MODEL_*`` (``models.settings.ModelSettings``) and the window and slide
from ``IOT_PIPELINE_*``. Prints the per-scenario table (injected, recall, precision, median time
to detect), false alerts per 10,000 clean device-windows, the thresholds and the timings.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from infra.settings import SparkSettings, load_settings
from infra.spark import build_spark_session
from models.dataset import History, simulated_history
from models.evaluation import missed
from models.live_eval import format_table
from models.settings import ModelSettings
from models.train import fit_detector, holdout_report, model_alerts
from pipeline.settings import PipelineSettings


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--devices", type=int, help="fleet size of both histories")
    parser.add_argument("--hours", type=float, help="simulated hours to train on")
    parser.add_argument("--holdout-hours", type=float, help="simulated hours held out")
    parser.add_argument("--seed", type=int, help="seed of the training fleet")
    parser.add_argument("--holdout-seed", type=int, help="seed of the held-out fleet")
    parser.add_argument("--scenario-rate", type=float, help="injections per hour per 1,000 devices")
    parser.add_argument("--window", help="sliding window length (default IOT_PIPELINE_WINDOW)")
    parser.add_argument("--slide", help="sliding window step (default IOT_PIPELINE_SLIDE)")
    parser.add_argument("--misses", action="store_true", help="list the missed injections")
    parser.add_argument("--save", type=Path, help="folder to write both histories to (parquet)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = parse_args(argv)
    overrides: dict[str, Any] = {k: v for k, v in {
        "devices": args.devices, "hours": args.hours, "holdout_hours": args.holdout_hours,
        "seed": args.seed, "holdout_seed": args.holdout_seed,
        "scenario_rate": args.scenario_rate}.items() if v is not None}  # fmt: skip
    pipeline = load_settings(PipelineSettings)
    window, slide = args.window or pipeline.window, args.slide or pipeline.slide
    spark = build_spark_session("bench-model-quality", load_settings(SparkSettings),
                                extra_conf={"spark.ui.showConsoleProgress": "false"})  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="modelbench-") as tmp:
        settings = load_settings(ModelSettings, workdir=tmp, **overrides)

        def history(seed: int, hours: float, folder: str) -> tuple[History, float]:
            start = time.perf_counter()
            result = simulated_history(
                spark, devices=settings.devices, hours=hours, seed=seed,
                scenario_rate=settings.scenario_rate, start_time=settings.start_time,
                folder=Path(tmp) / folder, window=window, slide=slide,
                min_overlap_s=settings.min_overlap_s,
            )  # fmt: skip
            return result, time.perf_counter() - start

        train, train_s = history(settings.seed, settings.hours, "train")
        holdout, holdout_s = history(settings.holdout_seed, settings.holdout_hours, "holdout")
        if args.save:
            save(args.save, train=train, holdout=holdout)
        start = time.perf_counter()
        detector, validation = fit_detector(train, settings)
        fit_s = time.perf_counter() - start
        scores = detector.score(holdout.features)
        report, metrics = holdout_report(holdout, scores, 0.5)

    print(f"window {window}, slide {slide}; scenario rate {settings.scenario_rate:g}/h/1k devices")
    print(f"train: seed {settings.seed}, {settings.devices} devices x {settings.hours:g} h, "
          f"{len(train.features):,} windows ({int(validation.sum()):,} validation), "
          f"{len(train.truth)} injections, {train_s:.0f} s")  # fmt: skip
    print(f"held-out: seed {settings.holdout_seed}, {settings.devices} devices x "
          f"{settings.holdout_hours:g} h, {len(holdout.features):,} windows, "
          f"{len(holdout.truth)} injections, {holdout_s:.0f} s")  # fmt: skip
    print(f"fit {fit_s:.0f} s; p_threshold {detector.p_threshold:.4g}, "
          f"z_threshold {detector.z_threshold:.4g}")  # fmt: skip
    print()
    print(format_table(report))
    print()
    print(f"false alerts: {metrics['holdout_false_alerts']:.0f} over "
          f"{metrics['holdout_clean_windows']:,.0f} clean device-windows = "
          f"{metrics['holdout_false_alerts_per_10k_clean_windows']:.2f} per 10,000")  # fmt: skip
    if args.misses:
        print()
        print(misses(holdout, scores).to_string(index=False))
    spark.stop()
    return 0


def save(folder: Path, **histories: History) -> None:
    """Each history's windows, injections and rule alerts as ``<name>_<part>.parquet``."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, history in histories.items():
        history.features.to_parquet(folder / f"{name}_features.parquet")
        history.truth.to_parquet(folder / f"{name}_truth.parquet")
        history.rule_alerts.to_parquet(folder / f"{name}_rule_alerts.parquet")


def misses(holdout: History, scores: Any) -> Any:
    """Held-out injections that neither rules nor model caught, with their parameters."""
    import pandas as pd

    alerts = pd.concat([holdout.rule_alerts, model_alerts(holdout, scores, 0.5)])
    columns = ["device_id", "scenario", "start_time", "end_time", "details"]
    return missed(alerts, holdout.truth)[columns]


if __name__ == "__main__":
    sys.exit(main())
