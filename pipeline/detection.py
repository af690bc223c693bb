"""The features micro-batch: upsert window features, then (part 2) rules and model into alerts."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from pyspark.sql import DataFrame

from infra import lake
from pipeline import columns as col
from pipeline.sinks import upsert

log = logging.getLogger(__name__)

FEATURE_KEYS = ["device_id", col.WINDOW_START]


@dataclass
class FeaturesBatchWriter:
    """``foreachBatch`` function of the features query (update mode: the windows that changed)."""

    lake_root: str

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        spark = batch.sparkSession
        windows = batch.persist()
        try:
            upsert(spark, windows, lake.table_path(self.lake_root, lake.FEATURES), FEATURE_KEYS)
        finally:
            windows.unpersist()
