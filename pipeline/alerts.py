"""Alert rows, in one place: the deterministic ``alert_id``, the row every detector produces, and
the idempotent MERGE into the ``alerts`` table.

Detectors decide on the driver in pandas (``pipeline.rules``, ``pipeline.scoring``) or in Spark
(``pipeline.firmware``); both build ``alert_id`` from the same text, so a (device, window start,
alert type) has one id whichever path raised it.
"""

from __future__ import annotations

import hashlib
from datetime import datetime

import pandas as pd
from delta.tables import DeltaTable
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from infra import contract as c
from pipeline import columns as col
from pipeline.sinks import lower_bound, retry_on_conflict

# What a detector produces; the model columns, detected_at and batch_id are added on writing.
DETECTOR_COLUMNS = (
    "alert_id", "device_id", "alert_type", "severity", "score", "reasons", "model_name",
    "model_version", col.WINDOW_START, col.WINDOW_END, "first_event_time", "last_event_time",
)  # fmt: skip
# Fields an updated window may change in an existing alert; the first detection time stays.
_UPDATABLE = ("severity", "score", "reasons", "window_end", "last_event_time", "model_version")
# Spark's text of a timestamp (session time zone, UTC here): what alert_id hashes.
_TIME_TEXT = "%Y-%m-%d %H:%M:%S"


def alert_id(device_id: Column, alert_type: Column, window_start: Column) -> Column:
    """Deterministic key: the same device, window and type always give the same id."""
    return F.sha2(F.concat_ws("|", device_id, alert_type, window_start.cast("string")), 256)


def alert_id_of(device_id: str, alert_type: str, window_start: datetime) -> str:
    """``alert_id`` computed in Python (windows start on whole seconds)."""
    text = f"{device_id}|{alert_type}|{window_start.strftime(_TIME_TEXT)}"
    return hashlib.sha256(text.encode()).hexdigest()


def alert_frame(
    windows: pd.DataFrame,
    alert_type: str,
    severity: str | pd.Series,
    score: pd.Series | float,
    reason: pd.Series | str,
    *,
    model: tuple[str, str] | None = None,
) -> pd.DataFrame:
    """One alert per row of ``windows`` (window features), DETECTOR_COLUMNS, in pandas."""
    frame = windows[["device_id", col.WINDOW_START, col.WINDOW_END, "first_event_time",
                     "last_event_time"]].copy()  # fmt: skip
    frame["alert_type"] = alert_type
    frame["severity"] = severity
    frame["score"] = pd.Series(score, index=frame.index, dtype="float64").clip(0.0, 1.0)
    reasons = pd.Series(reason, index=frame.index, dtype="object")
    frame["reasons"] = [[text] for text in reasons]
    frame["model_name"] = model[0] if model else None
    frame["model_version"] = model[1] if model else None
    frame["alert_id"] = [
        alert_id_of(d, alert_type, s)
        for d, s in zip(frame["device_id"], frame[col.WINDOW_START], strict=True)
    ]
    return frame[list(DETECTOR_COLUMNS)]


def empty_alerts() -> pd.DataFrame:
    return pd.DataFrame({name: pd.Series(dtype="object") for name in DETECTOR_COLUMNS})


def to_spark(spark: SparkSession, alerts: pd.DataFrame, batch_id: int) -> DataFrame:
    """Pandas alerts (DETECTOR_COLUMNS) as rows of the ``alerts`` table's schema."""
    schema = c.spark_ddl(tuple(
        (name, kind) for name, kind in c.ALERTS_COLUMNS if name in DETECTOR_COLUMNS
    ))  # fmt: skip
    # From pandas through Arrow: naive timestamps are read in the session time zone, as they
    # were written by toPandas.
    df = (
        spark.createDataFrame(alerts[list(DETECTOR_COLUMNS)], schema)
        if len(alerts)
        else (spark.createDataFrame([], schema))
    )
    return df.withColumns(
        {"detected_at": F.current_timestamp(), "batch_id": F.lit(batch_id).cast("long")}
    ).select(*c.column_names(c.ALERTS_COLUMNS))


def merge_alerts(alerts: DataFrame, path: str) -> None:
    """MERGE on alert_id: new alerts inserted, changed ones updated; a replay changes nothing."""
    # Computed once: the bound below and a MERGE retried after a conflict reuse the rows.
    alerts = alerts.localCheckpoint(eager=True)
    if alerts.isEmpty():  # a MERGE of nothing would change nothing, after seconds of work
        return
    changed = " OR ".join(f"NOT (t.`{f}` <=> s.`{f}`)" for f in _UPDATABLE)
    # alert_id is made from the window start, so a match has the same window_start.
    condition = "t.alert_id = s.alert_id AND " + lower_bound(alerts, col.WINDOW_START)

    def merge() -> None:
        (
            DeltaTable.forPath(alerts.sparkSession, path)
            .alias("t")
            .merge(alerts.alias("s"), condition)
            .whenMatchedUpdate(condition=changed, set={f: f"s.`{f}`" for f in _UPDATABLE})
            .whenNotMatchedInsertAll()
            .execute()
        )

    retry_on_conflict(merge, "alerts MERGE")
