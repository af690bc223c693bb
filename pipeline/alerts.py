"""Alert rows, in one place: the deterministic ``alert_id``, the row every detector produces, and
the idempotent writes into the ``alerts`` table.

Detectors (``pipeline.rules``, ``pipeline.scoring``, ``pipeline.firmware``) decide on the driver,
in pandas, and make their alert rows with ``alert_frame``: a (device, window start, alert type)
has one id whichever detector raised it. Every change an alert write makes can be published
first (``pipeline.publish``).

A rule alert raised while its window fills is provisional: the window's verdict may change as
events arrive (readings that vary again, a late event between two positions). When the watermark
closes the window, the rules decide on its final state; the alert takes those values, or, if the
finished window does not call for it, is marked withdrawn (``status``). So what stands once a
window has closed depends only on the events, not on how they were cut into micro-batches.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, cast

import numpy as np
import pandas as pd
from delta.tables import DeltaTable
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from infra import contract as c
from pipeline import columns as col
from pipeline.metrics import Laps
from pipeline.sinks import append, driver_frame, retry_on_conflict

log = logging.getLogger(__name__)

# What a detector produces; status, detected_at and batch_id are added on writing.
DETECTOR_COLUMNS = (
    "alert_id", "device_id", "alert_type", "severity", "score", "reasons", "model_name",
    "model_version", col.WINDOW_START, col.WINDOW_END, "first_event_time", "last_event_time",
)  # fmt: skip
TABLE_COLUMNS = list(c.column_names(c.ALERTS_COLUMNS))
# Fields an updated window may change in an existing alert; the first detection time stays.
_UPDATABLE = ("severity", "score", "reasons", "window_end", "first_event_time", "last_event_time",
              "model_version")  # fmt: skip
# Spark's text of a timestamp (session time zone, UTC here): what alert_id hashes.
_TIME_TEXT = "%Y-%m-%d %H:%M:%S"


def timestamp_literal(when: pd.Timestamp) -> Column:
    """``when`` (naive, UTC) as a Spark timestamp literal, to the second: for bounds on the
    tables' time columns."""
    return F.lit(when.strftime(_TIME_TEXT)).cast("timestamp")


def alert_id_of(device_id: str, alert_type: str, window_start: datetime) -> str:
    """Deterministic key: the same device, window and type always give the same id. In SQL:
    ``sha2(concat_ws('|', device_id, alert_type, CAST(window_start AS STRING)), 256)`` (windows
    start on whole seconds)."""
    text = f"{device_id}|{alert_type}|{window_start.strftime(_TIME_TEXT)}"
    return hashlib.sha256(text.encode()).hexdigest()


def alert_frame(
    windows: pd.DataFrame,
    alert_type: str,
    severity: str | pd.Series,
    score: pd.Series | float,
    reason: pd.Series | str,
    *,
    model: tuple[str, str] | None = None,
) -> pd.DataFrame:
    """One alert per row of ``windows`` (window features), DETECTOR_COLUMNS, in pandas."""
    frame = windows[["device_id", col.WINDOW_START, col.WINDOW_END, "first_event_time",
                     "last_event_time"]].copy()  # fmt: skip
    frame["alert_type"] = alert_type
    frame["severity"] = severity
    frame["score"] = pd.Series(score, index=frame.index, dtype="float64").clip(0.0, 1.0)
    reasons = pd.Series(reason, index=frame.index, dtype="object")
    frame["reasons"] = [[text] for text in reasons]
    frame["model_name"] = model[0] if model else None
    frame["model_version"] = model[1] if model else None
    frame["alert_id"] = [
        alert_id_of(d, alert_type, s)
        for d, s in zip(frame["device_id"], frame[col.WINDOW_START], strict=True)
    ]
    return frame[list(DETECTOR_COLUMNS)]


def empty_alerts() -> pd.DataFrame:
    return pd.DataFrame({name: pd.Series(dtype="object") for name in DETECTOR_COLUMNS})


def as_written(alerts: pd.DataFrame, batch_id: int, detected_at: pd.Timestamp) -> pd.DataFrame:
    """Detector rows (DETECTOR_COLUMNS) as rows of the ``alerts`` table: raised by ``batch_id``
    at ``detected_at``."""
    rows = alerts[list(DETECTOR_COLUMNS)].copy()
    rows["status"] = c.ALERT_RAISED
    rows["detected_at"] = detected_at
    rows["batch_id"] = batch_id
    return rows[TABLE_COLUMNS]


def batch_time() -> pd.Timestamp:
    """The ``detected_at`` of a batch's alerts: now, in UTC, to the microsecond Delta keeps (the
    published message and the table row must agree)."""
    return pd.Timestamp.now(tz="UTC").tz_localize(None).floor("us")


def to_spark(spark: SparkSession, rows: pd.DataFrame) -> DataFrame:
    """Pandas rows of the ``alerts`` table (TABLE_COLUMNS) as a Spark frame of its schema."""
    schema = c.spark_ddl(c.ALERTS_COLUMNS)
    # From pandas through Arrow: naive timestamps are read in the session time zone (UTC), as
    # they were written by toPandas.
    return driver_frame(spark, rows[TABLE_COLUMNS], schema)


def merge_alerts(spark: SparkSession, rows: pd.DataFrame, path: str) -> None:
    """MERGE ``rows`` of the table (TABLE_COLUMNS) on alert_id: new alerts inserted, changed
    ones updated, and rows whose ``status`` is withdrawn mark the table's withdrawn; a replay
    changes nothing. One commit, however many of each kind.
    """
    if rows.empty:
        return
    alerts = to_spark(spark, rows)
    changed = " OR ".join(f"NOT (t.`{f}` <=> s.`{f}`)" for f in _UPDATABLE)
    withdrawn = f"s.status <=> '{c.ALERT_WITHDRAWN}'"
    # alert_id is made from the window start, so a match has the same window start. Bounding it
    # by the rows' own lets Delta skip, by their statistics, the files of older windows and of
    # newer ones: a batch's final values are of windows closing now, its new alerts of windows
    # still filling. The bounds are whole hours: Spark writes them into the code it compiles for
    # the MERGE (several classes of 20-100 KB), and bounds that change with every MERGE were new
    # code to compile every time, on the detection batch's path (docs/PERFORMANCE.md).
    starts = pd.to_datetime(rows[col.WINDOW_START])
    # And by their types (alert_id is made from the type too): the table's partitions, so that
    # Delta checks the commits of other detectors, made meanwhile, against these partitions only
    # (``infra.contract.ALERTS_PARTITIONED_BY``).
    types = ", ".join(f"'{t}'" for t in sorted(set(rows["alert_type"])))
    condition = (
        f"t.alert_id = s.alert_id AND t.alert_type IN ({types}) AND t.`{col.WINDOW_START}` "
        f"BETWEEN TIMESTAMP '{starts.min().floor('h').strftime(_TIME_TEXT)}' AND "
        f"TIMESTAMP '{(starts.max().floor('h') + pd.Timedelta(hours=1)).strftime(_TIME_TEXT)}'"
    )

    def merge() -> None:
        update: dict[str, str | Column] = {f: f"s.`{f}`" for f in _UPDATABLE}
        status: dict[str, str | Column] = {"status": "s.status"}
        (
            DeltaTable.forPath(spark, path)
            .alias("t")
            .merge(alerts.alias("s"), condition)
            .whenMatchedUpdate(f"{withdrawn} AND NOT (t.status <=> s.status)", status)
            .whenMatchedUpdate(f"NOT ({withdrawn}) AND ({changed})", update)
            .whenNotMatchedInsertAll(f"NOT ({withdrawn})")
            .execute()
        )

    retry_on_conflict(merge, "alerts MERGE")


def _comparable(value: object) -> Hashable:
    """A field's value as the table gives it back: lists as tuples, NaN and NaT as None."""
    if isinstance(value, np.ndarray):
        return tuple(value.tolist())
    if isinstance(value, (list, tuple)):
        return tuple(value)
    if value is None or (isinstance(value, float) and np.isnan(value)) or value is pd.NaT:
        return None
    if isinstance(value, datetime):
        return pd.Timestamp(value)
    return value


def _fields(row: Mapping[str, Any]) -> tuple[Hashable, ...]:
    return tuple(_comparable(row[name]) for name in _UPDATABLE)


def records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """The rows of ``frame`` as dicts by column name."""
    return cast("list[dict[str, Any]]", frame.to_dict("records"))


def _updated(held: Mapping[str, Any], row: Mapping[str, Any]) -> dict[str, Any]:
    """The table's row ``held`` after the MERGE of ``row``: its updatable fields taken."""
    return {**held, **{f: row[f] for f in _UPDATABLE}}


def _frame(rows: Iterable[Mapping[str, Any]]) -> pd.DataFrame:
    return pd.DataFrame(list(rows), columns=TABLE_COLUMNS)


def _concat(*parts: pd.DataFrame) -> pd.DataFrame:
    """Table rows of ``parts`` (TABLE_COLUMNS) in one frame; empty parts are left out."""
    found = [part for part in parts if len(part)]
    return pd.concat(found, ignore_index=True) if found else _frame([])


def table_rows(
    spark: SparkSession, path: str, ids: Iterable[str], earliest: pd.Timestamp
) -> dict[str, dict[str, Any]]:
    """The rows the table holds for the alerts ``ids`` (windows starting at ``earliest`` or
    later), by ``alert_id``."""
    if not DeltaTable.isDeltaTable(spark, path):
        return {}
    since = timestamp_literal(earliest)
    found = (
        spark.read.format("delta").load(path)
        .where((F.col(col.WINDOW_START) >= since) & F.col("alert_id").isin(list(ids)))
        .toPandas()
    )  # fmt: skip
    return {row["alert_id"]: row for row in records(found)}


def after_merge(
    incoming: pd.DataFrame, existing: Mapping[str, Mapping[str, Any]]
) -> tuple[pd.DataFrame, pd.Series]:
    """What ``merge_alerts`` of the ``incoming`` table rows leaves in a table holding
    ``existing``: each alert's row afterwards, and whether the MERGE changed it."""
    rows, changed = [], []
    for row in records(incoming):
        held = existing.get(row["alert_id"])
        if held is None:
            rows.append(row)
            changed.append(True)
        else:
            rows.append(_updated(held, row))
            changed.append(_fields(held) != _fields(row))
    return _frame(rows), pd.Series(changed, dtype=bool)


@dataclass
class WrittenAlerts:
    """The alerts the table holds for windows that may still change: alert_id -> the row as the
    table holds it, and the window's end. A window's rule alert is decided again every time the
    window changes; most of those decisions repeat what the table already holds, and writing
    them again would cost a MERGE per batch for nothing."""

    rows: dict[str, dict[str, Any]] = field(default_factory=dict)
    ends: dict[str, pd.Timestamp] = field(default_factory=dict)
    # The table may hold alerts whose ``unknown_by`` is at or before this that are not known
    # here (a start without window state, e.g. after the features tables were rebuilt; alerts
    # forgotten since): such a new alert is MERGEd, not appended. None: every alert in the table
    # is known.
    unknown_until: pd.Timestamp | None = None
    # The column ``unknown_until`` bounds: a window's end for windowed detection; a silence's
    # start for silence, whose alerts have no end while the device is silent.
    unknown_by: str = col.WINDOW_END
    # The first batch after a start may be the replay of one whose writes partly committed, and
    # may decide otherwise (the registry unreachable, say): its new alerts go through the MERGE,
    # which inserts only what the table lacks. Only that batch can be a replay, so later ones
    # append with no Delta transaction id (``alert_writes``).
    after_start: bool = False

    # Detection writes the alerts of a batch's windows while the writes of the windows an
    # earlier batch closed run on a thread of their own (``pipeline.detection``): different
    # alerts, the same dicts.
    _lock: threading.RLock = field(default_factory=threading.RLock, repr=False, compare=False)

    def split(self, alerts: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
        """``alerts`` (DETECTOR_COLUMNS) as (new, changed); the unchanged ones are left out."""
        if alerts.empty:
            return alerts, alerts
        with self._lock:
            known = [self.rows.get(key) for key in alerts["alert_id"]]
        now = [_fields(row) for row in records(alerts)]
        new = np.array([k is None for k in known], dtype=bool)
        changed = np.array(
            [k is not None and _fields(k) != n for k, n in zip(known, now, strict=True)],
            dtype=bool,
        )
        return alerts[new], alerts[changed]

    def stale(
        self, closing: pd.DataFrame, final: pd.DataFrame, types: Iterable[str]
    ) -> pd.DataFrame:
        """Alerts of the ``types`` on the ``closing`` windows that the table holds standing
        (raised while the window filled) and the ``final`` decision on the finished window does
        not call for: their rows, marked withdrawn."""
        if closing.empty:
            return _frame([])
        called_for = set(final["alert_id"])
        kinds = set(types)
        # By the known alerts (a few per device at most), not by every closing window and type.
        windows = set(zip(closing["device_id"], pd.to_datetime(closing[col.WINDOW_START]),
                          strict=True))  # fmt: skip
        with self._lock:
            known = list(self.rows.items())
        return _frame(
            {**row, "status": c.ALERT_WITHDRAWN}
            for key, row in known
            if row["alert_type"] in kinds
            and (row["device_id"], pd.Timestamp(row[col.WINDOW_START])) in windows
            and key not in called_for
            and row.get("status") != c.ALERT_WITHDRAWN
        )

    def to_write(
        self, raised: pd.DataFrame, final: pd.DataFrame
    ) -> tuple[pd.DataFrame, pd.DataFrame]:
        """(new, changed): the alerts the table lacks, raised on a window or called for by its
        final state alone (a device's profile can change the verdict on a window that received
        no more events), with the final values where both; and the known alerts whose final
        values differ from the table's."""
        new, _ = self.split(raised)
        only_final, changed = self.split(final)
        if len(only_final):
            kept = new[~new["alert_id"].isin(only_final["alert_id"])]
            new = pd.concat([kept, only_final]) if len(kept) else only_final
        return new, changed

    def table(self) -> pd.DataFrame:
        """The known alerts' rows, as the table holds them."""
        with self._lock:
            return _frame(list(self.rows.values()))

    def updated(self, changed: pd.DataFrame) -> pd.DataFrame:
        """The table rows of the known ``changed`` alerts, with their new values."""
        with self._lock:
            return _frame([_updated(self.rows[row["alert_id"]], row) for row in records(changed)])

    def held(self, ids: Iterable[str]) -> dict[str, dict[str, Any]]:
        """The rows of the known alerts ``ids``, as the table holds them."""
        with self._lock:
            return {key: self.rows[key] for key in ids}

    def maybe_written(self, alerts: pd.DataFrame, replay: bool | None = None) -> pd.Series:
        """Per alert not known here: whether the table may hold it all the same. ``replay``: the
        write may be a replay's (default: ``after_start``)."""
        if self.after_start if replay is None else replay:
            return pd.Series(True, index=alerts.index)
        if self.unknown_until is None:
            return pd.Series(False, index=alerts.index)
        return pd.to_datetime(alerts[self.unknown_by]) <= self.unknown_until

    def remember(self, alerts: pd.DataFrame) -> None:
        with self._lock:
            for row in records(alerts):
                self.rows[row["alert_id"]] = row
                self.ends[row["alert_id"]] = pd.Timestamp(row[col.WINDOW_END])

    def forget_until(self, closed_before: pd.Timestamp) -> None:
        """Drop the alerts that ended at or before ``closed_before`` (a window closed: no event
        can change its alerts any more); an alert with no end (a silence still open) stays. What
        is dropped may be in the table unknown here (``unknown_until``): it started and ended by
        ``closed_before``."""
        with self._lock:
            gone = [key for key, end in self.ends.items() if end <= closed_before]
            for key in gone:
                del self.rows[key], self.ends[key]
            if gone and (self.unknown_until is None or self.unknown_until < closed_before):
                self.unknown_until = closed_before

    @classmethod
    def load(cls, spark: SparkSession, path: str, open_after: pd.Timestamp | None) -> WrittenAlerts:
        """The alerts of windows ending after ``open_after``, as the table holds them; without
        ``open_after`` (no window state), none, and every alert in the table counts as possibly
        written (``unknown_until``)."""
        if not DeltaTable.isDeltaTable(spark, path):
            return cls(after_start=True)
        table = spark.read.format("delta").load(path)
        if open_after is None:
            newest = table.agg(F.max(col.WINDOW_END).alias("t")).first()
            return cls(unknown_until=None if newest is None or newest.t is None
                       else pd.Timestamp(newest.t), after_start=True)  # fmt: skip
        since = timestamp_literal(open_after)
        rows = table.where(F.col(col.WINDOW_END) > since).toPandas()
        written = cls(unknown_until=open_after, after_start=True)
        written.remember(rows)
        log.info("alerts of open windows loaded: %d", len(rows))
        return written

    @classmethod
    def load_open(
        cls, spark: SparkSession, path: str, types: Iterable[str], horizon: pd.Timedelta
    ) -> WrittenAlerts:
        """The alerts of ``types`` that may still change, for a detector whose alerts stay open
        until an event ends them (silence; known by their start, ``unknown_by``): the open ones
        (no end), and those that ended within ``horizon`` of the newest end. The ones that ended
        earlier count as possibly written (``unknown_until``)."""
        written = cls(unknown_by=col.WINDOW_START)
        if not DeltaTable.isDeltaTable(spark, path):
            return written
        table = spark.read.format("delta").load(path).where(F.col("alert_type").isin(list(types)))
        newest = table.agg(F.max(col.WINDOW_END).alias("t")).first()
        if newest is not None and newest.t is not None:
            written.unknown_until = pd.Timestamp(newest.t) - horizon
            since = timestamp_literal(written.unknown_until)
            table = table.where(F.col(col.WINDOW_END).isNull() | (F.col(col.WINDOW_END) > since))
        rows = table.toPandas()
        written.remember(rows)
        log.info("open alerts loaded: %d", len(rows))
        return written


Publish = Callable[[pd.DataFrame], None]


def upsert_alerts(
    spark: SparkSession,
    alerts: pd.DataFrame,
    batch_id: int,
    *,
    path: str,
    publish: Publish | None = None,
) -> None:
    """MERGE ``alerts`` (DETECTOR_COLUMNS) by ``alert_id``, raised by ``batch_id`` now: new ones
    inserted, changed ones updated, a replay changes nothing. With ``publish``, the rows the
    MERGE changes, as the table will hold them, are published first. For detectors whose alerts
    are few and final when raised (firmware); detection and silence keep the table's rows in
    memory instead (``alert_writes``)."""
    if alerts.empty:
        return
    rows = as_written(alerts, batch_id, batch_time())
    if publish is not None:
        earliest = pd.Timestamp(rows[col.WINDOW_START].min())
        after, changed = after_merge(rows, table_rows(spark, path, rows["alert_id"], earliest))
        publish(after[changed.to_numpy()])
    merge_alerts(spark, rows, path)


# eq=False: its fields are frames, which compare element by element, not to a bool.
@dataclass(frozen=True, eq=False)
class AlertWrites:
    """What ``alert_writes`` plans, in two steps: ``append`` (the alerts the table surely
    lacks) and ``merge`` (the rest, in one MERGE). Each publishes its rows first and tells
    ``written`` what the table then holds. A detector may run them apart: the append is blind
    and never conflicts with another writer, while the MERGE fails on an append to its
    partitions committed meanwhile (``pipeline.detection`` runs a closed window's MERGE once
    the next batch's alerts are written)."""

    appended: pd.DataFrame  # table rows
    merged: pd.DataFrame  # table rows MERGEd: new ones the table may hold, changed ones
    after: pd.DataFrame  # ``merged`` as the table holds them after the MERGE
    changes: np.ndarray  # per row of ``after``: whether the MERGE changes it
    withdrawn: pd.DataFrame  # table rows marked withdrawn, MERGEd with ``merged``
    path: str
    written: WrittenAlerts
    publish: Publish | None = None

    @property
    def empty(self) -> bool:
        return not (len(self.appended) or len(self.merged) or len(self.withdrawn))

    def write(self, spark: SparkSession) -> None:
        """Both steps, one after the other."""
        self.append(spark)
        self.merge(spark)
        self.written.after_start = False

    def append(self, spark: SparkSession) -> None:
        laps = Laps()
        if len(self.appended):
            if self.publish is not None:
                self.publish(self.appended)
            laps("publish")
            append(to_spark(spark, self.appended), self.path, rows=len(self.appended))
            laps("append")
            log.debug("alerts appended (%s): %d; %s", _types(self.appended), len(self.appended),
                      laps)  # fmt: skip
        self.written.remember(self.appended)

    def merge(self, spark: SparkSession) -> None:
        laps = Laps()
        rows = _concat(self.merged, self.withdrawn)
        if len(rows):
            if self.publish is not None:
                self.publish(_concat(self.after[self.changes], self.withdrawn))
            laps("publish")
            # Final values and withdrawals in one MERGE: both come when windows close.
            merge_alerts(spark, rows, self.path)
            laps("MERGE")
            log.debug("alerts MERGEd (%s): %d, %d of them withdrawn; %s", _types(rows),
                      len(rows), len(self.withdrawn), laps)  # fmt: skip
        self.written.remember(self.after)
        self.written.remember(self.withdrawn)


def _types(rows: pd.DataFrame) -> str:
    """Which detector wrote ``rows``: each writes its own alert types."""
    return ", ".join(sorted(set(rows["alert_type"])))


def alert_writes(
    spark: SparkSession,
    raised: pd.DataFrame,
    final: pd.DataFrame,
    *,
    path: str,
    batch_id: int,
    written: WrittenAlerts,
    stale: pd.DataFrame | None = None,
    publish: Publish | None = None,
    replay: bool | None = None,
) -> AlertWrites:
    """The writes (``AlertWrites``; ``write`` runs both) that append the alerts the table does
    not hold yet (``WrittenAlerts.to_write``: ``raised`` on a changed window, or called for by
    the ``final`` state of a closing one); then, in one MERGE,
    the ``final`` values of alerts (their window closed, or the query stopped) where they differ
    from the table's, and the ``stale`` ones marked withdrawn (``WrittenAlerts.stale``). With
    ``publish``, every row these writes change, as the table will hold it, is published first
    (``pipeline.publish``).

    An alert is written when first raised and, if its values changed meanwhile, once more with
    its final values. A window's rule alert is decided again every time the window changes, and
    its score and reason move with nearly every event: writing each change would put a MERGE in
    most batches, between the next alert and the table. Until then the table shows the values
    the alert was raised with.

    Exactly once: ``written`` holds every alert the table has for the open windows (loaded at
    start), so a replayed batch finds its new alerts written and its final values too. A new
    alert the table may hold all the same goes through the MERGE, which inserts only what the
    table lacks: one of a window older than the loaded ones (``WrittenAlerts.unknown_until``),
    and every new alert of the first batch after a start (``WrittenAlerts.after_start``), the
    only batch that can be a replay, as a query runs each later batch once. So the append is a
    plain one: a Delta transaction id would cost a job over the table's state before each
    append (delta-spark 4.4.0 reads the id's last version from the reconstructed state), between
    the detection and the alert.

    ``replay``: the write may be a replay's (default: ``written.after_start``), so its new
    alerts go through the MERGE.
    """
    new, changed = written.to_write(raised, final)
    rows = as_written(new, batch_id, batch_time())
    maybe = written.maybe_written(rows, replay).to_numpy()
    merged = _concat(rows[maybe], written.updated(changed))
    # What the MERGE leaves in the table: the rows it may hold are read (a start without state).
    held = {}
    if maybe.any():
        held = table_rows(spark, path, rows[maybe]["alert_id"],
                          pd.Timestamp(rows[maybe][col.WINDOW_START].min()))  # fmt: skip
    held.update(written.held(changed["alert_id"]))
    after, changes = after_merge(merged, held)
    return AlertWrites(rows[~maybe], merged, after, changes.to_numpy(),
                       stale if stale is not None else _frame([]), path, written,
                       publish)  # fmt: skip
