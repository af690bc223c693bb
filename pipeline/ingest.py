"""The ingest micro-batch: quarantine bad records, keep each event once in bronze ``telemetry``.

Exactly once without streaming state: copies of an event are messages with the same event_id and
event_time (the same message sent again). Within a batch the copy with the smallest Kafka
coordinates is the original; an event already in ``telemetry`` (within the dedup horizon) from an
earlier batch is a duplicate; it is looked up in the minutes of the batch's event times. Both
decisions depend only on the batch and on what earlier batches wrote (rows with this batch's own
coordinates are ignored), so a batch replayed after a crash decides the same; the appends carry
(txnAppId, txnVersion=batch_id) so Delta commits each of them once.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timezone
from functools import reduce

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from infra import contract as c
from infra import lake
from pipeline import columns as col
from pipeline.sinks import idempotent_append, side_by_side
from pipeline.transforms import mark_first_copies, quarantined, valid_events

log = logging.getLogger(__name__)

# More separate event-time ranges than this in one batch (a backfill) are looked up as one.
_MAX_LOOKUP_SPANS = 32
_MINUTE_US = 60_000_000


@dataclass
class IngestBatchWriter:
    """``foreachBatch`` function of the ingest query; its input is ``parse_events`` output.

    The query parses on the stream rather than in here: built once, the parse plan is only
    re-optimised per micro-batch, where building it again in Python cost about a second.
    """

    lake_root: str
    app_id: str
    dedup_horizon: str = "24 hours"

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        telemetry_path = lake.table_path(self.lake_root, lake.TELEMETRY)
        marked = self.mark_new_events(batch, telemetry_path)
        new_events = valid_events(marked.where(F.col("is_new")))
        duplicates = marked.where(F.col("reason").isNull() & ~F.col("is_new")).withColumns(
            {
                "reason": F.lit(c.REASON_DUPLICATE),
                "detail": F.lit("event already ingested (same event_id and event_time)"),
            }
        )
        rejected = quarantined(marked).unionByName(quarantined(duplicates))
        quarantine_path = lake.table_path(self.lake_root, lake.QUARANTINE)
        side_by_side(
            lambda: idempotent_append(new_events, telemetry_path, f"{self.app_id}-telemetry",
                                      batch_id),
            lambda: idempotent_append(rejected, quarantine_path, f"{self.app_id}-quarantine",
                                      batch_id),
        )  # fmt: skip

    def mark_new_events(self, parsed: DataFrame, telemetry_path: str) -> DataFrame:
        """``parse_events`` output plus ``is_new``: the first copy of an event not yet in
        ``telemetry`` (within the dedup horizon).

        The decision is fixed before anything is written: the parsed batch is materialised and
        the event ids already seen are collected, so the result cannot change when the appends
        that follow change ``telemetry``.
        """
        spark = parsed.sparkSession
        parsed = mark_first_copies(parsed).localCheckpoint(eager=True)
        firsts = parsed.where(F.col("is_first")).select(
            "event_id",
            "event_time",
            F.col(col.TOPIC).alias("kafka_topic"),
            F.col(col.PARTITION).alias("kafka_partition"),
            F.col(col.OFFSET).alias("kafka_offset"),
        )
        # Rows carrying this batch's own Kafka coordinates were written by an earlier attempt
        # of this batch (killed before its checkpoint commit): they do not count as seen.
        seen = [
            (row.event_id, row.micros)
            for row in spark.read.format("delta")
            .load(telemetry_path)
            .where(self.lookup_range(firsts))
            .select("event_id", "event_time", *col.BRONZE_COORDS)
            .join(F.broadcast(firsts.select("event_id", "event_time")),
                  ["event_id", "event_time"], "left_semi")
            .join(F.broadcast(firsts), ["event_id", *col.BRONZE_COORDS], "left_anti")
            .select("event_id", F.unix_micros("event_time").alias("micros"))
            .distinct()
            .collect()
        ]  # fmt: skip
        seen_df = spark.createDataFrame(
            [(*key, True) for key in seen], "event_id string, _micros long, _seen boolean"
        )
        keys = (parsed["event_id"] == seen_df["event_id"]) & (
            F.unix_micros(parsed["event_time"]) == seen_df["_micros"]
        )
        is_new = F.coalesce(F.col("is_first") & seen_df["_seen"].isNull(), F.lit(False))
        return (
            parsed.join(F.broadcast(seen_df), keys, "left")
            .select(parsed["*"], is_new.alias("is_new"))
            .drop("is_first")
        )

    def lookup_range(self, firsts: DataFrame) -> Column:
        """Where copies of ``firsts`` can be in ``telemetry``: the minutes of their event times,
        within the dedup horizon. Delta skips the files outside (min/max of event_time), so the
        lookup reads what the batch could repeat, not the whole table: a live batch's events
        fall in a few minutes, and the files covering them are those of the last few batches.
        """
        minutes = [
            row.m
            for row in firsts.select(F.unix_micros(F.date_trunc("minute", "event_time")).alias("m"))
            .distinct()
            .collect()
        ]
        if not minutes:
            return F.lit(False)
        horizon = F.col("event_time") >= F.current_timestamp() - F.expr(
            f"INTERVAL {self.dedup_horizon}"
        )
        in_spans = [
            (F.col("event_time") >= F.lit(_utc(start))) & (F.col("event_time") < F.lit(_utc(end)))
            for start, end in lookup_spans(minutes)
        ]
        return horizon & reduce(lambda a, b: a | b, in_spans)


def lookup_spans(minutes: list[int], max_spans: int = _MAX_LOOKUP_SPANS) -> list[tuple[int, int]]:
    """Half-open ``[start, end)`` ranges (epoch microseconds) covering the given whole minutes,
    adjacent minutes joined; more than ``max_spans`` ranges (a backfill) become one from the
    first to the last."""
    spans: list[tuple[int, int]] = []
    for minute in sorted(set(minutes)):
        end = minute + _MINUTE_US
        if spans and spans[-1][1] == minute:
            spans[-1] = (spans[-1][0], end)
        else:
            spans.append((minute, end))
    if len(spans) > max_spans:
        return [(spans[0][0], spans[-1][1])]
    return spans


def _utc(micros: int) -> datetime:
    return datetime.fromtimestamp(micros / 1_000_000, tz=timezone.utc)
