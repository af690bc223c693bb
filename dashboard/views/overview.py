"""Overview: open alerts, alerts over time by type and severity, throughput and data quality."""

from __future__ import annotations

import logging

import polars as pl
import streamlit as st

from dashboard import data, ui
from infra import lake

log = logging.getLogger(__name__)

settings = ui.get_settings()
st.title("Overview")


def overview() -> None:
    root = settings.lake_root
    since, until = ui.time_window()
    alerts = data.read_alerts(
        root,
        since=since,
        until=until,
        columns=["alert_id", "device_id", "alert_type", "severity", "window_start", "score"],
    )
    feedback = data.read_feedback(root)
    open_ = data.open_alerts(alerts, feedback)
    metrics = data.read_pipeline_metrics(root, since, until)
    rate = data.ingest_rate(metrics, settings.ingest_query)
    quarantined = data.count_rows(
        root, lake.QUARANTINE, data.time_filter("ingest_time", since, until)
    )
    late = int(metrics["late_rows_dropped"].sum() or 0)

    cols = st.columns(6)
    cols[0].metric("Open alerts", open_.height, help="Alerts in the range without a verdict")
    cols[1].metric("Alerts", alerts.height, help="All alerts whose window starts in the range")
    cols[2].metric("Events/s", "n/a" if rate is None else f"{rate:,.1f}", help="Latest batch")
    cols[3].metric("Devices reporting", data.devices_reporting(root, since, until))
    cols[4].metric("Quarantined", quarantined, help="Rejected records in the range")
    cols[5].metric("Late rows dropped", late, help="Beyond the watermark, in the range")
    ui.updated_caption(settings)

    if alerts.is_empty():
        ui.empty_state("alerts", lake.ALERTS)
        return
    # Buckets sized to the alerts' own span, so a quiet day still shows readable bars.
    first = alerts.select(pl.col("window_start").min()).item()
    every = data.time_bucket(max(since, first) if since else first, until or data.utcnow())
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
