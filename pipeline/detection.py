"""The detection micro-batch: rules on every window that changed, the model on every window the
watermark closed, each against the device's own normal; then only what changed is written.

When is a window scored by the model? Once, when the watermark closes it: its final state is
then exactly what a batch aggregation of the same events gives, which is what the model was
trained on (``models.dataset``). Windows still filling are seen by the rules only, so rule
alerts arrive at the next micro-batch and model alerts one window plus the watermark after a window
starts.

The driver keeps, per device, the windows still open (their latest state) and the closed
windows a profile reads (``pipeline.profiles``). Nothing is rewritten per batch: the windows a
batch changed are appended to ``feature_changes`` (a changelog: the latest row per window is its
current state), the windows it closed are appended once to ``features`` (final rows), and an
alert is written when raised and once more, with its final values, when its window closes (or
marked withdrawn, when the finished window no longer calls for it: ``pipeline.alerts``). What
a batch closed is scored, judged and written after it has returned, beside the next batch
(``FeaturesBatchWriter``). At start the state is rebuilt from those two tables, so a batch
replayed after a crash finds the state its first attempt found, and decides the same.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from functools import partial

import pandas as pd
from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from infra import lake
from pipeline import columns as col
from pipeline.alerts import (
    AlertWrites,
    Publish,
    WrittenAlerts,
    alert_writes,
    empty_alerts,
    timestamp_literal,
)
from pipeline.metrics import Laps
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
from pipeline.rules import RULE_TYPES, RuleThresholds, rule_alerts
from pipeline.scoring import LoadedModel, ModelScorer, model_alerts
from pipeline.sinks import (
    AfterBatch,
    append,
    checkpoint_id,
    driver_frame,
    idempotent_append,
    side_by_side,
)

log = logging.getLogger(__name__)

FEATURE_KEYS = ["device_id", col.WINDOW_START]


@dataclass
class WindowState:
    """Open windows (latest state) and closed history, as of the last committed batch.

    ``profiles`` keeps the profiles (``pipeline.profiles.profiles``) computed for open windows,
    keyed like ``open`` (after ``advance``, also those of the windows closing in the batch): a
    window's profile reads only its device's history windows that ended by its start, so it
    changes only when such a window joins the history. Most of a batch's changed windows were
    changed by the batch before, and a window closing now was open before, so most profiles
    are found here (``profiled``).
    """

    open: pd.DataFrame
    history: pd.DataFrame
    max_event_time: pd.Timestamp | None
    profiles: pd.DataFrame = field(default_factory=pd.DataFrame)

    @classmethod
    def empty(cls) -> WindowState:
        return cls(pd.DataFrame(), pd.DataFrame(columns=list(HISTORY_COLUMNS)), None)


@dataclass(frozen=True)
class Closed:
    """What a batch hands to the writes of the windows it closed (``FeaturesBatchWriter``)."""

    windows: pd.DataFrame  # their final states
    profiles: pd.DataFrame  # their profiles (``profiled``), indexed like ``windows``
    history: pd.DataFrame  # the closed windows a profile reads, as of the batch
    model: LoadedModel | None  # the model as of the batch
    batch_id: int
    done: pd.Timestamp | None  # windows ending at or before this are closed
    replay: bool  # the batch may be a replay (the first after a start): so may these writes


@dataclass(frozen=True)
class _Writes:
    """Writes to run after a batch (``AfterBatch.start``), and what the log calls them."""

    spark: SparkSession
    what: str
    writes: list[Callable[[], None]]


def _keyed(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.set_index(FEATURE_KEYS, drop=False).rename_axis([None, None])


def scored_columns(window_columns: list[str]) -> list[str]:
    """The columns a batch's windows offer the model: the window's own, then what the device's
    profile adds (``rows_to_score``)."""
    return [*window_columns, *RELATIVE_FEATURES, PROFILE_WINDOWS, FILL]


def still_open(state: WindowState, changed: pd.DataFrame, watermark_s: float) -> pd.DataFrame:
    """The ``changed`` windows the state has not closed. A closed one comes again only in a batch
    replayed after a crash that followed its writes (Spark drops late events): it must not count
    twice in a profile, nor raise its alerts again."""
    if state.max_event_time is None or changed.empty:
        return changed
    done = state.max_event_time - pd.Timedelta(seconds=watermark_s)
    return changed[changed[col.WINDOW_END] > done]


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
    changed = still_open(state, changed, watermark_s)
    latest = changed["last_event_time"].max() if len(changed) else None
    candidates = [t for t in (state.max_event_time, latest) if t is not None and not pd.isna(t)]
    max_event_time = max(candidates) if candidates else None
    merged = _keyed(changed) if state.open.empty else _keyed(
        pd.concat([state.open[~state.open.index.isin(_keyed(changed).index)], changed])
    )  # fmt: skip
    if max_event_time is None:
        closing = merged.iloc[0:0].reset_index(drop=True)
        return WindowState(merged, state.history, None, state.profiles), closing
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
    still = merged[~closes]
    cached = state.profiles
    if len(cached):
        # Changed: the profiles of windows starting at or after the end of a window added to
        # their device's history now. Those of the windows closing now are kept for this
        # batch (``profiled`` drops them after).
        first_end = added.groupby("device_id")[col.WINDOW_END].min()
        ends = first_end.reindex(cached.index.get_level_values(0)).to_numpy()
        moved = cached.index.get_level_values(1).to_numpy() >= ends  # NaT: no new rows
        cached = cached[~moved & cached.index.isin(merged.index)]
    return WindowState(still, history, max_event_time, cached), closing.reset_index(drop=True)


def profiled(
    state: WindowState, windows: pd.DataFrame, spec: ProfileSpec
) -> tuple[pd.DataFrame, WindowState]:
    """The profiles of ``windows`` against ``state.history`` (indexed like ``windows``), taken
    from ``state.profiles`` where there and computed for the rest; and the state keeping those
    of its open windows only. No windows, no columns: nothing reads them."""
    if windows.empty:
        return pd.DataFrame(index=windows.index), state
    keys = pd.MultiIndex.from_frame(windows[FEATURE_KEYS])
    cached = state.profiles
    known = keys.isin(cached.index) if len(cached) else pd.Series(False, index=windows.index)
    new = windows[~known]
    every = cached
    if len(new):
        fresh = profiles(new.reset_index(drop=True), state.history, spec)
        fresh.index = pd.MultiIndex.from_frame(new[FEATURE_KEYS])
        every = pd.concat([cached, fresh]) if len(cached) else fresh
    found = every.reindex(keys)
    found.index = windows.index
    return found, replace(state, profiles=every[every.index.isin(state.open.index)])


def rows_to_score(
    closing: pd.DataFrame,
    history: pd.DataFrame,
    spec: ProfileSpec,
    prof: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """The closed windows the model scores (past their device's cold start, filled enough):
    window features plus their relative features. The same rows as training's
    (``models.dataset.scoring_rows``) for the same events. ``prof``: their profiles, when
    already computed."""
    if closing.empty:
        return closing
    prof = profiles(closing, history, spec) if prof is None else prof
    relative = relative_features(closing, prof, spec)
    ready = scorable(relative, spec).to_numpy()
    return pd.concat([closing[ready], relative[ready]], axis=1).reset_index(drop=True)


def judge(
    windows: pd.DataFrame,
    history: pd.DataFrame,
    *,
    rules: RuleThresholds,
    spec: ProfileSpec,
    prof: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """Rule alerts on ``windows``, each against its device's profile from ``history`` (or
    ``prof``, indexed like ``windows``, when already computed)."""
    if windows.empty:
        return empty_alerts()
    with_normal = windows.reset_index(drop=True)
    prof = profiles(with_normal, history, spec) if prof is None else prof.reset_index(drop=True)
    return rule_alerts(with_normal.join(learned(prof, spec)), rules)


def load_state(
    spark: SparkSession, lake_root: str, *, spec: ProfileSpec, watermark_s: float, min_events: int
) -> WindowState:
    """The driver's state as the last committed batch left it: the open windows are the latest
    state of each window in ``feature_changes``, the history is the closed windows in
    ``features``.

    A batch appends to ``feature_changes`` before it returns, so its newest event time says
    which batch committed last. The windows a batch closes go to ``features`` after it has
    returned, in batch order (``FeaturesBatchWriter``): so ``features`` holds every closed
    window up to its newest end, and none after it. A window ``feature_changes`` shows closed
    but ending after that was not written yet: it is put back among the open ones, and the
    first batch closes it again (the same final values: a window's profile reads only windows
    that ended before it began).
    """
    changes = _read(spark, lake_root, lake.FEATURE_CHANGES)
    closed = _read(spark, lake_root, lake.FEATURES)
    # Tables written before feature_changes existed: features held every window's latest state.
    newest_of = changes if changes is not None else closed
    if newest_of is None:
        return WindowState.empty()
    top = newest_time(newest_of, "last_event_time")
    if top is None:
        return WindowState.empty()
    done = top - pd.Timedelta(seconds=watermark_s)
    written_to: pd.Timestamp | None = None  # the newest end in features
    if changes is not None and closed is not None:
        written_to = newest_time(closed, col.WINDOW_END)

    def since(seconds: float) -> Column:
        return timestamp_literal(top - pd.Timedelta(seconds=seconds))

    parts = []
    if closed is not None:
        reach = watermark_s + 3 * spec.window_s + spec.span_s
        parts.append(closed.where(F.col(col.WINDOW_START) >= since(reach)).toPandas())
    if changes is not None:
        recent_from = _recent_from(top, watermark_s=watermark_s, window_s=spec.window_s)
        recent = F.col(col.WINDOW_START) >= timestamp_literal(recent_from)
        if written_to is None:  # no closed window written: every one may be closed again
            recent = F.lit(True)
        elif written_to < done:
            recent = recent | (F.col(col.WINDOW_END) > timestamp_literal(written_to))
        rows = changes.where(recent).toPandas()
        parts.append(rows.sort_values(col.BATCH_ID, kind="stable").drop(columns=col.BATCH_ID))
    rows = pd.concat([p for p in parts if len(p)] or parts[:1], ignore_index=True)
    rows = rows.drop_duplicates(FEATURE_KEYS, keep="last")
    end = rows[col.WINDOW_END] <= done
    if changes is not None:
        written = rows[col.WINDOW_END] <= written_to if written_to is not None else False
        end = end & written
    again = (rows[col.WINDOW_END] <= done) & ~end
    log.info("detection state loaded: %d open windows (%d of them closed again), %d closed",
             (~end).sum(), again.sum(), end.sum())  # fmt: skip
    history = history_rows(rows[end], min_events).reset_index(drop=True)
    return WindowState(_keyed(rows[~end]), history, top)


def newest_time(frame: DataFrame, column: str) -> pd.Timestamp | None:
    """The latest value of the time ``column`` in ``frame`` (None when it has none), through
    pandas: naive, in the session's time zone (UTC), as the state's times are."""
    newest = frame.agg(F.max(column).alias("t")).toPandas()["t"].iloc[0]
    return None if pd.isna(newest) else pd.Timestamp(newest)


def _recent_from(top: pd.Timestamp, *, watermark_s: float, window_s: float) -> pd.Timestamp:
    """The earliest window start ``load_state`` reads from ``feature_changes`` when ``features``
    is up to date: the windows that may still be open, and those that the last batches closed."""
    return top - pd.Timedelta(seconds=watermark_s + 2 * window_s)


def changes_read_from(
    top: pd.Timestamp, written_to: pd.Timestamp | None, *, watermark_s: float, window_s: float
) -> tuple[pd.Timestamp, pd.Timestamp] | None:
    """What ``load_state`` reads of ``feature_changes``: the rows of the windows that start at the
    first time or later, and of those that end after the second (None: every row). ``top`` is
    the changelog's newest event, ``written_to`` the newest window end in ``features`` (None: no
    window closed yet).

    The recent windows (``_recent_from``), and those closed by batches whose ``features`` append
    had not run. Both times only move forward, so a row not read now is never read later:
    ``pipeline.maintenance`` trims the changelog by them."""
    if written_to is None:
        return None
    return _recent_from(top, watermark_s=watermark_s, window_s=window_s), written_to


def window_states(spark: SparkSession, lake_root: str) -> DataFrame:
    """Every window's current state: its final row in ``features`` once closed, else its latest
    row in ``feature_changes`` (the windows still open)."""
    closed, changes = (
        _read(spark, lake_root, name) for name in (lake.FEATURES, lake.FEATURE_CHANGES)
    )
    if changes is None:
        if closed is None:
            raise FileNotFoundError(f"no features under {lake_root}: has the pipeline run?")
        return closed
    latest = Window.partitionBy(*FEATURE_KEYS).orderBy(F.col(col.BATCH_ID).desc())
    still_open = (
        changes.withColumn("_latest", F.row_number().over(latest) == 1)
        .where("_latest")
        .drop("_latest", col.BATCH_ID)
    )
    if closed is None:
        return still_open
    still_open = still_open.join(closed.select(*FEATURE_KEYS), FEATURE_KEYS, "left_anti")
    return closed.unionByName(still_open, allowMissingColumns=True)


def _read(spark: SparkSession, lake_root: str, name: str) -> DataFrame | None:
    from delta.tables import DeltaTable

    path = lake.table_path(lake_root, name)
    if not DeltaTable.isDeltaTable(spark, path):
        return None
    return spark.read.format("delta").load(path)


@dataclass
class FeaturesBatchWriter:
    """``foreachBatch`` function of the detection query (update mode: the windows that changed).

    Writes the rule alerts of the windows that changed (``alert_writes``) beside those windows,
    to ``feature_changes``, and returns. The windows it closed are dealt with while Spark runs
    the next batch (``AfterBatch``): the model scores them, the rules have their last word on
    them, and the alerts the table lacks (the model's new ones) are appended (``_close``). Once
    the next batch has written its own alerts, the final values of the others, and the
    withdrawn ones, are MERGEd, and the windows go, once, to ``features`` (``_merge``). In the
    batch, scoring them and the MERGE stood between the next batch and its alerts; beside it,
    they share the cores with it instead (docs/PERFORMANCE.md, session 71). The MERGE waits for
    the next batch's alerts, and a later batch with alerts to write waits for the MERGE: Delta
    checks a MERGE as serializable, so an append to its partitions committed while it runs
    fails it, and the next batch is the one whose alerts (new windows opening as the closed ones
    go) nearly always fall in those partitions (docs/PERFORMANCE.md, session 73). Appends
    never conflict: they run side by side. When no next batch comes (no new data), the status
    loop starts the MERGE (``write_if_idle``); a stop or ``settle`` does too.

    Exactly once: the ``features`` append is keyed by the batch id, so a replay writes nothing
    twice there; a replay's ``feature_changes`` rows, if its first attempt had written them,
    repeat them, and every reader keeps one row per window (the latest batch's). The
    ``feature_changes`` append marks the batch as done for ``load_state``; a window it shows
    closed that ``features`` lacks (the process died after the batch, before or within its
    closed windows' writes) is closed again by the next start's first batch: scored and judged
    again (the same values, a window's profile reading only windows that ended before it began,
    unless the model's alias moved meanwhile),
    its alerts written where the table lacks or differs. A batch replayed from the state its
    window changes leave raises the same alerts and writes those the table lacks.
    """

    lake_root: str
    scorer: ModelScorer | None = None
    rules: RuleThresholds = field(default_factory=RuleThresholds)
    spec: ProfileSpec = field(default_factory=ProfileSpec)
    watermark_s: float = 300.0
    app_id: str = "iotfraud"
    # The query's checkpoint: its id goes into the appends' txnAppId (see ``checkpoint_id``).
    checkpoint: str | None = None
    # Receives the rows the model scores in each batch (tests compare them with training's).
    on_scoring: Callable[[pd.DataFrame], None] | None = None
    # Publishes every alert change before it is written (``pipeline.publish``).
    publish: Publish | None = None
    state: WindowState | None = None
    written: WrittenAlerts | None = None
    # A batch and ``finish`` never run side by side, even if a stop returned early.
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    # What a batch leaves to run after it has returned (its closed windows).
    _after: AfterBatch = field(default_factory=AfterBatch, repr=False)
    # What a closing batch leaves for after the next batch's alerts (``_merge``).
    _pending: _Writes | None = field(default=None, repr=False)
    _batches: int = field(default=0, repr=False)  # batches run
    _batches_seen: int = field(default=0, repr=False)  # as ``write_if_idle`` saw it last
    _named: bool = field(default=False, repr=False)  # app_id carries the checkpoint's id

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        with self._lock:
            self._process(batch, batch_id)

    def load(self, spark: SparkSession, window_columns: list[str]) -> None:
        """Load what the first batch needs: the window state, the alerts of open windows and the
        model. Called before the query starts (nothing of it writes these tables yet), so that
        the first batch is not late by the time these take; else the first batch loads them."""
        with self._lock:
            self._load(spark, window_columns)

    def _load(self, spark: SparkSession, window_columns: list[str]) -> None:
        if self.state is None or self.written is None:
            self.state = load_state(spark, self.lake_root, spec=self.spec,
                                    watermark_s=self.watermark_s,
                                    min_events=self.rules.default.min_events)  # fmt: skip
            alerts = lake.table_path(self.lake_root, lake.ALERTS)
            self.written = WrittenAlerts.load(spark, alerts, self._open_after(self.state))
            if self.publish is not None:
                # As the table holds them: a stop that died between publishing the open
                # windows' latest values and writing them (``finish``) is mended here.
                self.publish(self.written.table())
            if self.scorer is not None:
                self.scorer.current(scored_columns(window_columns))

    def _process(self, batch: DataFrame, batch_id: int) -> None:
        spark = batch.sparkSession
        path = partial(lake.table_path, self.lake_root)
        self._load(spark, batch.columns)
        if self.checkpoint and not self._named:
            # The query's id is in its checkpoint once it runs, not before.
            self.app_id = f"{self.app_id}-{checkpoint_id(spark, self.checkpoint)}"
            self._named = True
        assert self.state is not None and self.written is not None
        laps = Laps()
        windows = batch.localCheckpoint(eager=True)
        laps("aggregate")
        received = windows.toPandas()
        changed = still_open(self.state, received, self.watermark_s)
        laps("to pandas")
        state, closing = advance(self.state, changed, spec=self.spec,
                                 watermark_s=self.watermark_s,
                                 min_events=self.rules.default.min_events)  # fmt: skip
        model = self.scorer.current(scored_columns(windows.columns)) if self.scorer else None
        # The closing windows' first: ``profiled`` keeps only the open windows' profiles.
        closing_prof, state = profiled(state, closing, self.spec)
        prof, state = profiled(state, changed, self.spec)
        laps("state and profiles")
        alerts = judge(changed, state.history, rules=self.rules, spec=self.spec, prof=prof)
        laps("rules")
        written = self.written
        self._after.check()  # the writes left after earlier batches did not fail
        replay = written.after_start  # the first batch after a start may be a replay

        def write_new_alerts() -> None:
            writes = alert_writes(spark, alerts, empty_alerts(), path=path(lake.ALERTS),
                                  batch_id=batch_id, written=written,
                                  publish=self.publish)  # fmt: skip
            if writes.empty:
                return
            # After the MERGE of the windows closed before, if it runs (class docstring).
            waited = self._after.wait_first()
            writes.write(spark)
            if waited > 0.05:
                log.debug("detection batch %d waited %.2f s for the last closed windows' alerts",
                          batch_id, waited)  # fmt: skip

        def write_changes() -> None:
            # No transaction id (``append``): a replay's rows are the same as the first
            # attempt's, batch id included, and every reader takes one row per window (the
            # latest batch's).
            if len(received):
                append(windows.withColumn(col.BATCH_ID, F.lit(batch_id).cast("long")),
                       path(lake.FEATURE_CHANGES), rows=len(received),
                       merge_schema=True)  # fmt: skip

        # The window changes mark the batch done (``load_state``). They may land before the
        # alerts: a batch replayed after a crash between the two raises the same alerts from
        # the same windows, and writes those the table lacks (first batch after a start).
        took = side_by_side(write_new_alerts, write_changes)
        written.after_start = False
        laps("alerts {:.2f} s beside window changes {:.2f} s, both".format(*took))
        # This batch's alerts are written: the last closed windows' MERGE may run (``_merge``).
        left = self._pending
        self._pending = None
        if len(closing):
            closed = Closed(closing, closing_prof, state.history, model, batch_id,
                            self._done(state), replay)  # fmt: skip
            schema = windows.schema

            def append_closed() -> None:
                frame = driver_frame(spark, closing[schema.fieldNames()], schema)
                idempotent_append(frame, path(lake.FEATURES), f"{self.app_id}-features",
                                  batch_id, rows=len(closing), merge_schema=True)  # fmt: skip

            writes: list[AlertWrites] = []
            what = f"detection batch {batch_id}'s {len(closing)} closed windows"
            now = _Writes(spark, what, [partial(self._close, spark, closed, writes)])
            self._pending = _Writes(
                spark,
                f"{what}, their MERGE and features",
                [partial(self._merge, spark, closed, writes), append_closed],
            )
            self._start(left, now)
        else:
            self._start(left, None)
        log.debug("detection batch %d: %d windows changed, %d closed, %d alerts; %s", batch_id,
                  len(changed), len(closing), len(alerts), laps)  # fmt: skip
        self.state = state
        self._batches += 1

    def _start(self, left: _Writes | None, now: _Writes | None) -> None:
        """Start ``left`` (the MERGE and ``features`` append an earlier closing batch left for
        after the next batch's alerts), then ``now`` (this batch's closed windows' first
        writes), after the writes started before them. The next batch's alerts wait for the
        MERGE (``wait_first``), not for the appends."""
        parts = [part for part in (left, now) if part is not None]
        if parts:
            self._after.start(parts[0].spark, "; ".join(part.what for part in parts),
                              *[write for part in parts for write in part.writes],
                              hold_next=left is not None)  # fmt: skip

    def _close(self, spark: SparkSession, closed: Closed, writes: list[AlertWrites]) -> None:
        """The windows a batch closed: the model's alerts on them and the rules' last word. The
        alerts the table surely lacks are appended; what needs the MERGE (final values,
        withdrawals, and new alerts of a batch that may be a replay) goes into ``writes``, for
        ``_merge``. Run after the batch (``AfterBatch``)."""
        assert self.written is not None
        laps = Laps()
        closing, prof, model = closed.windows, closed.profiles, closed.model
        scoring = rows_to_score(closing, closed.history, self.spec, prof)
        found = (model_alerts(scoring, model.score(scoring), model)
                 if model is not None and len(scoring) else empty_alerts())  # fmt: skip
        laps("model")
        # The rules' last word on the closed windows: the values their alerts keep.
        last_word = judge(closing, closed.history, rules=self.rules, spec=self.spec, prof=prof)
        stale = self.written.stale(closing, last_word, RULE_TYPES)
        laps("rules")
        planned = alert_writes(spark, found, last_word,
                               path=lake.table_path(self.lake_root, lake.ALERTS),
                               batch_id=closed.batch_id, written=self.written, stale=stale,
                               publish=self.publish, replay=closed.replay)  # fmt: skip
        planned.append(spark)
        writes.append(planned)
        laps("appended")
        log.debug("detection batch %d closed %d windows, %d model alerts; %s", closed.batch_id,
                  len(closing), len(found), laps)  # fmt: skip
        if self.on_scoring is not None:
            self.on_scoring(scoring)

    def _merge(self, spark: SparkSession, closed: Closed, writes: list[AlertWrites]) -> None:
        """The MERGE ``_close`` left; then the closed windows' alerts are final."""
        assert self.written is not None
        writes[0].merge(spark)
        if closed.done is not None:
            self.written.forget_until(closed.done)

    @contextmanager
    def paused(self) -> Iterator[None]:
        """No batch runs inside (one running is finished first)."""
        with self._lock:
            yield

    def write_if_idle(self) -> None:
        """Start what the last closing batch left for after the next batch (``_merge``, the
        ``features`` append) when no batch ran since the last call and none runs now: a stream
        without new data runs no next batch. Called at every status report
        (``pipeline.job.run_until_stopped``)."""
        if not self._lock.acquire(blocking=False):
            return
        try:
            if self._batches == self._batches_seen:
                self._start(self._pending, None)
                self._pending = None
            self._batches_seen = self._batches
        finally:
            self._lock.release()

    def finish(self, spark: SparkSession) -> None:
        """Write the current values of the alerts whose window is still open, where they differ
        from the table's (batches leave them as raised, ``alert_writes``). Called once the query
        has stopped, so that a stopped pipeline's table holds every alert's latest values."""
        with self._lock:
            self._finish(spark)

    def settle(self) -> None:
        """Run what the last batches left to run after them (``AfterBatch``), those left for
        after the next batch too, and wait until it is done: before reading ``features``."""
        with self._lock:
            self._settle()

    def _settle(self) -> None:
        self._start(self._pending, None)
        self._pending = None
        self._after.wait()

    def _finish(self, spark: SparkSession) -> None:
        self._settle()
        if self.state is None or self.written is None or self.state.open.empty:
            return
        if getattr(self.publish, "failed", None):  # the broker is why the pipeline stops
            log.warning("alerts of open windows keep the values they were raised with: the "
                        "alerts topic did not acknowledge")  # fmt: skip
            return
        current = judge(self.state.open, self.state.history, rules=self.rules, spec=self.spec)
        # Values only: an alert the open windows call for now is raised by the next batch.
        current = current[current["alert_id"].isin(self.written.rows.keys())]
        alert_writes(spark, empty_alerts(), current,
                     path=lake.table_path(self.lake_root, lake.ALERTS),
                     batch_id=-1,  # unused: updates keep the batch id of the insert
                     written=self.written, publish=self.publish).write(spark)  # fmt: skip

    def _open_after(self, state: WindowState) -> pd.Timestamp | None:
        """The alerts of windows ending after this may change: those of open windows, and of
        the closed ones ``load_state`` put back to be closed again."""
        done = self._done(state)
        if done is None or state.open.empty:
            return done
        earliest = pd.Timestamp(state.open[col.WINDOW_END].min())
        return min(done, earliest - pd.Timedelta(seconds=1))

    def _done(self, state: WindowState) -> pd.Timestamp | None:
        """Windows ending at or before this are closed: no event can change them any more."""
        if state.max_event_time is None:
            return None
        return state.max_event_time - pd.Timedelta(seconds=self.watermark_s)
