"""The pages' reads of the lake, cached for one refresh interval and shared by every open tab.

Each read is cached with ``st.cache_data`` for ``IOT_DASH_REFRESH_SECONDS``: the same read from
any tab within that time is answered from memory, and the first one after it reads the table
again, so a change in the lake shows on the pages at most one interval later. Time ranges enter
the cache key as ``data.TimeRange`` (a relative one by its length), so "the last hour" stays
the same read while the clock moves. A tab's own verdicts clear the feedback read.

The pages see the frames of ``dashboard.data``; the moment of the oldest read behind a page is
kept for ``ui.updated_caption`` ("Data as of").
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, TypeVar, cast

import polars as pl
import streamlit as st

from dashboard import data
from dashboard.settings import DashboardSettings
from infra import lake

log = logging.getLogger(__name__)

T = TypeVar("T")
READ_AT_KEY = "oldest_read_at"
# Per read function. Entries expire after one interval, so this bounds only a burst of reads.
MAX_ENTRIES = 64


@functools.cache
def _cached(read: Callable[..., Any], ttl_s: float) -> Callable[..., Any]:
    cached: Callable[..., Any] = st.cache_data(
        ttl=ttl_s, max_entries=MAX_ENTRIES, show_spinner=False
    )(read)
    return cached


def _run(
    settings: DashboardSettings,
    read: Callable[..., tuple[datetime, T]],
    *args: Any,
    **kwargs: Any,
) -> T:
    """``read(lake_root, *args, **kwargs)``, which returns when it ran and what it read, from the
    cache when the same read ran less than an interval ago."""
    cached = _cached(read, settings.refresh_seconds)
    read_at, value = cast(tuple[datetime, T], cached(settings.lake_root, *args, **kwargs))
    oldest = st.session_state.get(READ_AT_KEY)
    if oldest is None or read_at < oldest:
        st.session_state[READ_AT_KEY] = read_at
    return value


def start_run() -> None:
    """Forget the read times of earlier runs (a page's refresh starts here)."""
    st.session_state.pop(READ_AT_KEY, None)


def oldest_read() -> datetime | None:
    """When the oldest read since ``start_run`` ran: the page shows every change before it."""
    read_at = st.session_state.get(READ_AT_KEY)
    return read_at if isinstance(read_at, datetime) else None


def feedback_saved(settings: DashboardSettings) -> None:
    """Drop the cached verdicts, so that the one just saved shows at once in every tab."""
    _cached(_feedback, settings.refresh_seconds).clear()  # type: ignore[attr-defined]


# --- The reads: each a function of its arguments only, so that st.cache_data can key on them ---
def _alerts(
    lake_root: str,
    span: data.TimeRange,
    *,
    alert_types: Sequence[str] | None,
    severities: Sequence[str] | None,
    device_ids: Sequence[str] | None,
    model_versions: Sequence[str | None] | None,
    alert_ids: Sequence[str] | None,
    columns: Sequence[str] | None,
    withdrawn: bool,
) -> tuple[datetime, pl.DataFrame]:
    now = data.utcnow()
    since, until = span.bounds(now)
    return now, data.read_alerts(
        lake_root,
        since=since,
        until=until,
        alert_types=alert_types,
        severities=severities,
        device_ids=device_ids,
        model_versions=model_versions,
        alert_ids=alert_ids,
        columns=columns,
        withdrawn=withdrawn,
    )


def alerts(
    settings: DashboardSettings,
    span: data.TimeRange = data.ALL_TIME,
    *,
    alert_types: Sequence[str] | None = None,
    severities: Sequence[str] | None = None,
    device_ids: Sequence[str] | None = None,
    model_versions: Sequence[str | None] | None = None,
    alert_ids: Sequence[str] | None = None,
    columns: Sequence[str] | None = None,
    withdrawn: bool = False,
) -> pl.DataFrame:
    """``data.read_alerts`` over ``span``."""
    return _run(
        settings,
        _alerts,
        span,
        alert_types=alert_types,
        severities=severities,
        device_ids=device_ids,
        model_versions=model_versions,
        alert_ids=alert_ids,
        columns=columns,
        withdrawn=withdrawn,
    )


def _feedback(lake_root: str) -> tuple[datetime, pl.DataFrame]:
    return data.utcnow(), data.read_feedback(lake_root)


def feedback(settings: DashboardSettings) -> pl.DataFrame:
    """``data.read_feedback``: the latest verdict per alert."""
    return _run(settings, _feedback)


def _devices(lake_root: str) -> tuple[datetime, pl.DataFrame]:
    return data.utcnow(), data.read_devices(lake_root)


def devices(settings: DashboardSettings) -> pl.DataFrame:
    """``data.read_devices``: the registry."""
    return _run(settings, _devices)


def _telemetry(
    lake_root: str, device_id: str, span: data.TimeRange, columns: Sequence[str] | None
) -> tuple[datetime, pl.DataFrame]:
    now = data.utcnow()
    since, until = span.bounds(now)
    frame = data.read_telemetry(lake_root, device_id, since=since, until=until, columns=columns)
    return now, frame


def telemetry(
    settings: DashboardSettings,
    device_id: str,
    span: data.TimeRange,
    columns: Sequence[str] | None = None,
) -> pl.DataFrame:
    """``data.read_telemetry``: one device's events in ``span``."""
    return _run(settings, _telemetry, device_id, span, columns)


def _last_positions(
    lake_root: str, device_ids: Sequence[str], span: data.TimeRange
) -> tuple[datetime, pl.DataFrame]:
    now = data.utcnow()
    return now, data.last_positions(lake_root, device_ids, *span.bounds(now))


def last_positions(
    settings: DashboardSettings, device_ids: Sequence[str], span: data.TimeRange
) -> pl.DataFrame:
    """``data.last_positions`` of ``device_ids`` in ``span``."""
    return _run(settings, _last_positions, device_ids, span)


def _devices_reporting(lake_root: str, span: data.TimeRange) -> tuple[datetime, int]:
    now = data.utcnow()
    return now, data.devices_reporting(lake_root, *span.bounds(now))


def devices_reporting(settings: DashboardSettings, span: data.TimeRange) -> int:
    """``data.devices_reporting`` in ``span``."""
    return _run(settings, _devices_reporting, span)


def _quarantined(lake_root: str, span: data.TimeRange) -> tuple[datetime, int]:
    now = data.utcnow()
    where = data.time_filter("ingest_time", *span.bounds(now))
    return now, data.count_rows(lake_root, lake.QUARANTINE, where)


def quarantined(settings: DashboardSettings, span: data.TimeRange) -> int:
    """Quarantined records whose ingest time is in ``span``."""
    return _run(settings, _quarantined, span)


def _quarantine_by_reason(lake_root: str, span: data.TimeRange) -> tuple[datetime, pl.DataFrame]:
    now = data.utcnow()
    return now, data.quarantine_by_reason(lake_root, *span.bounds(now))


def quarantine_by_reason(settings: DashboardSettings, span: data.TimeRange) -> pl.DataFrame:
    """``data.quarantine_by_reason`` in ``span``."""
    return _run(settings, _quarantine_by_reason, span)


def _features(
    lake_root: str, device_id: str, window_start: datetime | None
) -> tuple[datetime, pl.DataFrame]:
    return data.utcnow(), data.read_features(lake_root, device_id, window_start=window_start)


def features(
    settings: DashboardSettings, device_id: str, window_start: datetime | None
) -> pl.DataFrame:
    """``data.read_features`` of one device's window."""
    return _run(settings, _features, device_id, window_start)


def _pipeline_metrics(lake_root: str, span: data.TimeRange) -> tuple[datetime, pl.DataFrame]:
    now = data.utcnow()
    return now, data.read_pipeline_metrics(lake_root, *span.bounds(now))


def pipeline_metrics(settings: DashboardSettings, span: data.TimeRange) -> pl.DataFrame:
    """``data.read_pipeline_metrics`` in ``span``."""
    return _run(settings, _pipeline_metrics, span)


def _latest_evaluation(lake_root: str) -> tuple[datetime, pl.DataFrame]:
    return data.utcnow(), data.latest_evaluation(lake_root)


def latest_evaluation(settings: DashboardSettings) -> pl.DataFrame:
    """``data.latest_evaluation``: the newest evaluation run."""
    return _run(settings, _latest_evaluation)
