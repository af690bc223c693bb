"""The pages' reads of the lake, cached for one refresh interval and shared by every open tab.

Each read is cached with ``st.cache_data`` for ``IOT_DASH_REFRESH_SECONDS``: the same read from
any tab within that time is answered from memory, and the first one after it reads the table
again. A page refreshes every interval too, so a change in the lake shows within two intervals
at most ("Data as of" says how old a page's reads are). Time ranges enter the cache key as
``data.TimeRange`` (a relative one by its length), so "the last hour" stays the same read while
the clock moves. A saved verdict makes the verdict read a new one.

The pages see the frames of ``dashboard.data``; the moment of the oldest read behind a page is
kept for ``ui.updated_caption`` ("Data as of").
"""

from __future__ import annotations

import functools
import itertools
import logging
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

import polars as pl
import streamlit as st

from dashboard import data
from dashboard.settings import DashboardSettings

log = logging.getLogger(__name__)

READ_AT_KEY = "oldest_read_at"
# Entries expire after one interval, so this bounds only a burst of different reads.
MAX_ENTRIES = 256
# Verdicts saved in this process: part of the key of the verdict read, so a save makes the next
# read a new one (a read that was running meanwhile cannot bring the old verdicts back).
_verdicts_saved = itertools.count(1)
_feedback_generation = [0]


def _read(
    lake_root: str,
    name: str,
    *,
    span: data.TimeRange | None,
    args: tuple[Any, ...],
    kwargs: tuple[tuple[str, Any], ...],
    generation: int,
) -> tuple[datetime, Any]:
    """When it ran, and ``data.<name>(lake_root, *args, **kwargs)`` with ``since`` and ``until``
    of ``span`` resolved now; a function of its arguments only, so that st.cache_data can key
    on them (a relative range by its length: "the last hour" stays the same read). A new
    ``generation`` is a new read."""
    now = data.utcnow()
    bounds = {} if span is None else dict(zip(("since", "until"), span.bounds(now), strict=True))
    return now, getattr(data, name)(lake_root, *args, **dict(kwargs), **bounds)


@functools.cache
def _cached(ttl_s: float) -> Callable[..., tuple[datetime, Any]]:
    cached: Callable[..., tuple[datetime, Any]] = st.cache_data(
        ttl=ttl_s, max_entries=MAX_ENTRIES, show_spinner=False
    )(_read)
    return cached


def _run(
    settings: DashboardSettings,
    name: str,
    *args: Any,
    span: data.TimeRange | None = None,
    generation: int = 0,
    **kwargs: Any,
) -> Any:
    """``data.<name>`` (see ``_read``), from the cache when the same read ran less than an
    interval ago in any tab."""
    read = _cached(settings.refresh_seconds)
    key = tuple(sorted(kwargs.items()))
    read_at, value = read(settings.lake_root, name, span=span, args=args, kwargs=key,
                          generation=generation)  # fmt: skip
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


def feedback_saved() -> None:
    """A verdict was saved: the next read of verdicts, in this tab at once and in the others at
    their next refresh, reads the table again."""
    _feedback_generation[0] = next(_verdicts_saved)


# --- The reads the pages make ----------------------------------------------------------------
def alerts(
    settings: DashboardSettings, span: data.TimeRange = data.ALL_TIME, **filters: Any
) -> pl.DataFrame:
    """``data.read_alerts`` over ``span``; ``filters`` are its keyword arguments."""
    frame: pl.DataFrame = _run(settings, "read_alerts", span=span, **filters)
    return frame


def fast_path(
    settings: DashboardSettings,
    span: data.TimeRange = data.ALL_TIME,
    alert_ids: Sequence[str] | None = None,
) -> pl.DataFrame:
    """``data.read_fast_path`` over ``span``: per alert, the fast path's first message and count."""
    frame: pl.DataFrame = _run(settings, "read_fast_path", span=span, alert_ids=alert_ids)
    return frame


def feedback(settings: DashboardSettings) -> pl.DataFrame:
    """``data.read_feedback``: the latest verdict per alert."""
    frame: pl.DataFrame = _run(settings, "read_feedback", generation=_feedback_generation[0])
    return frame


def silences(settings: DashboardSettings) -> pl.DataFrame:
    """``data.read_silences``: every ``device_silent`` alert, whatever the time range."""
    frame: pl.DataFrame = _run(settings, "read_silences")
    return frame


def silent_devices(settings: DashboardSettings) -> pl.DataFrame:
    """``data.silent_now``: the registered devices silent now, whatever the time range."""
    return data.silent_now(silences(settings), devices(settings))


def devices(settings: DashboardSettings) -> pl.DataFrame:
    """``data.read_devices``: the registry."""
    frame: pl.DataFrame = _run(settings, "read_devices")
    return frame


def telemetry(
    settings: DashboardSettings,
    device_id: str,
    span: data.TimeRange,
    columns: Sequence[str] | None = None,
) -> pl.DataFrame:
    """``data.read_telemetry``: one device's events in ``span``."""
    frame: pl.DataFrame = _run(settings, "read_telemetry", device_id, span=span, columns=columns)
    return frame


def last_positions(
    settings: DashboardSettings, device_ids: Sequence[str], span: data.TimeRange
) -> pl.DataFrame:
    """``data.last_positions`` of ``device_ids`` in ``span``."""
    frame: pl.DataFrame = _run(settings, "last_positions", device_ids, span=span)
    return frame


def devices_reporting(settings: DashboardSettings, span: data.TimeRange) -> int:
    """``data.devices_reporting`` in ``span``."""
    return int(_run(settings, "devices_reporting", span=span))


def quarantined(settings: DashboardSettings, span: data.TimeRange) -> int:
    """``data.count_quarantined``: rejected records whose ingest time is in ``span``."""
    return int(_run(settings, "count_quarantined", span=span))


def quarantine_by_reason(settings: DashboardSettings, span: data.TimeRange) -> pl.DataFrame:
    """``data.quarantine_by_reason`` in ``span``."""
    frame: pl.DataFrame = _run(settings, "quarantine_by_reason", span=span)
    return frame


def features(
    settings: DashboardSettings, device_id: str, window_start: datetime | None
) -> pl.DataFrame:
    """``data.read_features`` of one device's window."""
    frame: pl.DataFrame = _run(settings, "read_features", device_id, window_start=window_start)
    return frame


def pipeline_metrics(settings: DashboardSettings, span: data.TimeRange) -> pl.DataFrame:
    """``data.read_pipeline_metrics`` in ``span``."""
    frame: pl.DataFrame = _run(settings, "read_pipeline_metrics", span=span)
    return frame


def latest_evaluation(settings: DashboardSettings) -> pl.DataFrame:
    """``data.latest_evaluation``: the newest evaluation run."""
    frame: pl.DataFrame = _run(settings, "latest_evaluation")
    return frame
