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
from pipeline.transforms import mark_first_copies, parse_events, quarantined, valid_events

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
        marked = self.mark_new_events(batch, telemetry_path)
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
        ``telemetry`` (within the dedup horizon).

        The decision is fixed before anything is written: the parsed batch is materialised and
        the event ids already seen are collected, so the result cannot change when the appends
        that follow change ``telemetry``.
        """
        spark = batch.sparkSession
        parsed = mark_first_copies(
            parse_events(batch, max_clock_ahead=self.max_clock_ahead)
        ).localCheckpoint(eager=True)
        firsts = parsed.where(F.col("is_first")).select(
            "event_id",
            F.col(col.TOPIC).alias("kafka_topic"),
            F.col(col.PARTITION).alias("kafka_partition"),
            F.col(col.OFFSET).alias("kafka_offset"),
        )
        horizon_start = F.current_timestamp() - F.expr(f"INTERVAL {self.dedup_horizon}")
        # Rows carrying this batch's own Kafka coordinates were written by an earlier attempt
        # of this batch (killed before its checkpoint commit): they do not count as seen.
        seen = [
            row.event_id
            for row in spark.read.format("delta")
            .load(telemetry_path)
            .where(F.col("event_time") >= horizon_start)
            .select("event_id", *_COORDS)
            .join(F.broadcast(firsts.select("event_id")), "event_id", "left_semi")
            .join(F.broadcast(firsts), ["event_id", *_COORDS], "left_anti")
            .select("event_id")
            .distinct()
            .collect()
        ]
        seen_df = spark.createDataFrame([(e, True) for e in seen], "event_id string, _seen boolean")
        return (
            parsed.join(F.broadcast(seen_df), "event_id", "left")
            .withColumn(
                "is_new", F.coalesce(F.col("is_first") & F.col("_seen").isNull(), F.lit(False))
            )
            .drop("is_first", "_seen")
        )
