"""Alerts: the filterable list and the alerts over time; one alert's reasons, window features,
analyst feedback and which path raised it first (the fast path or the windowed one).

A click on an alert's row shows its detail below and puts its id in the page's address
(``?alert=<alert_id>``); an address with an id opens the page on that alert, whatever the filters.
"""

from __future__ import annotations

import logging
from typing import Any

import polars as pl
import streamlit as st

from dashboard import data, login, reads, ui
from infra import contract as c
from infra import lake

log = logging.getLogger(__name__)

RULES = "rules (no model)"
# "Withdrawn": rule alerts raised while their window filled that its final state did not call
# for (``infra.contract.ALERT_WITHDRAWN``); every other choice shows standing alerts only.
STATUSES = ("All", "Open", "Reviewed", "Withdrawn")
LIST_COLUMNS = (
    "window_start", "alert_type", "severity", "device_id", "score", "model_version", "verdict",
    "reasons", "detected_at", "first_by", "alert_id",
)  # fmt: skip
VERDICT_LABELS = {"true_positive": "True positive", "false_positive": "False positive"}
ALERT_PARAM = "alert"
TABLE_KEY = "alert_table"
# The alert whose detail the page shows (its row is the one highlighted in the list).
SHOWN_KEY = "shown_alert_id"
# The alert the feedback form was drawn for: a verdict is saved for it, whatever the page shows
# when the form is sent (the list may have moved on meanwhile).
FORM_FOR_KEY = "feedback_form_alert_id"

settings = ui.get_settings()
root = settings.lake_root
st.title("Alerts")
ui.flash()

# The filters' choices come from the alerts in the range (two small columns only).
choices = reads.alerts(settings, ui.time_window(), columns=["device_id", "model_version"])
filters = st.columns([2, 2, 2, 1, 1])
types = filters[0].multiselect("Type", c.ALERT_TYPES, key="f_type")
severities = filters[1].multiselect("Severity", c.SEVERITIES, key="f_severity")
devices = filters[2].multiselect(
    "Device", sorted(choices["device_id"].drop_nulls().unique().to_list()), key="f_device"
)
versions = filters[3].multiselect(
    "Model version",
    [RULES, *sorted(choices["model_version"].drop_nulls().unique().to_list())],
    key="f_version",
)
status = filters[4].selectbox("Status", STATUSES, key="f_status")


def filtered() -> pl.DataFrame:
    """The alerts matching the filters, with their latest verdict and the path that raised them
    first."""
    span = ui.time_window()
    alerts = reads.alerts(
        settings,
        span,
        alert_types=types or None,
        severities=severities or None,
        device_ids=devices or None,
        model_versions=[None if v == RULES else v for v in versions] or None,
        withdrawn=status == "Withdrawn",
    )
    alerts = data.with_feedback(alerts, reads.feedback(settings))
    alerts = data.with_first_path(alerts, reads.fast_path(settings, span))
    if status == "Withdrawn":
        return alerts.filter(pl.col("status") == c.ALERT_WITHDRAWN)
    if status == "Open":
        return alerts.filter(pl.col("verdict").is_null())
    if status == "Reviewed":
        return alerts.filter(pl.col("verdict").is_not_null())
    return alerts


def shown_alert(listed: pl.DataFrame) -> str | None:
    """The address's alert; else the one shown so far while it is listed; else the newest."""
    linked = st.query_params.get(ALERT_PARAM)
    if linked:
        return linked
    ids = listed["alert_id"].to_list()
    before = st.session_state.get(SHOWN_KEY)
    if before in ids:
        return str(before)
    return ids[0] if ids else None


def alert_list() -> None:
    alerts = filtered()
    if alerts.is_empty():
        ui.empty_state("alerts matching these filters", lake.ALERTS)
        return
    since, until = ui.time_window().bounds()
    every = data.timeline_bucket(alerts, since, until, data.utcnow())
    ui.chart(ui.count_bars(data.alert_timeline(alerts, "alert_type", every), "alert_type",
                           "Alerts over time by type"))  # fmt: skip
    st.caption(
        f"{alerts.height} alerts, {alerts['verdict'].null_count()} open"
        + (
            f" (showing the newest {settings.max_rows})"
            if alerts.height > settings.max_rows
            else ""
        )
        + "; click a row to see its detail below"
    )
    clicked = ui.select_row(
        alerts.head(settings.max_rows).select(LIST_COLUMNS),
        key=TABLE_KEY,
        id_column="alert_id",
        selected=st.session_state.get(SHOWN_KEY),
        height=320,
    )
    if clicked is not None:
        # The detail is outside this refreshing part of the page: run the whole page.
        st.query_params[ALERT_PARAM] = clicked
        st.session_state[SHOWN_KEY] = clicked
        st.rerun(scope="app")
    ui.updated_caption(settings)


listed = filtered().head(settings.max_rows)
st.session_state[SHOWN_KEY] = alert_id = shown_alert(listed)
ui.refreshing(settings, alert_list)

st.header("Alert detail")
if alert_id is None:
    st.stop()
row = listed.filter(pl.col("alert_id") == alert_id)
if row.is_empty():
    row = data.with_feedback(
        reads.alerts(settings, alert_ids=[alert_id], withdrawn=True), reads.feedback(settings)
    )
    row = data.with_first_path(row, reads.fast_path(settings, alert_ids=[alert_id]))
    if row.is_empty():
        st.warning("There is no alert with the id in the page's address:")
        st.text(alert_id)
        st.stop()
    st.caption("This alert is not in the list above: it is outside the filters or the time range.")
alert: dict[str, Any] = row.row(0, named=True)

cols = st.columns(4)
cols[0].metric("Type", str(alert["alert_type"]))
cols[1].metric("Severity", str(alert["severity"]))
cols[2].metric("Score", "n/a" if alert["score"] is None else f"{alert['score']:.2f}")
cols[3].metric("Verdict", VERDICT_LABELS.get(alert["verdict"] or "", "open"))
st.caption(data.first_by_sentence(alert))
silence = data.silence_sentence(alert, data.utcnow())
if silence is not None:
    # Times and durations only: no field value is rendered as Markdown.
    st.caption(silence)

left, right = st.columns(2)
with left:
    st.subheader("Reasons")
    # Reasons come from the data: plain text, never Markdown or HTML.
    st.text("\n".join(f"- {reason}" for reason in alert["reasons"] or []) or "(none recorded)")
    st.subheader("Alert")
    ui.show_table(data.alert_field_table(alert))
with right:
    st.subheader("Window features")
    if alert["alert_type"] in c.SILENCE_ALERT_TYPES:
        # Raised from readings that did not arrive, or arrived late: no window was computed.
        st.caption(
            "None: this alert is about readings that did not arrive, or arrived late. The "
            "device's telemetry shows them."
        )
    else:
        features = reads.features(settings, alert["device_id"], alert["window_start"])
        if features.is_empty():
            ui.empty_state("features for this window", lake.FEATURES)
        else:
            ui.show_table(data.as_field_table(features.row(0, named=True)), height=420)

if st.button("Open this device", icon=":material/sensors:"):
    st.session_state[ui.DEVICE_KEY] = alert["device_id"]
    st.session_state[ui.ALERT_KEY] = alert["alert_id"]
    st.switch_page("views/device.py")

st.subheader("Feedback")
with st.form("feedback", clear_on_submit=True):
    verdict = st.radio(
        "Verdict", c.VERDICTS, format_func=VERDICT_LABELS.__getitem__, horizontal=True
    )
    note = st.text_area("Note", max_chars=2000)
    signed_in = login.signed_in_analyst()
    if signed_in is None:
        analyst = st.text_input("Analyst", value=settings.analyst)
    else:
        # Verdicts are recorded under the signed-in name: shown, not editable.
        st.text_input("Analyst", value=signed_in, disabled=True)
        analyst = signed_in
    submitted = st.form_submit_button("Save verdict", type="primary")
drawn_for = st.session_state.get(FORM_FOR_KEY) or alert["alert_id"]
st.session_state[FORM_FOR_KEY] = alert["alert_id"]
if submitted and verdict:
    data.write_feedback(root, drawn_for, verdict, note=note, analyst=analyst)
    reads.feedback_saved()
    st.session_state[ui.FLASH_KEY] = f"{VERDICT_LABELS[verdict]} saved for {drawn_for}"
    st.query_params[ALERT_PARAM] = st.session_state[SHOWN_KEY] = drawn_for
    st.rerun()
