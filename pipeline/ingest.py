"""The ingest micro-batch: quarantine bad records, keep each event once in bronze ``telemetry``.

Exactly once without Spark state: copies of an event are messages with the same event_id and
event_time (the same message sent again). Each valid row of the batch is reduced to two 64-bit
hashes (of the event, of its Kafka coordinates) and its Kafka timestamp, which are collected;
``pipeline.dedup`` decides in the driver which rows are new, against the events kept within the
dedup horizon (held in memory, loaded from ``telemetry`` when the query starts). Only the rows it
calls copies, usually none, go back to Spark. The decision depends only on the batch and on what
earlier batches kept, so a batch replayed after a crash decides the same.

A message the lake already holds is not written again (``WrittenOffsets``): that is what makes
the appends exactly once, with no Delta transaction id. A query runs each of its batches once;
only the first batch after a start can be one that an earlier run wrote, all of it or one table
of the two, before a crash kept Spark from recording it done. So at its first batch the writer
looks up which of that batch's Kafka offsets each table holds, and leaves those rows out. The
same lookup covers a query started under a new checkpoint (the old one deleted): it reads the
topic again from its starting offsets and numbers its batches from 0, so neither its batch ids
nor its dedup state, which spans only the horizon, could tell those messages apart; there it
covers every offset the tables hold. A transaction id would cost each append a job over the
table's state first (delta-spark 4.4.0; docs/PERFORMANCE.md), and the ingest appends every
batch. A files source has no offsets to look up: its appends carry (txnAppId,
txnVersion=batch_id), the txnAppId named after the query's checkpoint, and Delta commits each
once.
"""

from __future__ import annotations

import logging
import operator
from dataclasses import dataclass, field
from functools import reduce

import numpy as np
import pandas as pd
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from infra import contract as c
from infra import lake
from pipeline import columns as col
from pipeline.dedup import Bools, Int64s, SeenEvents
from pipeline.metrics import Laps
from pipeline.settings import seconds
from pipeline.sinks import append, checkpoint_id, driver_frame, side_by_side
from pipeline.transforms import event_key, quarantined, valid_events

log = logging.getLogger(__name__)

_ROW = "_row"  # a row's place in the materialised batch: unique within it, unlike coordinates
# A micro-batch's new events go to telemetry in one file per this many rows. Written as read,
# they were a file per Kafka partition per micro-batch (6 by default): small files that every
# reader of the table opens until maintenance compacts them (the dashboard, the firmware check's
# stream, a restart's dedup state). A live micro-batch holds some thousands; a catch-up's larger
# ones keep several files, written side by side.
ROWS_PER_FILE = 100_000


def coord_key(topic: Column, partition: Column, offset: Column) -> Column:
    """The 64-bit hash of a message's source coordinates (the same types in batch and table)."""
    return F.xxhash64(topic.cast("string"), partition.cast("int"), offset.cast("long"))


# Per Kafka (topic, partition): the first and last offset of a batch.
Ranges = dict[tuple[str, int], tuple[int, int]]


@dataclass(frozen=True)
class WrittenOffsets:
    """Per Kafka (topic, partition), the highest offset a bronze table held when the ingest
    started. A batch covers a range of offsets per partition and each append is atomic, so a
    message at or below it is in the table already (for ``telemetry``: it was new, or a copy in
    ``quarantine``).

    An entry is forgotten once a batch goes past it: from then on nothing is below it.
    """

    highest: dict[tuple[str, int], int]

    @classmethod
    def load(cls, spark: SparkSession, path: str, within: Ranges | None) -> WrittenOffsets:
        """From the table at ``path``: all of it, or only its rows ``within`` the offsets of a
        batch (a checkpoint that continues replays at most its first batch). Delta's file
        statistics on the offsets skip the files written before."""
        table = spark.read.format("delta").load(path)
        topic, partition, offset = (F.col(name) for name in col.BRONZE_COORDS)
        if within is not None:
            if not within:
                return cls({})
            table = table.where(reduce(operator.or_, [
                (topic == t) & (partition == p) & offset.between(first, last)
                for (t, p), (first, last) in within.items()
            ]))  # fmt: skip
        rows = (
            table.where(partition >= 0)  # files have no offsets (partition -1)
            .groupBy(topic, partition)
            .agg(F.max(offset).alias("highest"))
            .collect()
        )
        return cls({(r[0], int(r[1])): int(r.highest) for r in rows})

    def written(self, topics: np.ndarray, partitions: Int64s, offsets: Int64s) -> Bools:
        """True for the messages the table holds already; forgets the partitions the batch
        has gone past."""
        held = np.zeros(len(offsets), dtype=bool)
        for (topic, partition), highest in list(self.highest.items()):
            mine = (topics == topic) & (partitions == partition)
            if not mine.any():
                continue
            held |= mine & (offsets <= highest)
            if offsets[mine].min() > highest:
                del self.highest[(topic, partition)]
        return held


@dataclass
class MarkedBatch:
    """A materialised batch with ``is_new`` (null for invalid rows) and what it will write."""

    rows: DataFrame
    new: int  # rows for telemetry
    rejected: int  # rows for quarantine: invalid ones and copies
    kept: tuple[Int64s, Int64s, Int64s]  # key, time, coord of the new events
    times: Int64s  # every valid row's Kafka timestamp


@dataclass
class IngestBatchWriter:
    """``foreachBatch`` function of the ingest query; its input is ``parse_events`` output.

    The query parses on the stream rather than in here: built once, the parse plan is only
    re-optimised per micro-batch instead of built again in Python (hundreds of Column objects
    over py4j) for each one.
    """

    lake_root: str
    app_id: str
    dedup_horizon: str = "10 minutes"
    # The query's checkpoint: its id goes into the appends' txnAppId (see ``checkpoint_id``).
    checkpoint: str | None = None
    # The source has Kafka offsets: what the lake holds is found by them, and the appends carry
    # no transaction id (module docstring). False for a files source.
    offsets: bool = True
    seen: SeenEvents | None = field(default=None, repr=False)
    # What telemetry and quarantine held of the offsets this run reads, loaded at its first
    # batch; None until then.
    held: tuple[WrittenOffsets, WrittenOffsets] | None = field(default=None, repr=False)
    _first_batch: int | None = field(default=None, repr=False)

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        spark = batch.sparkSession
        telemetry_path = lake.table_path(self.lake_root, lake.TELEMETRY)
        quarantine_path = lake.table_path(self.lake_root, lake.QUARANTINE)
        if self._first_batch is None:
            self.start(spark, batch_id)
        laps = Laps()
        marked = self.mark_new_events(batch, laps)
        new_events = valid_events(marked.rows.where(F.col("is_new"))).coalesce(
            max(1, -(-marked.new // ROWS_PER_FILE))
        )
        duplicates = marked.rows.where(F.col("reason").isNull() & ~F.col("is_new")).withColumns(
            {
                "reason": F.lit(c.REASON_DUPLICATE),
                "detail": F.lit("event already ingested (same event_id and event_time)"),
            }
        )
        # A few rows per batch: in one file, not one per Kafka partition (the detection query
        # reads every new file of quarantine as a task of its next batch).
        rejected = quarantined(marked.rows).unionByName(quarantined(duplicates)).coalesce(1)

        def txn(table: str) -> tuple[str, int] | None:
            return None if self.offsets else (f"{self.app_id}-{table}", batch_id)

        took = side_by_side(
            lambda: append(new_events, telemetry_path, rows=marked.new, txn=txn("telemetry")),
            lambda: append(rejected, quarantine_path, rows=marked.rejected,
                           txn=txn("quarantine")),
        )  # fmt: skip
        laps("appends (telemetry {:.2f} s, quarantine {:.2f} s)".format(*took))
        # Only once both are committed: a batch that failed is decided again from the same state.
        self.state(spark).add(*marked.kept, marked.times)
        log.debug("ingest batch %d: %d new, %d rejected; %s", batch_id, marked.new,
                  marked.rejected, laps)  # fmt: skip

    def start(self, spark: SparkSession, batch_id: int) -> None:
        """Name the appends after the checkpoint; load the dedup state."""
        self._first_batch = batch_id
        if self.checkpoint:
            self.app_id = f"{self.app_id}-{checkpoint_id(spark, self.checkpoint)}"
        self.state(spark)

    def load_held(self, batch: DataFrame) -> tuple[WrittenOffsets, WrittenOffsets]:
        """At the run's first batch: which of its offsets the tables hold. Under a new
        checkpoint (batch 0) every offset they hold, which the run may read again; else only
        those of this batch, the one batch a restart can replay (module docstring)."""
        within: Ranges | None = None
        if self._first_batch != 0:
            ranges = (
                batch.groupBy(col.TOPIC, col.PARTITION)
                .agg(F.min(col.OFFSET).alias("first"), F.max(col.OFFSET).alias("last"))
                .collect()
            )
            within = {(r[0], int(r[1])): (int(r.first), int(r.last)) for r in ranges
                      if r[1] is not None and r[1] >= 0}  # fmt: skip
        spark = batch.sparkSession
        return (
            WrittenOffsets.load(spark, lake.table_path(self.lake_root, lake.TELEMETRY), within),
            WrittenOffsets.load(spark, lake.table_path(self.lake_root, lake.QUARANTINE), within),
        )

    def state(self, spark: SparkSession) -> SeenEvents:
        """The events kept within the horizon; loaded from ``telemetry`` at the first batch."""
        if self.seen is None:
            horizon_us = seconds(self.dedup_horizon) * 1_000_000
            self.seen = load_seen_events(spark, self.lake_root, horizon_us)
            log.info("dedup state loaded: %d events within %s", self.seen.size,
                     self.dedup_horizon)  # fmt: skip
        return self.seen

    def mark_new_events(self, parsed: DataFrame, laps: Laps | None = None) -> MarkedBatch:
        """Materialise the batch once and decide which valid rows are new events.

        Only a few numbers per valid row travel to the driver, and only the copies found (usually
        none) travel back, so the decision costs no shuffle and no read of ``telemetry``.
        """
        spark = parsed.sparkSession
        laps = laps or Laps()
        batch = parsed.withColumn(_ROW, F.monotonically_increasing_id()).localCheckpoint(eager=True)
        laps("read and parse")
        # Every row, the invalid ones flagged: their number comes without a count of its own.
        fetched = batch.select(
            F.col(col.REASON).isNull().alias("valid"),
            _ROW,
            event_key(F.col("event_id"), F.col("event_time")).alias("key"),
            F.unix_micros(col.TIMESTAMP).alias("time"),
            coord_key(F.col(col.TOPIC), F.col(col.PARTITION), F.col(col.OFFSET)).alias("coord"),
            F.col(col.TOPIC).alias("topic"),
            F.col(col.PARTITION).alias("partition"),
            F.col(col.OFFSET).alias("offset"),
        ).toArrow()
        keys = fetched.filter(fetched.column("valid"))
        laps("keys to the driver")
        rows, key, times, coord, partition, offset = (
            keys.column(name).to_numpy()
            for name in (_ROW, "key", "time", "coord", "partition", "offset")
        )
        _, topic = np.unique(
            keys.column("topic").to_numpy(zero_copy_only=False), return_inverse=True
        )
        # Rank by source coordinates (then by place, for the files source's equal coordinates):
        # the first copy within the batch is the smallest.
        rank = np.empty(len(rows), dtype=np.int64)
        rank[np.lexsort((rows, offset, partition, topic))] = np.arange(len(rows))
        is_new = self.state(spark).decide(key, times, coord, rank)
        topics = keys.column("topic").to_numpy(zero_copy_only=False)
        held, held_invalid = self.held_rows(batch, topics, partition, offset, is_new)
        copies, kept = rows[~is_new & ~held], np.concatenate([rows[held], held_invalid])
        valid = F.col(col.REASON).isNull()
        if len(copies) or len(kept):
            fates = pd.DataFrame({
                _ROW: np.concatenate([copies, kept]).astype(np.int64),
                "_fate": ["copy"] * len(copies) + ["held"] * len(kept),
            })  # fmt: skip
            fate_rows = driver_frame(spark, fates, f"{_ROW} long, _fate string")
            batch = batch.join(F.broadcast(fate_rows), _ROW, "left")
            marked = batch.where(F.col("_fate").isNull() | (F.col("_fate") != "held"))
            is_new_col = F.when(valid, F.col("_fate").isNull())
        else:
            marked, is_new_col = batch, F.when(valid, F.lit(True))
        new = is_new & ~held
        invalid = fetched.num_rows - len(rows) - len(held_invalid)
        laps("decide")
        return MarkedBatch(
            rows=marked.select(*parsed.columns, is_new_col.alias("is_new")),
            new=int(new.sum()),
            rejected=invalid + int((~is_new & ~held).sum()),
            kept=(key[new], times[new], coord[new]),
            times=times,
        )

    def held_rows(
        self, batch: DataFrame, topics: np.ndarray, partitions: Int64s, offsets: Int64s,
        is_new: Bools,
    ) -> tuple[Bools, Int64s]:  # fmt: skip
        """Which valid rows the lake holds already (new ones in ``telemetry``, copies in
        ``quarantine``), and the row ids of the invalid rows ``quarantine`` holds."""
        if self.held is None:
            self.held = self.load_held(batch) if self.offsets else (
                WrittenOffsets({}), WrittenOffsets({})
            )  # fmt: skip
        in_telemetry, in_quarantine = self.held
        held = np.zeros(len(offsets), dtype=bool)
        if in_telemetry.highest:
            held |= is_new & in_telemetry.written(topics, partitions, offsets)
        if not in_quarantine.highest:
            return held, np.zeros(0, dtype=np.int64)
        invalid = (
            batch.where(F.col(col.REASON).isNotNull())
            .select(
                _ROW,
                F.col(col.TOPIC).alias("topic"),
                F.col(col.PARTITION).alias("partition"),
                F.col(col.OFFSET).alias("offset"),
            )
            .toArrow()
        )
        # Valid and invalid rows together: a partition is forgotten only once all went past it.
        quarantined = in_quarantine.written(
            np.concatenate([topics, invalid.column("topic").to_numpy(zero_copy_only=False)]),
            np.concatenate([partitions, invalid.column("partition").to_numpy()]),
            np.concatenate([offsets, invalid.column("offset").to_numpy()]),
        )
        held |= ~is_new & quarantined[: len(offsets)]
        return held, invalid.column(_ROW).to_numpy()[quarantined[len(offsets) :]]


def load_seen_events(spark: SparkSession, lake_root: str, horizon_us: int) -> SeenEvents:
    """The dedup state as ``telemetry`` holds it: the events that arrived within the horizon of
    the newest one."""
    telemetry = spark.read.format("delta").load(lake.table_path(lake_root, lake.TELEMETRY))
    # max of the bare column: Delta answers it from its file statistics, without a scan.
    newest = telemetry.agg(F.max("kafka_timestamp").alias("t")).select(F.unix_micros("t")).first()
    if newest is None or newest[0] is None:
        return SeenEvents(horizon_us)
    since = F.timestamp_micros(F.lit(newest[0] - horizon_us))
    kept = (
        telemetry.where(F.col("kafka_timestamp") >= since)
        .select(
            event_key(F.col("event_id"), F.col("event_time")).alias("key"),
            F.unix_micros("kafka_timestamp").alias("time"),
            coord_key(*(F.col(name) for name in col.BRONZE_COORDS)).alias("coord"),
        )
        .toArrow()
    )
    key, times, coord = (kept.column(name).to_numpy() for name in ("key", "time", "coord"))
    seen = SeenEvents(horizon_us)
    seen.add(key, times, coord, times)
    return seen
