"""The ingest micro-batch: quarantine bad records, keep each event once in bronze ``telemetry``.

Exactly once without streaming state: within a batch the copy with the smallest Kafka coordinates
of each event_id is its original; an event_id already in ``telemetry`` (within the dedup horizon)
from an earlier batch is a duplicate. Both decisions depend only on the batch and on what earlier
batches wrote (rows with this batch's own coordinates are ignored), so a batch replayed after a
crash decides the same; the appends carry (txnAppId, txnVersion=batch_id) so Delta commits each
of them once.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from infra import contract as c
from infra import lake
from pipeline import columns as col
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
    max_clock_ahead: str = "1 minute"

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        telemetry_path = lake.table_path(self.lake_root, lake.TELEMETRY)
        # Decide new vs duplicate once, before writing anything: materialised here, the decision
        # cannot be recomputed against a telemetry table this batch has already changed.
        marked = self.mark_new_events(batch, telemetry_path).localCheckpoint(eager=True)
        new_events = valid_events(marked.where(F.col("is_new")))
        duplicates = marked.where(F.col("reason").isNull() & ~F.col("is_new")).withColumns(
            {"reason": F.lit(c.REASON_DUPLICATE), "detail": F.lit("event_id already ingested")}
        )
        rejected = quarantined(marked).unionByName(quarantined(duplicates))
        idempotent_append(new_events, telemetry_path, f"{self.app_id}-telemetry", batch_id)
        idempotent_append(
            rejected,
            lake.table_path(self.lake_root, lake.QUARANTINE),
            f"{self.app_id}-quarantine",
            batch_id,
        )

    def mark_new_events(self, batch: DataFrame, telemetry_path: str) -> DataFrame:
        """``parse_events`` output plus ``is_new``: the first copy of an event_id not yet in
        ``telemetry`` (within the dedup horizon)."""
        parsed = parse_events(batch, max_clock_ahead=self.max_clock_ahead).localCheckpoint(
            eager=True
        )
        valid = valid_events(parsed)
        horizon_start = F.current_timestamp() - F.expr(f"INTERVAL {self.dedup_horizon}")
        # Rows carrying this batch's own Kafka coordinates were written by an earlier attempt
        # of this batch (killed before its checkpoint commit): they do not count as seen.
        this_batch = valid.select("event_id", *_COORDS)
        seen = (
            parsed.sparkSession.read.format("delta")
            .load(telemetry_path)
            .where(F.col("event_time") >= horizon_start)
            .select("event_id", *_COORDS)
            .join(F.broadcast(this_batch.select("event_id")), "event_id", "left_semi")
            .join(F.broadcast(this_batch), ["event_id", *_COORDS], "left_anti")
            .select("event_id")
            .distinct()
        )
        new = (
            first_of_each_event(valid)
            .join(F.broadcast(seen), "event_id", "left_anti")
            .select(
                F.col("kafka_topic").alias(col.TOPIC),
                F.col("kafka_partition").alias(col.PARTITION),
                F.col("kafka_offset").alias(col.OFFSET),
                F.lit(True).alias("is_new"),
            )
        )
        return parsed.join(new, [col.TOPIC, col.PARTITION, col.OFFSET], "left").withColumn(
            "is_new", F.coalesce(F.col("is_new"), F.lit(False))
        )
