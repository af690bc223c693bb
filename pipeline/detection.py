"""The features micro-batch: upsert window features, then rules and the model into ``alerts``."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from delta.tables import DeltaTable
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from infra import contract as c
from infra import lake
from pipeline import columns as col
from pipeline.rules import Thresholds, rule_alerts
from pipeline.scoring import ModelScorer, model_alerts
from pipeline.sinks import lower_bound, retry_on_conflict, side_by_side, upsert

log = logging.getLogger(__name__)

FEATURE_KEYS = ["device_id", col.WINDOW_START]
# Fields an updated window may change in an existing alert; the first detection time stays.
_UPDATABLE = ("severity", "score", "reasons", "window_end", "last_event_time", "model_version")


def merge_alerts(alerts: DataFrame, path: str) -> None:
    """MERGE on alert_id: new alerts inserted, changed ones updated; a replay changes nothing."""
    # Scored once: the bound below and a MERGE retried after a conflict reuse the rows.
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


@dataclass
class FeaturesBatchWriter:
    """``foreachBatch`` function of the features query (update mode: the windows that changed)."""

    lake_root: str
    scorer: ModelScorer | None = None
    thresholds: Thresholds = field(default_factory=Thresholds)

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        spark = batch.sparkSession
        windows = batch.localCheckpoint(eager=True)
        # The two MERGEs touch different tables and spend most of their time in Delta's
        # planning and commits rather than on the cores.
        side_by_side(
            lambda: self.write_alerts(windows, batch_id),
            lambda: upsert(spark, windows, lake.table_path(self.lake_root, lake.FEATURES),
                           FEATURE_KEYS, prune_on=col.WINDOW_START),
        )  # fmt: skip

    def write_alerts(self, windows: DataFrame, batch_id: int) -> None:
        spark = windows.sparkSession
        alerts = rule_alerts(windows, self.thresholds).withColumns(
            {"model_name": F.lit(None).cast("string"), "model_version": F.lit(None).cast("string")}
        )
        model = self.scorer.current(spark, windows.columns) if self.scorer else None
        if model is not None:
            alerts = alerts.unionByName(model_alerts(windows, model))
        alerts = alerts.withColumns(
            {"detected_at": F.current_timestamp(), "batch_id": F.lit(batch_id).cast("long")}
        ).select(*c.column_names(c.ALERTS_COLUMNS))
        merge_alerts(alerts, lake.table_path(self.lake_root, lake.ALERTS))
