"""Detection quality on a held-out seed: rules and model together, per injected scenario.

Simulates a training history and a held-out history (another seed, so other devices and other
injections), computes both with the pipeline's feature code (``pipeline.features``) and rules
(``pipeline.rules``), fits the detector as ``iotfraud train`` does (thresholds on a validation
split of training devices), then scores the held-out windows and evaluates rules and model
together as ``models.evaluation.evaluate`` defines detection. No MLflow: nothing is registered.

Usage::

    flock /tmp/bench.lock .venv/bin/python bench/model_quality.py \\
        [--devices 400] [--hours 6] [--holdout-hours 4] [--seed 7] [--holdout-seed 1007] \\
        [--save DIR | --load DIR]

Defaults come from ``IOT_MODEL_*`` (``models.settings.ModelSettings``) and the window and slide
from ``IOT_PIPELINE_*``. Prints the per-scenario table (injected, recall, precision, median time
to detect), false alerts per 10,000 clean device-windows, the thresholds and the timings.

Simulating and featurising take most of a run (about 13 minutes at the defaults); ``--save DIR``
keeps both histories and ``--load DIR`` fits and scores on them again in well under a minute
(the history options are then ignored: the saved histories carry their own fleet and seeds).
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from infra import contract as c
from infra.settings import SparkSettings, load_settings
from infra.spark import build_spark_session
from iotfraud.training import simulate
from models.dataset import Fleet, History, simulated_history
from models.evaluation import missed
from models.live_eval import format_table
from models.settings import ModelSettings
from models.train import fit_detector, history_alerts, holdout_report, holdout_scores
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
    histories = parser.add_mutually_exclusive_group()
    histories.add_argument("--save", type=Path, help="folder to write both histories to (parquet)")
    histories.add_argument("--load", type=Path, help="folder of histories written by --save")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = parse_args(argv)
    overrides: dict[str, Any] = {k: v for k, v in {
        "devices": args.devices, "hours": args.hours, "holdout_hours": args.holdout_hours,
        "seed": args.seed, "holdout_seed": args.holdout_seed,
        "scenario_rate": args.scenario_rate}.items() if v is not None}  # fmt: skip
    settings = load_settings(ModelSettings, **overrides)
    if args.load:
        train, holdout = load(args.load, "train"), load(args.load, "holdout")
        print(f"histories from {args.load}")
    else:
        (train, train_s), (holdout, holdout_s) = simulate_histories(args, settings)
        if args.save:
            save(args.save, train=train, holdout=holdout)
        print(f"scenario rate {settings.scenario_rate:g}/h/1k devices; simulated and featurised "
              f"train: seed {settings.seed}, {settings.devices} devices x {settings.hours:g} h "
              f"in {train_s:.0f} s; held-out: seed {settings.holdout_seed}, {settings.devices} "
              f"devices x {settings.holdout_hours:g} h in {holdout_s:.0f} s")  # fmt: skip
    start = time.perf_counter()
    detector, validation = fit_detector(train, settings)
    fit_s = time.perf_counter() - start
    scores = holdout_scores(detector, holdout)
    report, metrics = holdout_report(holdout, scores, c.MODEL_ALERT_THRESHOLD)

    print(f"train: {len(train.features):,} windows ({len(train.scored.features):,} scored, "
          f"{int(validation.sum()):,} of them validation), "
          f"{len(train.truth)} injections; held-out: {len(holdout.features):,} windows, "
          f"{len(holdout.truth)} injections")  # fmt: skip
    print(f"fit {fit_s:.0f} s; deviation threshold {detector.threshold:.4g}")
    print()
    print(format_table(report))
    print()
    print(f"false alerts: {metrics['holdout_false_alerts']:.0f} over "
          f"{metrics['holdout_clean_windows']:,.0f} clean device-windows = "
          f"{metrics['holdout_false_alerts_per_10k_clean_windows']:.2f} per 10,000")  # fmt: skip
    if args.misses:
        print()
        print(misses(holdout, scores).to_string(index=False))
    return 0


def simulate_histories(
    args: argparse.Namespace, settings: ModelSettings
) -> tuple[tuple[History, float], tuple[History, float]]:
    """The training and held-out histories, each with the seconds it took."""
    overrides = {k: v for k, v in {"window": args.window, "slide": args.slide}.items() if v}
    pipeline = load_settings(PipelineSettings, **overrides)
    window, slide = pipeline.window, pipeline.slide
    print(f"window {window}, slide {slide}")
    spark = build_spark_session("bench-model-quality", load_settings(SparkSettings),
                                extra_conf={"spark.ui.showConsoleProgress": "false"})  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="modelbench-") as tmp:

        def history(seed: int, hours: float, folder: str) -> tuple[History, float]:
            start = time.perf_counter()
            fleet = Fleet(settings.devices, hours, seed, settings.scenario_rate,
                          settings.start_time)  # fmt: skip
            result = simulated_history(
                spark, simulate, fleet, folder=Path(tmp) / folder, window=window, slide=slide,
                min_overlap_s=settings.min_overlap_s, spec=pipeline.profile_spec(),
            )  # fmt: skip
            return result, time.perf_counter() - start

        train = history(settings.seed, settings.hours, "train")
        holdout = history(settings.holdout_seed, settings.holdout_hours, "holdout")
    spark.stop()
    return train, holdout


def save(folder: Path, **histories: History) -> None:
    """Each history's windows, injections and rule alerts as ``<name>_<part>.parquet``."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, history in histories.items():
        history.features.to_parquet(folder / f"{name}_features.parquet")
        history.truth.to_parquet(folder / f"{name}_truth.parquet")
        history.rule_alerts.to_parquet(folder / f"{name}_rule_alerts.parquet")


def load(folder: Path, name: str) -> History:
    """A history written by ``save``."""
    import pandas as pd

    parts = [pd.read_parquet(folder / f"{name}_{part}.parquet")
             for part in ("features", "truth", "rule_alerts")]  # fmt: skip
    return History(*parts)


def misses(holdout: History, scores: Any) -> Any:
    """Held-out injections that neither rules nor model caught, with their parameters."""
    import pandas as pd

    model = history_alerts(holdout, scores, c.MODEL_ALERT_THRESHOLD)
    alerts = pd.concat([holdout.rule_alerts, model])
    columns = ["device_id", "scenario", "start_time", "end_time", "details"]
    return missed(alerts, holdout.truth)[columns]


if __name__ == "__main__":
    sys.exit(main())
