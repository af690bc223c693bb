"""Overview: open alerts, devices silent now, alerts over time by type and severity, throughput,
data quality and how often the fast path raised a per-event alert first."""

from __future__ import annotations

import logging

import polars as pl
import streamlit as st

from dashboard import data, reads, ui
from infra import lake

log = logging.getLogger(__name__)

settings = ui.get_settings()
st.title("Overview")


def overview() -> None:
    span = ui.time_window()
    alerts = reads.alerts(settings, span, columns=data.OVERVIEW_ALERT_COLUMNS)
    open_ = data.open_alerts(alerts, reads.feedback(settings))
    per_event = data.with_first_path(
        alerts.filter(pl.col("alert_type").is_in(data.FAST_PATH_TYPES)),
        reads.fast_path(settings, span),
    )
    fast_first = per_event.filter(pl.col("first_by") == data.FAST_FIRST).height
    metrics = reads.pipeline_metrics(settings, span)
    rate = data.ingest_rate(metrics, settings.ingest_query)
    quarantined = reads.quarantined(settings, span)
    late = int(metrics["late_rows_dropped"].sum() or 0)
    silent = reads.silent_devices(settings)

    cols = st.columns(8)
    cols[0].metric("Open alerts", open_.height, help="Alerts in the range without a verdict")
    cols[1].metric("Alerts", alerts.height, help="All alerts whose window starts in the range")
    cols[2].metric("Events/s", "n/a" if rate is None else f"{rate:,.1f}", help="Latest batch")
    cols[3].metric("Devices reporting", reads.devices_reporting(settings, span))
    cols[4].metric(
        "Silent now",
        silent.height,
        help="Registered devices that stopped reporting and have not been heard from since (a "
        "device_silent alert not yet ended), each counted once, whatever the time range. The "
        "map marks them.",
    )
    cols[5].metric("Quarantined", quarantined, help="Rejected records in the range")
    cols[6].metric("Late rows dropped", late, help="Beyond the watermark, in the range")
    cols[7].metric(
        "Fast path first",
        f"{fast_first} of {per_event.height}",
        help=f"Per-event alerts ({', '.join(data.FAST_PATH_TYPES)}) in the range that the fast "
        "path raised before the windowed path",
    )
    ui.updated_caption(settings)

    if alerts.is_empty():
        ui.empty_state("alerts", lake.ALERTS)
        return
    every = data.timeline_bucket(alerts, *span.bounds(), data.utcnow())
    left, right = st.columns(2)
    with left:
        ui.chart(ui.count_bars(data.alert_timeline(alerts, "alert_type", every), "alert_type",
                               "Alerts by type"))  # fmt: skip
    with right:
        ui.chart(ui.count_bars(data.alert_timeline(alerts, "severity", every), "severity",
                               "Alerts by severity"))  # fmt: skip

    st.subheader("Newest open alerts")
    newest = open_.sort("window_start", descending=True).head(10)
    ui.show_table(
        newest.select("window_start", "alert_type", "severity", "device_id", "score", "alert_id")
    )
    by_type = (
        open_.group_by("alert_type")
        .agg(pl.len().alias("open"))
        .sort(["open", "alert_type"], descending=[True, False])
    )
    st.subheader("Open alerts by type")
    ui.show_table(by_type)


ui.refreshing(settings, overview)
