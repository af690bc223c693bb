"""The features micro-batch: rules on every window that changed, the model on every window the
watermark closed, each against the device's own normal; then the window features upserted.

When is a window scored by the model? Once, when the watermark closes it: its final state is
then exactly what a batch aggregation of the same events gives, which is what the model was
trained on (``models.dataset``). Windows still filling are seen by the rules only, so rule
alerts arrive within seconds and model alerts one window plus the watermark after a window
starts.

The driver keeps, per device, the windows still open (their latest state) and the closed
windows a profile reads (``pipeline.profiles``). Both are rebuilt from the ``features`` table at
start, and a batch writes its alerts before its features: a batch replayed after a crash finds
the state the first attempt found, and decides the same.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import pandas as pd
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from infra import lake
from pipeline import columns as col
from pipeline.alerts import empty_alerts, merge_alerts, to_spark
from pipeline.profiles import (
    FILL,
    HISTORY_COLUMNS,
    PROFILE_WINDOWS,
    RELATIVE_FEATURES,
    ProfileSpec,
    history_rows,
    learned,
    profiles,
    relative_features,
    scorable,
)
from pipeline.rules import RuleThresholds, rule_alerts
from pipeline.scoring import LoadedModel, ModelScorer, model_alerts
from pipeline.sinks import upsert

log = logging.getLogger(__name__)

FEATURE_KEYS = ["device_id", col.WINDOW_START]


@dataclass
class WindowState:
    """Open windows (latest state) and closed history, as of the last committed batch."""

    open: pd.DataFrame
    history: pd.DataFrame
    max_event_time: pd.Timestamp | None

    @classmethod
    def empty(cls) -> WindowState:
        return cls(pd.DataFrame(), pd.DataFrame(columns=list(HISTORY_COLUMNS)), None)


def _keyed(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.set_index(FEATURE_KEYS, drop=False).rename_axis([None, None])


def advance(
    state: WindowState,
    changed: pd.DataFrame,
    *,
    spec: ProfileSpec,
    watermark_s: float,
    min_events: int,
) -> tuple[WindowState, pd.DataFrame]:
    """The state after a batch whose changed windows are ``changed``, and the windows it closes
    (final states). A window closes once the latest event time seen, less the watermark, has
    passed its end: Spark's watermark for the next batch, so no later event can reach it.
    """  # fmt: skip
    if state.max_event_time is not None and len(changed):
        # A window the state has closed already (Spark drops its events as late): delivered
        # again, it must not count twice in a profile.
        done = state.max_event_time - pd.Timedelta(seconds=watermark_s)
        changed = changed[changed[col.WINDOW_END] > done]
    latest = changed["last_event_time"].max() if len(changed) else None
    candidates = [t for t in (state.max_event_time, latest) if t is not None and not pd.isna(t)]
    max_event_time = max(candidates) if candidates else None
    merged = _keyed(changed) if state.open.empty else _keyed(
        pd.concat([state.open[~state.open.index.isin(_keyed(changed).index)], changed])
    )  # fmt: skip
    if max_event_time is None:
        return WindowState(merged, state.history, None), merged.iloc[0:0]
    closes = merged[col.WINDOW_END] <= max_event_time - pd.Timedelta(seconds=watermark_s)
    closing = merged[closes]
    added = history_rows(closing, min_events)
    parts = [part for part in (state.history, added) if not part.empty]
    history = pd.concat(parts) if len(parts) > 1 else (parts[0] if parts else state.history)
    # Kept: what the profile of a window closing now or later can still read.
    if len(merged):
        oldest = merged[col.WINDOW_START].min()
        horizon = oldest - pd.Timedelta(seconds=spec.span_s + spec.window_s)
        history = history[history[col.WINDOW_START] >= horizon].reset_index(drop=True)
    return WindowState(merged[~closes], history, max_event_time), closing.reset_index(drop=True)


def rows_to_score(closing: pd.DataFrame, history: pd.DataFrame, spec: ProfileSpec) -> pd.DataFrame:
    """The closed windows the model scores (past their device's cold start, filled enough):
    window features plus their relative features. The same rows as training's
    (``models.dataset.scoring_rows``) for the same events."""
    if closing.empty:
        return closing
    relative = relative_features(closing, profiles(closing, history, spec), spec)
    ready = scorable(relative, spec).to_numpy()
    return pd.concat([closing[ready], relative[ready]], axis=1).reset_index(drop=True)


def detect(
    changed: pd.DataFrame,
    scoring: pd.DataFrame,
    history: pd.DataFrame,
    *,
    model: LoadedModel | None,
    rules: RuleThresholds,
    spec: ProfileSpec,
) -> pd.DataFrame:
    """Rule alerts on the ``changed`` windows (against their device's profile from
    ``history``), model alerts on the ``scoring`` rows (pure; the stream and tests)."""  # fmt: skip
    found = []
    if len(changed):
        with_normal = changed.reset_index(drop=True)
        with_normal = with_normal.join(learned(profiles(with_normal, history, spec), spec))
        found.append(rule_alerts(with_normal, rules))
    if model is not None and len(scoring):
        found.append(model_alerts(scoring, model.score(scoring), model))
    found = [f for f in found if len(f)]
    return pd.concat(found, ignore_index=True) if found else empty_alerts()


def load_state(
    spark: SparkSession, path: str, *, spec: ProfileSpec, watermark_s: float, min_events: int
) -> WindowState:
    """The driver's state as the last committed batch left it, from the ``features`` table."""
    from delta.tables import DeltaTable

    if not DeltaTable.isDeltaTable(spark, path):
        return WindowState.empty()
    table = spark.read.format("delta").load(path)
    newest = table.agg(F.max("last_event_time").alias("t")).toPandas()["t"].iloc[0]
    if pd.isna(newest):
        return WindowState.empty()
    top = pd.Timestamp(newest)
    reach = pd.Timedelta(seconds=watermark_s + 3 * spec.window_s + spec.span_s)
    since = F.lit((top - reach).strftime("%Y-%m-%d %H:%M:%S")).cast("timestamp")
    rows = table.where(F.col(col.WINDOW_START) >= since).toPandas()
    end = rows[col.WINDOW_END] <= top - pd.Timedelta(seconds=watermark_s)
    log.info("detection state loaded: %d open windows, %d closed", (~end).sum(), end.sum())
    history = history_rows(rows[end], min_events).reset_index(drop=True)
    return WindowState(_keyed(rows[~end]), history, top)


@dataclass
class FeaturesBatchWriter:
    """``foreachBatch`` function of the features query (update mode: the windows that changed)."""

    lake_root: str
    scorer: ModelScorer | None = None
    rules: RuleThresholds = field(default_factory=RuleThresholds)
    spec: ProfileSpec = field(default_factory=ProfileSpec)
    watermark_s: float = 300.0
    # Receives the rows the model scores in each batch (tests compare them with training's).
    on_scoring: Callable[[pd.DataFrame], None] | None = None
    state: WindowState | None = None

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        spark = batch.sparkSession
        features_path = lake.table_path(self.lake_root, lake.FEATURES)
        if self.state is None:
            self.state = load_state(spark, features_path, spec=self.spec,
                                    watermark_s=self.watermark_s,
                                    min_events=self.rules.default.min_events)  # fmt: skip
        windows = batch.localCheckpoint(eager=True)
        changed = windows.toPandas()
        state, closing = advance(self.state, changed, spec=self.spec,
                                 watermark_s=self.watermark_s,
                                 min_events=self.rules.default.min_events)  # fmt: skip
        columns = [*windows.columns, *RELATIVE_FEATURES, PROFILE_WINDOWS, FILL]
        model = self.scorer.current(columns) if self.scorer else None
        scoring = rows_to_score(closing, state.history, self.spec)
        alerts = detect(changed, scoring, state.history, model=model, rules=self.rules,
                        spec=self.spec)  # fmt: skip
        # Alerts first: a crash before the features commit replays this batch on the state
        # it started from (see the module docstring).
        if len(alerts):  # most batches alert on nothing: no Spark job for them
            merge_alerts(
                to_spark(spark, alerts, batch_id), lake.table_path(self.lake_root, lake.ALERTS)
            )
        if len(changed):
            upsert(spark, windows, features_path, FEATURE_KEYS, prune_on=col.WINDOW_START)
        self.state = state
        if self.on_scoring is not None:
            self.on_scoring(scoring)
