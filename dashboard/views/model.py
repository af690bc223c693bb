"""Model: the champion version and its metrics, detection quality and analyst verdicts."""

from __future__ import annotations

import logging

import altair as alt
import streamlit as st

from dashboard import data, reads, ui
from infra import lake

log = logging.getLogger(__name__)

settings = ui.get_settings()
st.title("Model")


@st.cache_data(ttl=60, show_spinner=False)
def champion(tracking_uri: str, model_name: str) -> data.ModelInfo | None:
    # Cached for a minute: the registry changes rarely and mlflow calls are slow.
    try:
        return data.champion(tracking_uri, model_name)
    except ImportError:
        # Not an answer from the registry: the page says what is missing instead.
        raise
    except Exception:
        # An unreachable server must not take the page down; the reason goes to the log.
        log.exception("cannot read the MLflow registry at %s", tracking_uri)
        return None


def champion_info(info: data.ModelInfo | None) -> None:
    if info is None:
        st.info("No champion model: nothing is registered under this name with the alias "
                "`champion`, or the MLflow store is not reachable.")  # fmt: skip
        st.text(f"model: {settings.model_name}\nstore: {settings.tracking_uri()}")
        return
    cols = st.columns(4)
    cols[0].metric("Model", info.name)
    cols[1].metric("Champion version", info.version)
    cols[2].metric(
        "Registered",
        "n/a" if info.created_at is None else f"{info.created_at:%Y-%m-%d}",
        help=None if info.created_at is None else f"{info.created_at:%Y-%m-%d %H:%M:%S} UTC",
    )
    cols[3].metric("Aliases", ", ".join(info.aliases) or "none")
    left, right = st.columns(2)
    with left:
        st.caption("Training metrics")
        ui.show_table(data.as_field_table(dict(sorted(info.metrics.items()))))
    with right:
        st.caption("Run and parameters")
        params = {"run_id": info.run_id, **dict(sorted(info.params.items()))}
        ui.show_table(data.as_field_table(params))


def model() -> None:
    st.subheader("Champion")
    try:
        info = champion(settings.tracking_uri(), settings.model_name)
    except ImportError as exc:
        log.error("the Model page cannot read the registry: %s", exc)
        st.error("MLflow is not installed, so the champion cannot be read. Install the "
                 "dashboard's dependencies: pip install 'iotfraud[dashboard]'.")  # fmt: skip
    else:
        champion_info(info)

    st.subheader("Detection quality against ground truth")
    evaluation = reads.latest_evaluation(settings)
    if evaluation.is_empty():
        ui.empty_state("evaluation (run `iotfraud eval`)", lake.EVALUATION)
    else:
        st.caption(f"Evaluated at {evaluation['evaluated_at'][0]:%Y-%m-%d %H:%M} UTC")
        scores = evaluation.unpivot(["precision", "recall", "f1"], index="scenario")
        bars = (
            alt.Chart(scores.to_pandas(), title="Per scenario")
            .mark_bar()
            .encode(
                x=alt.X("scenario:N", title=None, axis=alt.Axis(labelAngle=0)),
                xOffset="variable:N",
                y=alt.Y("value:Q", title="score", scale=alt.Scale(domain=[0, 1])),
                color=alt.Color("variable:N", title="metric"),
                tooltip=["scenario:N", "variable:N", "value:Q"],
            )
            .properties(height=260)
        )
        ui.chart(bars)
        ui.show_table(evaluation.drop("evaluated_at"))

    st.subheader("Analyst verdicts by model version")
    alerts = reads.alerts(settings, ui.time_window(), columns=["alert_id", "model_version"])
    quality = data.feedback_quality(data.with_feedback(alerts, reads.feedback(settings)))
    if quality.is_empty():
        ui.empty_state("verdicts on alerts in this range", lake.ALERT_FEEDBACK)
    else:
        ui.show_table(quality)
    ui.updated_caption(settings)


ui.refreshing(settings, model)
