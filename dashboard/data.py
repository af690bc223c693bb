"""Read functions over the Delta lake and the one writer (analyst feedback).

Every reader opens the latest version of its table with ``deltalake`` and scans it with polars
(``scan_delta``), so column selection and filters are pushed down to the Parquet files: the
log's file statistics skip whole files, row-group statistics skip parts of the rest. A table
that does not exist yet gives an empty frame with the contract's columns, so pages can show an
empty state instead of an error. No Spark, no JVM.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

import polars as pl
import pyarrow as pa
from deltalake import write_deltalake

from infra import contract as c
from infra import lake
from infra.lake import delta_uri, open_table
from infra.mlflow_store import aliased_version, missing_store

log = logging.getLogger(__name__)

# The features table has no contract of its own; these are the columns every version has.
FEATURE_KEY_COLUMNS: c.Columns = (
    ("device_id", "string"),
    ("window_start", "timestamp"),
    ("window_end", "timestamp"),
    ("event_count", "long"),
)
CONTRACTS: dict[str, c.Columns] = {
    lake.DEVICES: c.DEVICES_COLUMNS,
    lake.TELEMETRY: c.TELEMETRY_COLUMNS,
    lake.QUARANTINE: c.QUARANTINE_COLUMNS,
    lake.FEATURES: FEATURE_KEY_COLUMNS,
    lake.FEATURE_CHANGES: FEATURE_KEY_COLUMNS,
    lake.ALERTS: c.ALERTS_COLUMNS,
    lake.ALERT_FEEDBACK: c.ALERT_FEEDBACK_COLUMNS,
    lake.PIPELINE_METRICS: c.PIPELINE_METRICS_COLUMNS,
    lake.GROUND_TRUTH: c.GROUND_TRUTH_COLUMNS,
    lake.EVALUATION: c.EVALUATION_COLUMNS,
    lake.FAST_ALERTS: c.FAST_ALERTS_COLUMNS,
}
UTC_POLARS = pl.Datetime("us", "UTC")
SEVERITY_RANK = {name: rank for rank, name in enumerate(c.SEVERITIES)}
# The pipeline quarantines event times before 2000 (``bad_timestamp``), so no earlier watermark
# comes from an event: it is Spark's "no watermark yet" (the epoch), or that value shifted by a
# time zone, and read as a value it is a lag of half a century.
EARLIEST_WATERMARK = datetime(2000, 1, 1, tzinfo=timezone.utc)


@dataclass(frozen=True)
class TimeRange:
    """A page's time range: the ``hours`` up to the moment of reading, or fixed bounds.

    Relative ranges are resolved by ``bounds`` when the data is read, so that "the last hour"
    stays one cached read while the clock moves. Neither set: all time.
    """

    hours: float | None = None
    since: datetime | None = None
    until: datetime | None = None

    def bounds(self, now: datetime | None = None) -> tuple[datetime | None, datetime | None]:
        """``(since, until)``; a relative range has no upper bound (device clocks run ahead)."""
        if self.hours is not None:
            return lookback(self.hours, now), None
        return self.since, self.until


ALL_TIME = TimeRange()


# --- Generic access ------------------------------------------------------------------------------
def empty_frame(columns: c.Columns, only: Sequence[str] | None = None) -> pl.DataFrame:
    """A zero-row frame with the contract's types (restricted to ``only`` when given)."""
    wanted = [(n, t) for n, t in columns if only is None or n in only]
    return _from_arrow(c.arrow_schema(tuple(wanted)).empty_table())


def read_table(
    lake_root: str,
    table: str,
    *,
    columns: Sequence[str] | None = None,
    where: pl.Expr | None = None,
) -> pl.DataFrame:
    """Read ``columns`` of the rows matching ``where``; both are pushed down to the files.

    Args:
        lake_root: Root of the lake (folder or URI).
        table: A table name from ``infra.lake``.
        columns: Columns to load; None loads all. Columns the table lacks are left out.
        where: A polars expression on columns the table has (``time_filter``, ``in_filter``).

    Returns:
        The rows as a polars frame; an empty frame with the contract's columns when the table
        does not exist or has no rows yet.
    """
    scan = _scan(lake_root, table)
    if scan is None:
        return empty_frame(CONTRACTS.get(table, ()), columns)
    present = scan.collect_schema().names()
    wanted = present if columns is None else [n for n in columns if n in present]
    if where is not None:
        scan = scan.filter(where)
    return scan.select(wanted).collect()


def _scan(lake_root: str, table: str) -> pl.LazyFrame | None:
    """The latest version of ``table`` as a lazy polars scan; None when it does not exist."""
    dt = open_table(lake_root, table)
    return None if dt is None else pl.scan_delta(dt)


def table_exists(lake_root: str, table: str) -> bool:
    return open_table(lake_root, table) is not None


def _from_arrow(table: pa.Table) -> pl.DataFrame:
    frame = pl.from_arrow(table)
    assert isinstance(frame, pl.DataFrame)
    return frame


def _and(*parts: pl.Expr | None) -> pl.Expr | None:
    result: pl.Expr | None = None
    for part in parts:
        if part is not None:
            result = part if result is None else result & part
    return result


def _utc(moment: datetime) -> datetime:
    """``moment`` as an aware UTC time; a naive one is taken to be UTC already."""
    if moment.tzinfo is None:
        return moment.replace(tzinfo=timezone.utc)
    return moment.astimezone(timezone.utc)


def time_filter(
    column: str, since: datetime | None = None, until: datetime | None = None
) -> pl.Expr | None:
    """``since <= column < until``, either bound optional."""
    lower = pl.col(column) >= pl.lit(_utc(since), UTC_POLARS) if since else None
    upper = pl.col(column) < pl.lit(_utc(until), UTC_POLARS) if until else None
    return _and(lower, upper)


def in_filter(column: str, values: Sequence[str | None] | None) -> pl.Expr | None:
    """``column IN values`` on a string column; a None value matches nulls; None: no filter."""
    if values is None:
        return None
    present = [v for v in values if v is not None]
    # Typed so that an empty list means "nothing" rather than an untyped (null) set.
    expr = pl.col(column).is_in(pl.Series(present, dtype=pl.String))
    return expr | pl.col(column).is_null() if None in values else expr


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


# --- Alerts and feedback -------------------------------------------------------------------------
# The alert columns the overview page reads (``dashboard/views/overview.py``).
OVERVIEW_ALERT_COLUMNS = (
    "alert_id", "device_id", "alert_type", "severity", "window_start", "score", "detected_at",
)  # fmt: skip


def read_alerts(
    lake_root: str,
    *,
    since: datetime | None = None,
    until: datetime | None = None,
    alert_types: Sequence[str] | None = None,
    severities: Sequence[str] | None = None,
    device_ids: Sequence[str] | None = None,
    model_versions: Sequence[str | None] | None = None,
    alert_ids: Sequence[str] | None = None,
    columns: Sequence[str] | None = None,
    withdrawn: bool = False,
) -> pl.DataFrame:
    """Alerts whose window starts in ``[since, until)``, newest window first; the ones withdrawn
    when their window closed (``status``) only with ``withdrawn``.

    Each list argument restricts the rows to those values (None: no restriction); a None in
    ``model_versions`` selects rule alerts, which have no model version.
    """
    where = _and(
        time_filter("window_start", since, until),
        in_filter("alert_type", alert_types),
        in_filter("severity", severities),
        in_filter("device_id", device_ids),
        in_filter("model_version", model_versions),
        in_filter("alert_id", alert_ids),
    )
    # ``status`` is read to leave withdrawn alerts out, once even when ``columns`` names it.
    wanted = None if columns is None else list(dict.fromkeys([*columns, "status"]))
    frame = read_table(lake_root, lake.ALERTS, columns=wanted, where=where)
    if not withdrawn and "status" in frame.columns:
        frame = frame.filter(pl.col("status").ne_missing(c.ALERT_WITHDRAWN))
    if columns is not None and "status" not in columns:
        frame = frame.drop("status", strict=False)
    order = [n for n in ("window_start", "detected_at", "alert_id") if n in frame.columns]
    return frame.sort(order, descending=True, nulls_last=True) if order else frame


def read_feedback(lake_root: str, alert_ids: Sequence[str] | None = None) -> pl.DataFrame:
    """The latest verdict per alert (an analyst may change their mind; the last word counts)."""
    frame = read_table(lake_root, lake.ALERT_FEEDBACK, where=in_filter("alert_id", alert_ids))
    if frame.is_empty():
        return frame
    return (
        frame.sort("created_at", nulls_last=False)
        .group_by("alert_id", maintain_order=True)
        .last()
        .sort("created_at", descending=True)
    )


def with_feedback(alerts: pl.DataFrame, feedback: pl.DataFrame) -> pl.DataFrame:
    """Alerts plus ``verdict``, ``note``, ``analyst`` and ``reviewed_at`` (null when open)."""
    verdicts = feedback.select(
        "alert_id", "verdict", "note", "analyst", pl.col("created_at").alias("reviewed_at")
    )
    return alerts.join(verdicts, on="alert_id", how="left")


def open_alerts(alerts: pl.DataFrame, feedback: pl.DataFrame) -> pl.DataFrame:
    """Alerts no analyst has given a verdict on yet."""
    return alerts.join(feedback.select("alert_id"), on="alert_id", how="anti")


def write_feedback(
    lake_root: str,
    alert_id: str,
    verdict: str,
    *,
    note: str = "",
    analyst: str = "",
    now: datetime | None = None,
) -> None:
    """Append one verdict to ``alert_feedback`` (the alerts table is never touched).

    Raises:
        ValueError: ``verdict`` is not one of ``contract.VERDICTS`` or ``alert_id`` is empty.
    """
    if verdict not in c.VERDICTS:
        raise ValueError(f"verdict must be one of {c.VERDICTS}, got {verdict!r}")
    if not alert_id:
        raise ValueError("alert_id is empty")
    row = {
        "alert_id": [alert_id],
        "verdict": [verdict],
        "note": [note],
        "analyst": [analyst],
        "created_at": [now or utcnow()],
    }
    table = pa.Table.from_pydict(row, schema=c.arrow_schema(c.ALERT_FEEDBACK_COLUMNS))
    uri = delta_uri(lake_root, lake.ALERT_FEEDBACK)
    if not lake.is_uri(uri):
        lake.ensure_lake(lake_root)
    write_deltalake(uri, table, mode="append")
    log.info("feedback %s on alert %s by %s", verdict, alert_id, analyst or "?")


# --- Which path raised an alert first ------------------------------------------------------------
# The alert types the fast path raises, one event at a time (``pipeline.fastpath``); the windowed
# path raises them too, with the same ``alert_id``.
FAST_PATH_TYPES = c.PER_EVENT_ALERT_TYPES
FAST_FIRST = "fast path"
WINDOWED_FIRST = "windowed"


def read_fast_path(
    lake_root: str,
    *,
    since: datetime | None = None,
    until: datetime | None = None,
    alert_ids: Sequence[str] | None = None,
) -> pl.DataFrame:
    """Per alert whose window starts in ``[since, until)`` (as ``read_alerts`` bounds alerts):
    ``alert_id``, ``fast_published_at`` (the fast path's first message) and ``fast_messages``.

    Empty when the lake has no ``fast_alerts`` table (the fast path off, or an older lake).
    """
    where = _and(time_filter("window_start", since, until), in_filter("alert_id", alert_ids))
    frame = read_table(
        lake_root, lake.FAST_ALERTS, columns=["alert_id", "published_at"], where=where
    )
    return frame.group_by("alert_id").agg(
        pl.col("published_at").min().alias("fast_published_at"),
        pl.len().cast(pl.Int64).alias("fast_messages"),
    )


def with_first_path(alerts: pl.DataFrame, fast: pl.DataFrame) -> pl.DataFrame:
    """Alerts (with ``detected_at``) plus ``read_fast_path``'s columns (``fast_messages`` 0 when
    none), ``fast_lead_s`` (how long before ``detected_at`` the fast path published it; negative
    when after) and ``first_by``: ``FAST_FIRST`` when the fast path was earlier, else
    ``WINDOWED_FIRST``."""
    lead = (pl.col("detected_at") - pl.col("fast_published_at")).dt.total_microseconds() / 1e6
    return (
        alerts.join(fast, on="alert_id", how="left", maintain_order="left")
        .with_columns(pl.col("fast_messages").fill_null(0), lead.alias("fast_lead_s"))
        .with_columns(
            pl.when(pl.col("fast_lead_s") > 0)
            .then(pl.lit(FAST_FIRST))
            .otherwise(pl.lit(WINDOWED_FIRST))
            .alias("first_by")
        )
    )


def first_by_sentence(alert: dict[str, Any]) -> str:
    """Which path raised ``alert`` (a ``with_first_path`` row) first, and by how long."""
    messages = int(alert.get("fast_messages") or 0)
    if not messages:
        return "Raised by the windowed path (no fast-path message)"
    count = f"{messages} fast message{'' if messages == 1 else 's'}"
    lead = alert.get("fast_lead_s")
    if lead is None:
        return f"Which path raised it first is not recorded ({count})"
    if lead > 0:
        return f"Raised first by the fast path, {lead:.1f} s before the windowed path ({count})"
    return f"Raised first by the windowed path, {abs(lead):.1f} s before the fast path ({count})"


def time_bucket(since: datetime | None, until: datetime | None) -> str:
    """A polars ``truncate`` interval giving roughly 30 to 100 bars between the bounds."""
    if since is None or until is None:
        return "1h"
    span = (until - since).total_seconds()
    for every, seconds in (("1m", 60), ("5m", 300), ("15m", 900), ("1h", 3600), ("6h", 21600)):
        if span / seconds <= 100:
            return every
    return "1d"


def timeline_bucket(
    alerts: pl.DataFrame, since: datetime | None, until: datetime | None, now: datetime
) -> str:
    """The ``time_bucket`` for a chart of ``alerts`` in ``[since, until)`` (open: up to ``now``).

    Sized to the alerts' own span within the range, so a quiet day still shows readable bars.
    """
    first = alerts.select(pl.col("window_start").min()).item()
    start = first if since is None or (first is not None and first > since) else since
    return time_bucket(start, until or now)


def alert_timeline(alerts: pl.DataFrame, by: str, every: str) -> pl.DataFrame:
    """Alert counts per ``every`` bucket (``time`` to ``end``) of ``window_start`` and ``by``."""
    return (
        alerts.filter(pl.col("window_start").is_not_null())
        .group_by(pl.col("window_start").dt.truncate(every).alias("time"), by)
        .agg(pl.len().alias("alerts"))
        .with_columns(pl.col("time").dt.offset_by(every).alias("end"))
        .sort("time", by)
    )


def feedback_quality(alerts: pl.DataFrame) -> pl.DataFrame:
    """Per model version (``rules`` when none): reviewed alerts and analyst-confirmed precision.

    Input: ``with_feedback`` output.
    """
    reviewed = alerts.filter(pl.col("verdict").is_not_null())
    return (
        reviewed.group_by(pl.col("model_version").fill_null("rules"))
        .agg(
            pl.len().alias("reviewed"),
            (pl.col("verdict") == "true_positive").sum().alias("true_positive"),
        )
        .with_columns((pl.col("true_positive") / pl.col("reviewed")).alias("precision"))
        .sort("model_version")
    )


# --- Fleet and telemetry -------------------------------------------------------------------------
def read_devices(lake_root: str, device_ids: Sequence[str] | None = None) -> pl.DataFrame:
    """The registry, one row per device (its latest ``updated_at``)."""
    frame = read_table(lake_root, lake.DEVICES, where=in_filter("device_id", device_ids))
    if frame.is_empty() or "updated_at" not in frame.columns:
        return frame
    return (
        frame.sort("updated_at", nulls_last=False)
        .group_by("device_id", maintain_order=True)
        .last()
        .sort("device_id")
    )


def read_telemetry(
    lake_root: str,
    device_id: str,
    *,
    since: datetime | None = None,
    until: datetime | None = None,
    columns: Sequence[str] | None = None,
) -> pl.DataFrame:
    """One device's events with ``event_time`` in ``[since, until)``, in time order."""
    where = _and(in_filter("device_id", [device_id]), time_filter("event_time", since, until))
    frame = read_table(lake_root, lake.TELEMETRY, columns=columns, where=where)
    return frame.sort("event_time") if "event_time" in frame.columns else frame


def firmware_reported(events: pl.DataFrame, expected: str | None) -> pl.DataFrame:
    """The firmware versions ``events`` (``read_telemetry`` rows with ``firmware``) report, in
    the order they first appear: readings, first and last event time, and whether it is the
    registry's ``expected`` one (null when the registry expects none). A reading without a
    firmware is its own row, firmware null."""
    return (
        events.group_by("firmware")
        .agg(
            pl.len().alias("readings"),
            pl.col("event_time").min().alias("first_seen"),
            pl.col("event_time").max().alias("last_seen"),
        )
        .with_columns(
            (pl.col("firmware") == expected if expected is not None else pl.lit(None))
            .cast(pl.Boolean)
            .alias("registry_expects")
        )
        .sort("first_seen", "firmware", nulls_last=True)
    )


def last_positions(
    lake_root: str,
    device_ids: Sequence[str],
    since: datetime | None = None,
    until: datetime | None = None,
) -> pl.DataFrame:
    """``device_id, lat, lon, event_time`` of each device's latest event with a position."""
    if not device_ids:
        return empty_frame(c.TELEMETRY_COLUMNS, ["device_id", "lat", "lon", "event_time"])
    where = _and(
        in_filter("device_id", device_ids),
        time_filter("event_time", since, until),
        pl.col("lat").is_not_null() & pl.col("lon").is_not_null(),
    )
    frame = read_table(
        lake_root, lake.TELEMETRY, columns=["device_id", "lat", "lon", "event_time"], where=where
    )
    return frame.sort("event_time").group_by("device_id", maintain_order=True).last()


def devices_reporting(lake_root: str, since: datetime | None, until: datetime | None = None) -> int:
    """Distinct devices with at least one event in ``[since, until)``."""
    return _count(lake_root, lake.TELEMETRY, time_filter("event_time", since, until),
                  pl.col("device_id").drop_nulls().n_unique())  # fmt: skip


def count_quarantined(
    lake_root: str, since: datetime | None = None, until: datetime | None = None
) -> int:
    """Quarantined records whose ingest time is in ``[since, until)``."""
    return count_rows(lake_root, lake.QUARANTINE, time_filter("ingest_time", since, until))


def count_rows(lake_root: str, table: str, where: pl.Expr | None = None) -> int:
    """Rows of ``table`` matching ``where`` (0 when the table does not exist)."""
    return _count(lake_root, table, where, pl.len())


def _count(lake_root: str, table: str, where: pl.Expr | None, count: pl.Expr) -> int:
    scan = _scan(lake_root, table)
    if scan is None:
        return 0
    if where is not None:
        scan = scan.filter(where)
    return int(scan.select(count).collect().item())


def read_features(
    lake_root: str,
    device_id: str,
    *,
    window_start: datetime | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
) -> pl.DataFrame:
    """One device's windows, the one starting at ``window_start`` or a time range: each
    window's final row from ``features`` once closed, else its latest row from
    ``feature_changes`` (a window still open, such as the one of a fresh rule alert)."""
    exact = (
        pl.col("window_start") == pl.lit(_utc(window_start), UTC_POLARS) if window_start else None
    )
    where = _and(
        in_filter("device_id", [device_id]), exact, time_filter("window_start", since, until)
    )
    closed = read_table(lake_root, lake.FEATURES, where=where)
    changes = read_table(lake_root, lake.FEATURE_CHANGES, where=where)
    if "batch_id" in changes.columns and changes.height:
        still_open = (
            changes.sort("batch_id")
            .unique(["device_id", "window_start"], keep="last", maintain_order=True)
            .drop("batch_id")
        )
        if closed.height:
            still_open = still_open.join(closed, on=["device_id", "window_start"], how="anti")
        closed = (
            pl.concat([closed, still_open], how="diagonal_relaxed") if closed.height else still_open
        )
    return closed.sort("window_start") if "window_start" in closed.columns else closed


def as_field_table(row: dict[str, Any]) -> pl.DataFrame:
    """A record shown as ``field, value`` rows, values as text (never rendered as markup)."""
    return pl.DataFrame(
        {"field": list(row), "value": [_as_text(v) for v in row.values()]},
        schema={"field": pl.String, "value": pl.String},
    )


def _as_text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return "" if math.isnan(value) else f"{value:.4g}"
    if isinstance(value, datetime):
        return value.isoformat(sep=" ", timespec="seconds")
    if isinstance(value, (list, tuple)):
        return "; ".join(_as_text(v) for v in value)
    return str(value)


def downsample(
    frame: pl.DataFrame, time_column: str, max_points: int = 1500, by: str | None = None
) -> pl.DataFrame:
    """Means of the numeric columns over equal time buckets, so a chart gets at most about
    ``max_points`` points per ``by`` group; small frames are returned as they are."""
    groups = frame[by].n_unique() if by else 1
    if frame.height <= max_points * max(groups, 1):
        return frame
    span_s = frame.select(
        (pl.col(time_column).max() - pl.col(time_column).min()).dt.total_seconds()
    )
    every = max(1, math.ceil(float(span_s.item()) / max_points))
    numeric = [n for n, t in frame.schema.items() if t.is_numeric() and n != by]
    return (
        frame.sort(time_column)
        .group_by_dynamic(time_column, every=f"{every}s", group_by=by)
        .agg(pl.col(numeric).mean())
        .sort(time_column)
    )


def map_points(
    devices: pl.DataFrame,
    alerts: pl.DataFrame,
    positions: pl.DataFrame,
    silent: pl.DataFrame | None = None,
    now: datetime | None = None,
) -> pl.DataFrame:
    """One point per device to draw: registered sites plus alerted devices not in the registry.

    ``silent``: ``silent_now``'s devices (none when None), whatever ``alerts``' time range.

    Output: ``device_id, device_type, lat, lon, registered, alerts, worst_severity,
    silent_since`` and ``silence`` ("silent since 14:05 UTC", see ``since_text``; null for a
    device not silent now); devices with no known position are left out.
    """
    if silent is None:
        silent = pl.DataFrame(schema={"device_id": pl.String, "silent_since": UTC_POLARS})
    silences = silent.select("device_id", "silent_since").with_columns(
        ("silent since " + since_text(pl.col("silent_since"), now or utcnow())).alias("silence")
    )
    counts = alerts.group_by("device_id").agg(
        pl.len().alias("alerts"),
        pl.col("severity")
        .replace_strict(SEVERITY_RANK, default=-1, return_dtype=pl.Int64)
        .max()
        .alias("_rank"),
    )
    sites = devices.select(
        "device_id",
        "device_type",
        pl.col("site_lat").alias("lat"),
        pl.col("site_lon").alias("lon"),
        pl.lit(True).alias("registered"),
    )
    unknown = positions.join(sites.select("device_id"), on="device_id", how="anti").select(
        "device_id",
        pl.lit(None, pl.String).alias("device_type"),
        "lat",
        "lon",
        pl.lit(False).alias("registered"),
    )
    names = list(c.SEVERITIES)
    return (
        pl.concat([sites, unknown], how="vertical_relaxed")
        .join(counts, on="device_id", how="left")
        .with_columns(
            pl.col("alerts").fill_null(0),
            pl.col("_rank")
            .map_elements(lambda r: names[r] if 0 <= r < len(names) else None, pl.String)
            .alias("worst_severity"),
        )
        .drop("_rank")
        .join(silences, on="device_id", how="left")
        .filter(pl.col("lat").is_not_null() & pl.col("lon").is_not_null())
    )


# --- Silent devices (``pipeline.silence``) ------------------------------------------------------
# A ``device_silent`` alert runs from the device's last reading (``first_event_time``) to the time
# it was heard from again (``window_end``): null while it is still silent.
DEVICE_SILENT = "device_silent"
SILENCE_COLUMNS = (
    "alert_id", "device_id", "alert_type", "window_start", "window_end", "first_event_time",
    "last_event_time", "status",
)  # fmt: skip
# What an ongoing silence's missing ``window_end`` reads as.
STILL_SILENT = "still silent"
# A silence that began longer ago than this is labelled with its date too, not only its time.
TIME_ONLY_WITHIN = timedelta(hours=12)
# A device's ``status`` in the registry once it is taken out of service.
RETIRED = "retired"


def read_silences(lake_root: str) -> pl.DataFrame:
    """Every ``device_silent`` alert (``SILENCE_COLUMNS``), whatever its window and status: a
    device silent for days is silent now, whatever the page's time range."""
    return read_alerts(
        lake_root, alert_types=[DEVICE_SILENT], columns=SILENCE_COLUMNS, withdrawn=True
    )


def silent_now(silences: pl.DataFrame, devices: pl.DataFrame) -> pl.DataFrame:
    """The registered devices silent now, one row each: ``device_id, silent_since, alert_id``,
    the longest silent first.

    A device is silent now when it has a standing ``device_silent`` alert (status raised, or
    null in rows written before the column existed; not withdrawn) that has not ended: no row
    of that alert has a ``window_end``. ``silent_since`` is the device's last reading
    (``first_event_time``, else the window start); of two such alerts, the later one's (the
    device was heard from at that reading). Alerts of other types, and devices not in
    ``devices`` (the registry) or retired there, are left out: the silence query follows active
    devices only, and ends a silence when its device is retired.

    Input: alert rows with ``SILENCE_COLUMNS`` (``status`` and ``first_event_time`` may be
    missing, as in a lake written before them).
    """
    silences = _with_alert_columns(silences, SILENCE_COLUMNS)
    if "status" in devices.columns:
        devices = devices.filter(pl.col("status").ne_missing(RETIRED))
    registered = devices.select(pl.col("device_id").cast(pl.String)).unique()
    return (
        silences.filter(pl.col("alert_type") == DEVICE_SILENT)
        .filter(pl.col("window_end").is_null().all().over("alert_id"))
        .filter(pl.col("status").ne_missing(c.ALERT_WITHDRAWN) & pl.col("device_id").is_not_null())
        .join(registered, on="device_id", how="semi")
        .select(
            "device_id",
            pl.coalesce("first_event_time", "window_start").alias("silent_since"),
            "alert_id",
        )
        .sort("silent_since", "alert_id", nulls_last=False)
        .group_by("device_id", maintain_order=True)
        .last()
        .sort("silent_since", "device_id", nulls_last=True)
    )


def _with_alert_columns(frame: pl.DataFrame, names: Sequence[str]) -> pl.DataFrame:
    """``frame`` with the ``alerts`` columns ``names`` it lacks added as nulls of their type."""
    missing = empty_frame(c.ALERTS_COLUMNS, [n for n in names if n not in frame.columns])
    return frame.with_columns(pl.lit(None, dtype).alias(n) for n, dtype in missing.schema.items())


def since_text(since: pl.Expr, now: datetime) -> pl.Expr:
    """``14:05 UTC``, or ``2026-11-25 14:05 UTC`` for a time ``TIME_ONLY_WITHIN`` or longer
    before ``now`` (a time alone would read as today's)."""
    recent = since > pl.lit(now - TIME_ONLY_WITHIN, UTC_POLARS)
    text = (
        pl.when(recent)
        .then(since.dt.strftime("%H:%M"))
        .otherwise(since.dt.strftime("%Y-%m-%d %H:%M"))
    )
    return text + " UTC"


def is_ongoing_silence(alert: dict[str, Any]) -> bool:
    """Whether ``alert`` (a row of ``alerts``) is a silence that has not ended."""
    return alert.get("alert_type") == DEVICE_SILENT and alert.get("window_end") is None


def alert_end(alert: dict[str, Any], now: datetime) -> datetime | None:
    """Where ``alert``'s window ends on a chart: its ``window_end``; ``now`` for a silence that
    has not ended; else its start (a window with no end recorded)."""
    if alert.get("window_end") is not None:
        end: datetime = alert["window_end"]
        return end
    return now if is_ongoing_silence(alert) else alert.get("window_start")


def duration_text(span: timedelta) -> str:
    """``45 s``, ``4 min 10 s``, ``2 h 5 min``, ``3 d 4 h``: the two largest units, rounded down,
    a second one of 0 left out (``4 min``), as the silence query's reasons write them."""
    seconds = max(0, int(span.total_seconds()))
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, seconds = divmod(rest, 60)
    for big, big_unit, small, small_unit in (
        (days, "d", hours, "h"),
        (hours, "h", minutes, "min"),
        (minutes, "min", seconds, "s"),
    ):
        if big:
            return f"{big} {big_unit} {small} {small_unit}" if small else f"{big} {big_unit}"
    return f"{seconds} s"


def silence_sentence(alert: dict[str, Any], now: datetime) -> str | None:
    """How long a ``device_silent`` alert's device was or is silent; None for other types."""
    if alert.get("alert_type") != DEVICE_SILENT:
        return None
    since: datetime | None = alert.get("first_event_time") or alert.get("window_start")
    end: datetime | None = alert.get("window_end")
    if since is None:
        return "Still silent" if end is None else f"Heard from again at {end:%Y-%m-%d %H:%M:%S} UTC"
    if end is None:
        return (
            f"Still silent: no reading since {since:%Y-%m-%d %H:%M:%S} UTC "
            f"({duration_text(now - since)})"
        )
    return (
        f"Silent for {duration_text(end - since)}: no reading from {since:%Y-%m-%d %H:%M:%S} "
        f"until {end:%Y-%m-%d %H:%M:%S} UTC"
    )


def alert_field_table(alert: dict[str, Any]) -> pl.DataFrame:
    """``as_field_table`` of an alert without its reasons (shown apart); an ongoing silence's
    missing ``window_end`` reads ``STILL_SILENT``."""
    fields = {k: v for k, v in alert.items() if k != "reasons"}
    if is_ongoing_silence(alert):
        fields["window_end"] = STILL_SILENT
    return as_field_table(fields)


# --- Pipeline health and evaluation --------------------------------------------------------------
def read_pipeline_metrics(
    lake_root: str, since: datetime | None = None, until: datetime | None = None
) -> pl.DataFrame:
    """Micro-batch progress in time order, with ``watermark_lag_s`` (batch time - watermark).

    Before a query has a watermark both are null, also in rows an earlier release wrote with
    the epoch or near it (before ``EARLIEST_WATERMARK``): missing, not a lag.
    """
    where = time_filter("timestamp", since, until)
    frame = read_table(lake_root, lake.PIPELINE_METRICS, where=where)
    lag = (pl.col("timestamp") - pl.col("watermark")).dt.total_milliseconds() / 1000.0
    return (
        frame.sort("timestamp")
        .with_columns(pl.when(pl.col("watermark") >= EARLIEST_WATERMARK).then(pl.col("watermark")))
        .with_columns(lag.alias("watermark_lag_s"))
    )


def ingest_rate(metrics: pl.DataFrame, query: str) -> float | None:
    """Input rows/s of the latest batch of ``query`` (any query when it has no rows)."""
    rows = metrics.filter(pl.col("query_name") == query)
    if rows.is_empty():
        rows = metrics
    rows = rows.drop_nulls("input_rows_per_second")
    if rows.is_empty():
        return None
    return float(rows.sort("timestamp")["input_rows_per_second"][-1])


def watermark_lag(metrics: pl.DataFrame) -> float | None:
    """The largest watermark lag among the queries' latest batches: each query as it is now. A
    query whose latest batch has no watermark (just restarted, or stateless) has no lag, not an
    older batch's."""
    if metrics.is_empty():
        return None
    latest = metrics.sort("timestamp").group_by("query_name").last()["watermark_lag_s"]
    return None if latest.null_count() == latest.len() else float(latest.max())  # type: ignore[arg-type]


# The health page's "Latest batch per query": what an engineer reads there, in that order. The
# run id and the Kafka offsets (a JSON object per topic) are for tools, and too wide to read.
LATEST_BATCH_COLUMNS = {
    "query_name": "query",
    "batch_id": "batch",
    "timestamp": "started",
    "batch_duration_ms": "duration_ms",
    "num_input_rows": "input_rows",
    "input_rows_per_second": "input_rows_per_s",
    "watermark_lag_s": "watermark_lag_s",
    "state_rows": "state_rows",
    "late_rows_dropped": "late_rows_dropped",
}


def latest_batches(metrics: pl.DataFrame) -> pl.DataFrame:
    """Each query's latest batch (``read_pipeline_metrics`` rows), in ``LATEST_BATCH_COLUMNS``,
    by query name."""
    latest = metrics.sort("timestamp").group_by("query_name", maintain_order=True).last()
    return latest.sort("query_name").select(
        pl.col(name).alias(shown) for name, shown in LATEST_BATCH_COLUMNS.items()
    )


def quarantine_by_reason(
    lake_root: str, since: datetime | None = None, until: datetime | None = None
) -> pl.DataFrame:
    """``reason, records`` of the quarantine in ``[since, until)`` (ingest time), most first."""
    frame = read_table(
        lake_root,
        lake.QUARANTINE,
        columns=["reason"],
        where=time_filter("ingest_time", since, until),
    )
    return (
        frame.group_by("reason")
        .agg(pl.len().cast(pl.Int64).alias("records"))
        .sort(["records", "reason"], descending=[True, False])
    )


def latest_evaluation(lake_root: str) -> pl.DataFrame:
    """The rows of the most recent ``evaluation`` run, one per scenario."""
    frame = read_table(lake_root, lake.EVALUATION)
    if frame.is_empty():
        return frame
    return frame.filter(pl.col("evaluated_at") == pl.col("evaluated_at").max()).sort("scenario")


# --- Model registry ------------------------------------------------------------------------------
@dataclass(frozen=True)
class ModelInfo:
    """The champion version of a registered model and the metrics of the run that made it."""

    name: str
    version: str
    run_id: str
    created_at: datetime | None
    aliases: tuple[str, ...] = ()
    metrics: dict[str, float] = field(default_factory=dict)
    params: dict[str, str] = field(default_factory=dict)


def champion(tracking_uri: str, model_name: str, alias: str = "champion") -> ModelInfo | None:
    """The version of ``model_name`` carrying ``alias``; None when there is no store or model.

    A local SQLite store that does not exist is not created (reading must not write).
    """
    if missing_store(tracking_uri) is not None:
        return None
    import mlflow
    from mlflow.exceptions import MlflowException

    client = mlflow.MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)
    version = aliased_version(client, model_name, alias)
    if version is None:
        log.info("no %s@%s in %s", model_name, alias, tracking_uri)
        return None
    metrics: dict[str, float] = {}
    params: dict[str, str] = {}
    if version.run_id:
        try:
            run = client.get_run(version.run_id)
            metrics, params = dict(run.data.metrics), dict(run.data.params)
        except MlflowException as exc:
            log.info("run %s of %s is gone: %s", version.run_id, model_name, exc)
    created = (
        datetime.fromtimestamp(version.creation_timestamp / 1000, timezone.utc)
        if version.creation_timestamp
        else None
    )
    return ModelInfo(
        name=model_name,
        version=str(version.version),
        run_id=version.run_id or "",
        created_at=created,
        aliases=tuple(version.aliases or ()),
        metrics=metrics,
        params=params,
    )


def lookback(hours: float | None, now: datetime | None = None) -> datetime | None:
    """The start of a range of ``hours`` ending ``now`` (None: no lower bound)."""
    if hours is None:
        return None
    return (now or utcnow()) - timedelta(hours=hours)
