"""Device: telemetry around an alert, the registry entry and the device's alert history."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

import altair as alt
import polars as pl
import streamlit as st

from dashboard import data, reads, ui
from infra import contract as c
from infra import lake

log = logging.getLogger(__name__)

RANGE_CHOICE = "(the selected time range)"
# Telemetry shown before and after an alert's window, at least this much.
MIN_MARGIN = timedelta(minutes=15)

settings = ui.get_settings()
st.title("Device")

registry = reads.devices(settings)
alerted = reads.alerts(settings, columns=["device_id"])["device_id"].drop_nulls().unique()
device_ids = sorted(set(registry["device_id"].to_list()) | set(alerted.to_list()))
if not device_ids:
    ui.empty_state("devices", lake.DEVICES)
    st.stop()
if st.session_state.get(ui.DEVICE_KEY) not in device_ids:
    st.session_state[ui.DEVICE_KEY] = device_ids[0]
device_id: str = st.selectbox("Device", device_ids, key=ui.DEVICE_KEY)
entry = registry.filter(pl.col("device_id") == device_id)

history = data.with_feedback(
    reads.alerts(settings, device_ids=[device_id]), reads.feedback(settings)
)
labels = {RANGE_CHOICE: RANGE_CHOICE} | {
    row["alert_id"]: f"{row['window_start']:%Y-%m-%d %H:%M} · {row['alert_type']} · "
    f"{row['severity']} · {row['alert_id']}"
    for row in history.iter_rows(named=True)
}
if st.session_state.get(ui.ALERT_KEY) not in labels:
    st.session_state[ui.ALERT_KEY] = next(iter(labels))
around = st.selectbox(
    "Telemetry around", list(labels), format_func=labels.__getitem__, key=ui.ALERT_KEY
)


def telemetry_range(alert: dict[str, Any] | None) -> data.TimeRange:
    """The alert's window with a margin each side, or the sidebar's range."""
    if alert is None or alert["window_start"] is None:
        return ui.time_window()
    start: datetime = alert["window_start"]
    if data.is_ongoing_silence(alert):
        # Still silent: from before its last reading on, with no upper bound (so it stays one
        # cached read while the silence lasts).
        return data.TimeRange(since=start - MIN_MARGIN)
    end: datetime = alert["window_end"] or start
    margin = max(end - start, MIN_MARGIN)
    return data.TimeRange(since=start - margin, until=end + margin)


def metric_chart(
    frame: pl.DataFrame, metric: str, alert: dict[str, Any] | None
) -> alt.LayerChart | alt.FacetChart:
    """One metric over event time, the alert's window shaded."""
    line = (
        alt.Chart(frame.select("event_time", metric).to_pandas())
        .mark_line(point=alt.OverlayMarkDef(size=12))
        .encode(
            x=alt.X("event_time:T", title="event time (UTC)"),
            y=alt.Y(
                f"{metric}:Q", title=metric, scale=alt.Scale(zero=False), axis=alt.Axis(format="~g")
            ),
            tooltip=["event_time:T", f"{metric}:Q"],
        )
    )
    layers: list[alt.Chart] = [line]
    if alert is not None:
        # An ongoing silence's band runs up to now.
        end = data.alert_end(alert, data.utcnow())
        window = pl.DataFrame({"start": [alert["window_start"]], "end": [end]})
        band = (
            alt.Chart(window.to_pandas())
            .mark_rect(opacity=0.15, color="#eb5757")
            .encode(x="start:T", x2="end:T")
        )
        layers.insert(0, band)
    return alt.layer(*layers).properties(height=180, title=metric)


def telemetry() -> None:
    alert = None if around == RANGE_CHOICE else history.filter(pl.col("alert_id") == around)
    alert_row = alert.row(0, named=True) if alert is not None and alert.height else None
    events = reads.telemetry(
        settings, device_id, telemetry_range(alert_row),
        ["event_time", "seq", "firmware", *c.METRICS],
    )  # fmt: skip
    st.subheader("Telemetry")
    if events.is_empty():
        ui.empty_state("telemetry for this device in this range", lake.TELEMETRY)
        return
    shown = [m for m in c.METRICS if events[m].null_count() < events.height]
    st.caption(f"{events.height} events; the shaded band is the alert's window")
    # A window's firmware_mismatch alert counts readings of another firmware; which one is here.
    expected = entry["expected_firmware"][0] if entry.height else None
    ui.show_table(data.firmware_reported(events, expected))
    events = data.downsample(events, "event_time")
    cols = st.columns(2)
    for i, metric in enumerate(shown):
        with cols[i % 2]:
            ui.chart(metric_chart(events, metric, alert_row))
    ui.updated_caption(settings)


ui.refreshing(settings, telemetry)

left, right = st.columns([1, 2])
with left:
    st.subheader("Registry entry")
    if entry.is_empty():
        st.warning("This device is not in the registry.")
    else:
        ui.show_table(data.as_field_table(entry.row(0, named=True)))
with right:
    st.subheader("Alert history")
    if history.is_empty():
        ui.empty_state("alerts for this device", lake.ALERTS)
    else:
        st.caption(f"{history.height} alerts, {history['verdict'].null_count()} open")
        ui.show_table(
            history.select(
                "window_start", "alert_type", "severity", "score", "model_version", "verdict",
                "reasons", "alert_id",
            )
        )  # fmt: skip
