"""Widgets and charts the pages share: settings, the time range, empty states, tables, charts.

Field values are only ever shown through ``st.dataframe``, ``st.text``, ``st.metric`` values and
chart data, which render text; never through Markdown or HTML.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from datetime import time as dt_time
from typing import Any

import altair as alt
import polars as pl
import streamlit as st

from dashboard import data, login, reads
from dashboard.settings import DashboardSettings
from infra import contract as c
from infra.settings import load_settings

log = logging.getLogger(__name__)

# label -> hours (None: everything); the sidebar's time range applies to every page.
RANGES: dict[str, float | None] = {
    "Last 15 minutes": 0.25,
    "Last hour": 1.0,
    "Last 6 hours": 6.0,
    "Last 24 hours": 24.0,
    "Last 7 days": 168.0,
    "All time": None,
}
CUSTOM = "Custom dates"
RANGE_KEY = "time_range"
DATES_KEY = "custom_dates"
DEVICE_KEY = "device_id"
ALERT_KEY = "device_alert_id"
FLASH_KEY = "flash"
SEVERITY_COLORS = {"low": "#f2c94c", "medium": "#f2994a", "high": "#eb5757", "critical": "#8b0000"}


def get_settings() -> DashboardSettings:
    """The settings, from the environment (cheap, so read on every run rather than cached)."""
    return load_settings(DashboardSettings)


def range_picker(settings: DashboardSettings) -> None:
    """The sidebar's time range; its default is the range closest to ``lookback_hours``."""
    labels = [*RANGES, CUSTOM]
    default = min(
        (label for label in RANGES if RANGES[label] is not None),
        key=lambda label: abs((RANGES[label] or 0.0) - settings.lookback_hours),
    )
    choice = st.sidebar.selectbox("Time range", labels, index=labels.index(default), key=RANGE_KEY)
    if choice == CUSTOM:
        today = data.utcnow().date()
        st.sidebar.date_input(
            "Dates (UTC)", value=(today - timedelta(days=1), today), key=DATES_KEY
        )


def time_window() -> data.TimeRange:
    """The selected range. Relative ranges have no upper bound, so events stamped slightly in the
    future (device clock skew) are not hidden; custom dates cover whole UTC days."""
    label = st.session_state.get(RANGE_KEY) or "Last 24 hours"
    if label == CUSTOM:
        dates = tuple(st.session_state.get(DATES_KEY) or ())
        if dates:
            first, last = dates[0], dates[-1]
            since = datetime.combine(first, dt_time(0), timezone.utc)
            until = datetime.combine(last, dt_time(0), timezone.utc) + timedelta(days=1)
            return data.TimeRange(since=since, until=until)
        label = "Last 24 hours"
    return data.TimeRange(hours=RANGES.get(label, 24.0))


def refreshing(settings: DashboardSettings, body: Callable[[], None]) -> None:
    """Run ``body`` as a fragment that reruns itself every ``refresh_seconds``, alone.

    A fragment's rerun skips the sign-in gate: once the session has been idle too long, it
    reruns the whole app instead, which signs the analyst out, so an idle tab stops receiving
    data."""

    def run() -> None:
        if login.signed_in_analyst() is not None and login.session_expired(settings):
            st.rerun(scope="app")
        reads.start_run()
        body()

    st.fragment(run, run_every=settings.refresh_seconds)()


def updated_caption(settings: DashboardSettings) -> None:
    """When the page's data was read (its oldest read: reads are cached for an interval)."""
    read_at = reads.oldest_read() or data.utcnow()
    st.caption(f"Data as of {read_at:%H:%M:%S} UTC, refreshed every {settings.refresh_seconds:g} s")


def empty_state(what: str, table: str) -> None:
    st.info(f"No {what} yet: the `{table}` table is empty or does not exist for this range.")


# Pixels per table row (and header), fixed: the browser test clicks rows by position.
ROW_HEIGHT = 35


def show_table(
    frame: pl.DataFrame,
    *,
    key: str | None = None,
    height: int | None = None,
    selectable: bool = False,
) -> None:
    """A read-only table; lists are joined into one text cell so every value reads as text.

    ``selectable``: a click selects one row or cell (state: ``st.session_state[key]``).
    """
    shown = frame.with_columns(
        pl.col(name).list.join("; ")
        for name, dtype in frame.schema.items()
        if dtype == pl.List(pl.String)
    )
    kwargs: dict[str, Any] = {
        "hide_index": True,
        "width": "stretch",
        "row_height": ROW_HEIGHT,
        "column_config": {
            name: st.column_config.DatetimeColumn(name, format="YYYY-MM-DD HH:mm:ss")
            for name, dtype in frame.schema.items()
            if isinstance(dtype, pl.Datetime)
        },
    }
    if height is not None:
        kwargs["height"] = height
    if key is not None:
        kwargs["key"] = key
    if selectable:
        # A click on a cell selects that cell: ``select_row`` takes it as a click on its row.
        kwargs.update(on_select="rerun", selection_mode=["single-row", "single-cell"])
    st.dataframe(shown.to_pandas(), **kwargs)


def select_row(
    frame: pl.DataFrame, *, key: str, id_column: str, selected: str | None, height: int | None
) -> str | None:
    """A table in which a click on a row (its box or any cell) selects it; the id clicked in this
    run, if it is not ``selected``.

    The row of ``selected`` is highlighted. A selection is a row position, and rows move as new
    data arrives: a click is read against the ids of the table as it was drawn, and the
    highlight is moved to wherever ``selected`` is now. A click on the highlighted row's box
    (which would clear it) keeps it.
    """
    drawn_key = f"{key}_drawn"
    drawn_ids, drawn_rows = st.session_state.get(drawn_key, ([], []))
    state = st.session_state.get(key)
    rows = list(state["selection"]["rows"]) if state else []
    cells = list(state["selection"]["cells"]) if state else []
    picked = cells[0][0] if cells else rows[0] if rows and rows != drawn_rows else None
    clicked = drawn_ids[picked] if picked is not None and picked < len(drawn_ids) else None
    ids = frame[id_column].to_list()
    target = clicked or selected
    want = [ids.index(target)] if target in ids else []
    if rows != want or cells:
        st.session_state[key] = {"selection": {"rows": want, "columns": [], "cells": []}}
    st.session_state[drawn_key] = (ids, want)
    show_table(frame, key=key, height=height, selectable=True)
    return clicked if clicked != selected else None


def count_bars(timeline: pl.DataFrame, by: str, title: str) -> alt.Chart:
    """Stacked bars of ``alerts`` per bucket (``time`` to ``end``), coloured by ``by``.

    The stack is computed here, not by Vega-Lite, so that bars span their whole bucket.
    """
    present = set(timeline[by].to_list())
    order = [s for s in c.SEVERITIES if s in present] if by == "severity" else sorted(present)
    if by == "severity":
        scale = alt.Scale(domain=order, range=[SEVERITY_COLORS[s] for s in order])
    else:
        scale = alt.Scale(domain=order)
    stacked = (
        timeline.with_columns(
            pl.col(by)
            .replace_strict(order, list(range(len(order))), default=len(order))
            .alias("_o")
        )
        .sort("time", "_o")
        .with_columns(pl.col("alerts").cum_sum().over("time").alias("top"))
        .with_columns((pl.col("top") - pl.col("alerts")).alias("bottom"))
        .drop("_o")
    )
    chart: alt.Chart = (
        alt.Chart(stacked.to_pandas(), title=title)
        .mark_rect(stroke="white", strokeWidth=0.5)
        .encode(
            x=alt.X("time:T", title="window start (UTC)"),
            x2="end:T",
            y=alt.Y("bottom:Q", title="alerts", axis=alt.Axis(tickMinStep=1)),
            y2="top:Q",
            color=alt.Color(f"{by}:N", sort=order, scale=scale),
            tooltip=[
                alt.Tooltip("time:T", title="from"),
                alt.Tooltip("end:T", title="to"),
                f"{by}:N",
                "alerts:Q",
            ],
        )
        .properties(height=260)
    )
    return chart


def lines(
    frame: pl.DataFrame, x: str, y: str, color: str, *, title: str, y_title: str
) -> alt.Chart:
    """A line chart of ``y`` over ``x``, one line per ``color``."""
    chart: alt.Chart = (
        alt.Chart(frame.select(x, y, color).to_pandas(), title=title)
        .mark_line(point=True)
        .encode(
            x=alt.X(f"{x}:T", title="time (UTC)"),
            y=alt.Y(f"{y}:Q", title=y_title),
            color=alt.Color(f"{color}:N"),
            tooltip=[f"{x}:T", f"{color}:N", f"{y}:Q"],
        )
        .properties(height=240)
    )
    return chart


def chart(figure: alt.Chart | alt.LayerChart | alt.FacetChart) -> None:
    st.altair_chart(figure, width="stretch")


def flash() -> None:
    """Show (once) the message a previous action left for the next run."""
    message = st.session_state.pop(FLASH_KEY, None)
    if message:
        st.success("Saved.")
        # The message names the alert: a field value, so it is shown as plain text.
        st.text(str(message))
