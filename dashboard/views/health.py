"""Pipeline health: throughput, batch duration, watermark lag, late, duplicate, quarantined."""

from __future__ import annotations

import logging

import polars as pl
import streamlit as st

from dashboard import data, reads, ui
from infra import contract as c
from infra import lake

log = logging.getLogger(__name__)

settings = ui.get_settings()
st.title("Pipeline health")


def health() -> None:
    span = ui.time_window()
    metrics = reads.pipeline_metrics(settings, span)
    quarantine = reads.quarantine_by_reason(settings, span)
    duplicates = quarantine.filter(pl.col("reason") == c.REASON_DUPLICATE)["records"].sum()
    rate = data.ingest_rate(metrics, settings.ingest_query)
    median_ms = metrics.select(pl.col("batch_duration_ms").median()).item()
    lag = data.watermark_lag(metrics)

    cols = st.columns(6)
    cols[0].metric("Batches", metrics.height, help="Micro-batches of all queries in the range")
    cols[1].metric("Events/s", "n/a" if rate is None else f"{rate:,.1f}", help="Latest batch")
    cols[2].metric("Median batch", "n/a" if median_ms is None else f"{median_ms:,.0f} ms")
    cols[3].metric("Watermark lag", "n/a" if lag is None else f"{lag:,.0f} s",
                   help="The largest among the queries: its latest batch's time minus its "
                   "watermark")  # fmt: skip
    cols[4].metric("Late rows dropped", int(metrics["late_rows_dropped"].sum() or 0))
    cols[5].metric("Quarantined", int(quarantine["records"].sum() or 0),
                   help=f"of which {int(duplicates or 0)} duplicates")  # fmt: skip
    ui.updated_caption(settings)

    if metrics.is_empty():
        ui.empty_state("pipeline metrics", lake.PIPELINE_METRICS)
    else:
        shown = data.downsample(metrics, "timestamp", by="query_name")
        left, right = st.columns(2)
        with left:
            rates = shown.unpivot(
                ["input_rows_per_second", "processed_rows_per_second"],
                index=["timestamp", "query_name"],
            ).with_columns(
                (
                    pl.col("query_name")
                    + " "
                    + pl.col("variable").str.replace("_rows_per_second", "")
                ).alias("series")
            )
            ui.chart(ui.lines(rates, "timestamp", "value", "series", title="Throughput",
                              y_title="rows/s"))  # fmt: skip
            ui.chart(ui.lines(shown, "timestamp", "watermark_lag_s", "query_name",
                              title="Watermark lag", y_title="seconds"))  # fmt: skip
        with right:
            ui.chart(ui.lines(shown, "timestamp", "batch_duration_ms", "query_name",
                              title="Batch duration", y_title="ms"))  # fmt: skip
            # Empty for the queries whose state RocksDB holds: it does not count its rows.
            ui.chart(ui.lines(shown.drop_nulls("state_rows"), "timestamp", "state_rows",
                              "query_name", title="State rows", y_title="rows"))  # fmt: skip
        st.subheader("Latest batch per query")
        ui.show_table(data.latest_batches(metrics))

    st.subheader("Quarantine by reason")
    if quarantine.is_empty():
        ui.empty_state("quarantined records", lake.QUARANTINE)
    else:
        ui.show_table(quarantine)


ui.refreshing(settings, health)
