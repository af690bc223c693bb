"""Training data: window features from the pipeline's own feature code, labelled from ground truth.

History comes from a ``HistorySource`` that simulates a fleet in accelerated time (``iotfraud``
passes the simulator in; its JSON lines are read back through the pipeline's file-source shape
and parser) or from telemetry already in the lake. Either way the windows are computed by
``pipeline.features.features_from_events``, the function the stream runs; each window is then
compared with its device's own normal by ``pipeline.profiles``, and the rule alerts come from
``pipeline.rules.rule_alerts``, as the stream does once the watermark closes the window. So
training rows are exactly the rows the stream scores.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path

import pandas as pd
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from infra import contract as c
from infra import lake
from models.evaluation import window_labels
from pipeline import columns as col
from pipeline.features import batch_feature_input, feature_events, features_from_events
from pipeline.profiles import (
    ProfileSpec,
    history_rows,
    learned,
    profiles,
    relative_features,
    scorable,
)
from pipeline.rules import RuleThresholds, rule_alerts
from pipeline.sources import file_records
from pipeline.transforms import parse_events, valid_events

log = logging.getLogger(__name__)

ALERT_COLUMNS = ["device_id", "alert_type", "window_start", "window_end", "last_event_time"]


@dataclass(frozen=True)
class Fleet:
    """The simulated history to train on: ``devices`` (``seed``) for ``hours`` from
    ``start_time``, with every fraud scenario at ``scenario_rate`` injections per hour per 1,000
    devices; none that changes readings starts in the first ``scenario_warmup_s``."""

    devices: int
    hours: float
    seed: int
    scenario_rate: float
    start_time: datetime
    scenario_warmup_s: float = 0.0


# Writes a fleet's history into a folder (emptied first): the registry as a Delta lake under
# ``folder/lake``, the telemetry as JSON lines under ``folder/landing``, with a quiet tail in which
# every injection ends; returns the lake root and the ground truth (``GROUND_TRUTH_COLUMNS``).
HistorySource = Callable[[Fleet, Path], tuple[Path, pd.DataFrame]]


@dataclass
class History:
    """Window features (one row per device and window) with their relative features, labels
    and whether the stream's model would score them (``scorable``), the injections, and the
    alerts the pipeline's rules raise on the same windows."""

    features: pd.DataFrame
    truth: pd.DataFrame
    rule_alerts: pd.DataFrame

    @property
    def labels(self) -> pd.Series:
        return self.features["label"]

    @property
    def scored(self) -> History:
        """Only the windows the stream's model scores (past cold start, filled enough)."""
        return History(self.features[self.features["scorable"]].reset_index(drop=True),
                       self.truth, self.rule_alerts)  # fmt: skip


def simulated_events(spark: SparkSession, landing: Path) -> DataFrame:
    """The valid events of a landing folder, parsed exactly as the pipeline's file source does."""
    lines = spark.read.format("text").load(str(landing))
    return valid_events(parse_events(file_records(lines)))


def scoring_rows(
    windows: pd.DataFrame,
    spec: ProfileSpec,
    rules: RuleThresholds | None = None,
    *,
    watermark_s: float | None = None,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Final windows (``window_features`` rows as pandas) as the stream's detection sees them:
    with their relative features and ``scorable``, and the rule alerts raised on them.

    With ``watermark_s``, only the windows the stream's watermark has closed at the end of these
    events (a watermark before the latest event) are history and scorable, as in the stream at
    that point; without it, every window counts as closed (a history whose end is quiet).
    """
    rules = rules or RuleThresholds()
    windows = windows.reset_index(drop=True)
    closed = pd.Series(True, index=windows.index)
    if watermark_s is not None and len(windows):
        edge = windows["last_event_time"].max() - pd.Timedelta(seconds=watermark_s)
        closed = windows[col.WINDOW_END] <= edge
    history = history_rows(windows[closed], rules.default.min_events)
    prof = profiles(windows, history, spec)
    alerts = rule_alerts(windows.join(learned(prof, spec)), rules)
    relative = relative_features(windows, prof, spec)
    rows = pd.concat([windows, relative], axis=1)
    rows["scorable"] = scorable(relative, spec) & closed
    return rows, alerts


def build_history(
    spark: SparkSession,
    feature_input: DataFrame,
    devices: DataFrame,
    truth: pd.DataFrame,
    *,
    window: str,
    slide: str,
    min_overlap_s: float,
    spec: ProfileSpec,
) -> History:
    """Window features and rule alerts of ``feature_input`` (``feature_events`` rows), labelled."""
    features = features_from_events(feature_input, devices, window=window, slide=slide)
    frame, alerts = scoring_rows(features.toPandas(), spec)
    alerts = alerts[ALERT_COLUMNS]
    frame["label"] = window_labels(frame, truth, min_overlap_s)
    counts = frame["label"].value_counts().to_dict()
    log.info("%d windows: %s", len(frame), counts)
    return History(features=frame, truth=truth, rule_alerts=alerts)


def simulated_history(
    spark: SparkSession,
    source: HistorySource,
    fleet: Fleet,
    *,
    folder: Path,
    window: str,
    slide: str,
    min_overlap_s: float,
    spec: ProfileSpec,
) -> History:
    """Simulate ``fleet`` with ``source`` into ``folder``, then featurise and label (see
    ``build_history``).

    Value scenarios start after the devices' cold start (``spec.cold_start_s``), as in the demo:
    every simulated device is new at the history's start, whereas a pipeline running for months
    meets a device's first minutes once. An anomaly inside the cold start is learned as the
    device's normal (docs/PERFORMANCE.md measures what that costs)."""
    lake_root, truth = source(replace(fleet, scenario_warmup_s=spec.cold_start_s), folder)
    events = batch_feature_input(simulated_events(spark, folder / "landing"))
    registry = spark.read.format("delta").load(lake.table_path(str(lake_root), lake.DEVICES))
    return build_history(spark, events, registry, truth, window=window, slide=slide,
                         min_overlap_s=min_overlap_s, spec=spec)  # fmt: skip


def lake_history(
    spark: SparkSession,
    lake_root: str,
    *,
    window: str,
    slide: str,
    min_overlap_s: float,
    spec: ProfileSpec,
) -> History:
    """Telemetry, duplicates, registry and ground truth already in the lake (batch reads)."""

    def table(name: str) -> DataFrame:
        return spark.read.format("delta").load(lake.table_path(lake_root, name))

    duplicates = table(lake.QUARANTINE).where(F.col("reason") == c.REASON_DUPLICATE)
    events = feature_events(table(lake.TELEMETRY), duplicates=False).unionByName(
        feature_events(duplicates, duplicates=True)
    )
    truth_table = lake.open_table(lake_root, lake.GROUND_TRUTH)
    if truth_table is None:
        raise FileNotFoundError(f"no {lake.GROUND_TRUTH} table under {lake_root}")
    truth = truth_table.to_pandas()
    return build_history(spark, events, table(lake.DEVICES), truth, window=window, slide=slide,
                         min_overlap_s=min_overlap_s, spec=spec)  # fmt: skip
