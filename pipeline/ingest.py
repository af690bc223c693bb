"""The ingest micro-batch: quarantine bad records, keep each event once in bronze ``telemetry``.

Exactly once without streaming state: within a batch the copy with the smallest Kafka coordinates
of each event_id is its original; an event_id already in ``telemetry`` (within the dedup horizon)
is a duplicate. Both decisions depend only on the batch and on the tables as earlier batches left
them, so a replayed batch decides the same, and the appends carry (txnAppId, txnVersion=batch_id)
so Delta commits each of them once.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from infra import contract as c
from infra import lake
from pipeline.sinks import idempotent_append
from pipeline.transforms import first_of_each_event, parse_events, quarantined, valid_events

log = logging.getLogger(__name__)

_COORDS = ["kafka_topic", "kafka_partition", "kafka_offset"]


@dataclass
class IngestBatchWriter:
    """``foreachBatch`` function of the ingest query."""

    lake_root: str
    app_id: str
    dedup_horizon: str = "24 hours"

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        spark = batch.sparkSession
        telemetry_path = lake.table_path(self.lake_root, lake.TELEMETRY)
        parsed = parse_events(batch).persist()
        try:
            valid = valid_events(parsed)
            bounds = valid.agg(F.min("event_time"), F.max("event_time")).first()
            if bounds is None or bounds[0] is None:
                new_events = valid.limit(0)
            else:
                new_events = self._new_events(spark, valid, telemetry_path, bounds[0], bounds[1])
            new_events = new_events.persist()
            duplicates = (
                parsed.where(F.col("reason").isNull())
                .withColumnRenamed("topic", "kafka_topic")
                .withColumnRenamed("partition", "kafka_partition")
                .withColumnRenamed("offset", "kafka_offset")
                .join(new_events.select(*_COORDS), _COORDS, "left_anti")
                .withColumnRenamed("kafka_topic", "topic")
                .withColumnRenamed("kafka_partition", "partition")
                .withColumnRenamed("kafka_offset", "offset")
                .withColumn("reason", F.lit(c.REASON_DUPLICATE))
                .withColumn("detail", F.lit("event_id already ingested"))
            )
            rejected = quarantined(parsed).unionByName(quarantined(duplicates))
            idempotent_append(new_events, telemetry_path, f"{self.app_id}-telemetry", batch_id)
            idempotent_append(
                rejected,
                lake.table_path(self.lake_root, lake.QUARANTINE),
                f"{self.app_id}-quarantine",
                batch_id,
            )
            new_events.unpersist()
        finally:
            parsed.unpersist()

    def _new_events(
        self, spark: object, valid: DataFrame, telemetry_path: str, low: object, high: object
    ) -> DataFrame:
        """Originals of this batch whose event_id is not yet in ``telemetry``."""
        session = valid.sparkSession
        seen = (
            session.read.format("delta")
            .load(telemetry_path)
            .where(
                (F.col("event_time") >= F.greatest(
                    F.lit(low), F.current_timestamp() - F.expr(f"INTERVAL {self.dedup_horizon}")))
                & (F.col("event_time") <= F.lit(high))
            )
            .select("event_id")
        )  # fmt: skip
        return first_of_each_event(valid).join(seen, "event_id", "left_anti")
