"""Keep the lake's tables healthy while the pipeline runs for days: compaction, a bounded
changelog, VACUUM.

A streaming table gets one or more small files per micro-batch; readers (the dashboard, SQL,
a restart's state load) open every file, so their cost grows with the count, not the rows.
``maintain`` runs, per table:

1. ``feature_changes``: deletes the batches no restart reads any more (their windows closed,
   their final rows are in ``features``, and they started before the recent ones a restart
   reads). It is not compacted: its rows are superseded within a batch or two and deleted
   within the next rounds.
2. The others: OPTIMIZE (bin-packing compaction of the small files; files already large are
   left alone, so a table is not rewritten again and again as it grows).
3. VACUUM with the retention of the settings (each table's own, set by
   ``apply_table_properties`` when the pipeline starts): files that compaction or deletion
   replaced are deleted once older than that. Readers still on an older snapshot, streams
   reading behind, and time travel within the retention keep working; the default is Delta's
   own (7 days).

It runs inside ``pipeline run`` every ``IOT_PIPELINE_MAINTENANCE_INTERVAL`` on a thread of its
own, and on demand with ``iotfraud maintain``. Compaction and VACUUM change no data and no
metadata, so they conflict with nothing the streaming queries append, and an alerts MERGE that
meets one is retried (``pipeline.sinks.retry_on_conflict``). The changelog's DELETE does
change data: the running pipeline holds detection's next batch back while it commits
(``prune_changes``). A maintenance step that loses is logged and tried again next time.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field

import pandas as pd
from delta.tables import DeltaTable
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from infra import lake
from pipeline import columns as col
from pipeline.alerts import timestamp_literal
from pipeline.detection import changes_read_from, newest_time
from pipeline.metrics import Laps
from pipeline.settings import PipelineSettings, seconds
from pipeline.sinks import retry_on_conflict

log = logging.getLogger(__name__)

# What keeps the changelog's writer from appending while its trim runs (``prune_changes``).
Hold = Callable[[], AbstractContextManager[object]]

# The tables the pipeline writes, in the order they are maintained.
MAINTAINED = (
    lake.TELEMETRY,
    lake.QUARANTINE,
    lake.FEATURE_CHANGES,
    lake.FEATURES,
    lake.ALERTS,
    lake.PIPELINE_METRICS,
    lake.FIRMWARE_UPDATES,
    lake.FAST_ALERTS,
)
# Compaction leaves files of this size or more alone and writes files up to the larger size.
COMPACT_MIN_FILE_BYTES = 32 * 1024 * 1024
COMPACT_MAX_FILE_BYTES = 128 * 1024 * 1024


@dataclass(frozen=True)
class TableReport:
    """What maintenance did to one table."""

    table: str
    files_before: int
    files_after: int
    rows_deleted: int
    files_vacuumed: int
    seconds: float
    error: str | None = None
    # Seconds per step (trim, compact, vacuum): where a slow round's time went.
    steps: dict[str, float] = field(default_factory=dict)

    def line(self) -> str:
        if self.error:
            return f"{self.table}: failed ({self.error})"
        deleted = f", {self.rows_deleted:,} changelog rows deleted" if self.rows_deleted else ""
        steps = "".join(f", {step} {took:.1f}" for step, took in self.steps.items())
        return (
            f"{self.table}: {self.files_before:,} -> {self.files_after:,} files{deleted}, "
            f"{self.files_vacuumed:,} old files removed ({self.seconds:.1f} s{steps})"
        )


def active_files(table: DeltaTable) -> int:
    """Data files in the table's current snapshot (what a reader opens)."""
    row = table.detail().select("numFiles").first()
    return int(row[0]) if row is not None and row[0] is not None else 0


# Kept beyond what a restart reads (``changes_trim_before``), so that no restart rests on the
# bound to the second.
CHANGES_SLACK_S = 300.0


def changes_trim_before(
    spark: SparkSession, changes: DeltaTable, settings: PipelineSettings
) -> tuple[pd.Timestamp, pd.Timestamp] | None:
    """The changelog's rows of windows that start before the first time and end by the second
    are read by no restart (``pipeline.detection.changes_read_from``), nor by the dashboard and
    SQL, which take a closed window's row from ``features``. None: every row may still be read
    (no window in ``features`` yet)."""
    top = newest_time(changes.toDF(), "last_event_time")
    features = lake.table_path(settings.lake_root, lake.FEATURES)
    if top is None or not DeltaTable.isDeltaTable(spark, features):
        return None
    written_to = newest_time(spark.read.format("delta").load(features), col.WINDOW_END)
    read = changes_read_from(top, written_to, watermark_s=seconds(settings.watermark),
                             window_s=seconds(settings.window))  # fmt: skip
    if read is None:
        return None
    slack = pd.Timedelta(seconds=CHANGES_SLACK_S)
    return read[0] - slack, read[1] - slack


def prune_changes(
    table: DeltaTable, before: tuple[pd.Timestamp, pd.Timestamp], hold: Hold = nullcontext
) -> int:
    """Delete the changelog rows of the batches whose windows all started before
    ``before[0]`` and ended by ``before[1]``; returns how many rows went.

    The DELETE runs inside ``hold()``, which in the running pipeline holds detection's next
    batch back: Delta checks a DELETE as serializable, so an append committed while it runs
    fails it, and detection appends to this table every batch (every second or two at low
    rates): a DELETE that runs for seconds may find no gap, retried or not (docs/PERFORMANCE.md,
    session 78). ``iotfraud maintain`` beside a running pipeline can only retry; when it fails,
    the pipeline's next round trims.

    Whole batches, not rows: every detection batch appends its own files, so a batch deleted
    whole is files removed, none rewritten. Cut at a window's end, the files of the batches
    that straddle the cut were rewritten, with the rows they kept: 710,054 rows copied to delete
    146,885 in 10 minutes of 25,000 devices (docs/PERFORMANCE.md). A straddling batch goes at
    the next round. Grouped by batch id, so a batch id used twice (a checkpoint started afresh)
    goes only when all its rows may.
    """
    starts, ends = before
    done = (
        table.toDF()
        .groupBy(col.BATCH_ID)
        .agg(
            F.max(col.WINDOW_START).alias("start"),
            F.max(col.WINDOW_END).alias("end"),
            F.count(F.lit(1)).alias("rows"),
        )
        .where(
            (F.col("start") < timestamp_literal(starts)) & (F.col("end") <= timestamp_literal(ends))
        )
        .collect()
    )
    rows = sum(int(row["rows"]) for row in done)
    if done:
        ids = [row[col.BATCH_ID] for row in done]
        with hold():
            started = time.monotonic()
            retry_on_conflict(lambda: table.delete(F.col(col.BATCH_ID).isin(ids)),
                              "the trim of feature_changes")  # fmt: skip
            took = time.monotonic() - started
        # In the running pipeline, what the trim cost detection: its next batch waited this long.
        log.info("feature_changes: %d batches (%d rows) deleted in %.1f s", len(ids), rows, took)
    return rows


RETENTION = "delta.deletedFileRetentionDuration"
CHECKPOINT_INTERVAL = "delta.checkpointInterval"


def retention_property(retention: str) -> str:
    return f"interval {seconds(retention)} seconds"


def table_properties(settings: PipelineSettings) -> dict[str, str]:
    """The Delta table properties the settings give every table the pipeline writes.

    The checkpoint interval: Delta writes a checkpoint of a table's log in the commit whose
    version is a multiple of it, before that commit returns. At Delta's default of 10, one
    micro-batch in ten of every query waited seconds for one (docs/PERFORMANCE.md); the price of
    a longer interval is the commits a reader replays since the last checkpoint.
    """
    return {
        RETENTION: retention_property(settings.vacuum_retention),
        CHECKPOINT_INTERVAL: str(settings.delta_checkpoint_interval),
    }


def apply_table_properties(spark: SparkSession, settings: PipelineSettings) -> None:
    """Give the tables the pipeline writes the properties of ``table_properties``: those this
    session creates from now on (session defaults) and those that exist. Run it before the
    streaming queries start: a table property is a metadata change, and a concurrent append fails
    on it (``MetadataChangedException``), so maintenance itself never changes one.
    """
    wanted = table_properties(settings)
    for key, value in wanted.items():
        spark.conf.set(f"spark.databricks.delta.properties.defaults.{key.removeprefix('delta.')}",
                       value)  # fmt: skip
    for name in MAINTAINED:
        path = lake.table_path(settings.lake_root, name)
        if not DeltaTable.isDeltaTable(spark, path):
            continue
        # The table's metadata only (DESCRIBE DETAIL would also count its files: a job a table).
        shown = spark.sql(f"SHOW TBLPROPERTIES delta.`{path}`").collect()
        properties = {row.key: row.value for row in shown}
        changed = {k: v for k, v in wanted.items() if properties.get(k) != v}
        if changed:
            pairs = ", ".join(f"'{k}' = '{v}'" for k, v in changed.items())
            spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ({pairs})")


def maintain_table(
    spark: SparkSession, name: str, path: str, settings: PipelineSettings, hold: Hold = nullcontext
) -> TableReport | None:
    if not DeltaTable.isDeltaTable(spark, path):
        return None
    started = time.monotonic()
    table = DeltaTable.forPath(spark, path)
    before = active_files(table)
    laps = Laps()
    deleted = 0
    if name == lake.FEATURE_CHANGES:
        # Trimmed, not compacted: nearly every row in it is superseded by a later batch's row of
        # the same window and deleted within the next rounds. Compaction rewrote them all
        # (about 3.5 GB an hour at 25,000 devices), while its readers (a restart, the
        # dashboard) read the recent windows, mostly in files written since the last round.
        cut = changes_trim_before(spark, table, settings)
        if cut is not None:
            deleted = prune_changes(table, cut, hold)
        laps("trim")
    else:
        table.optimize().executeCompaction()
        laps("compact")
    # VACUUM takes the table's own retention (``apply_table_properties`` set it from settings).
    # The Python API's vacuum() says nothing of what it deleted; a dry run lists it first.
    vacuumed = spark.sql(f"VACUUM delta.`{path}` DRY RUN").count()
    if vacuumed:
        table.vacuum()
    laps("vacuum")
    return TableReport(
        table=name,
        files_before=before,
        files_after=active_files(table),
        rows_deleted=deleted,
        files_vacuumed=vacuumed,
        seconds=time.monotonic() - started,
        steps=laps.seconds(),
    )


def maintain(
    spark: SparkSession,
    settings: PipelineSettings,
    *,
    compaction_jobs: int | None = 1,
    hold_changes: Hold = nullcontext,
) -> list[TableReport]:
    """Maintain every table the pipeline writes; a table that fails is reported, not raised.

    ``hold_changes``: keeps ``feature_changes``'s writer (detection) from appending while its
    trim commits (``prune_changes``).

    ``compaction_jobs``: how many files OPTIMIZE writes at a time (Delta's default, 15, if
    None). Each is one task that holds a core until its file is written, seconds at a time, and
    a running task is never preempted; beside the streaming queries one at a time leaves them
    the other cores (docs/PERFORMANCE.md).
    """
    spark.conf.set("spark.databricks.delta.optimize.minFileSize", str(COMPACT_MIN_FILE_BYTES))
    spark.conf.set("spark.databricks.delta.optimize.maxFileSize", str(COMPACT_MAX_FILE_BYTES))
    if compaction_jobs is not None:
        spark.conf.set("spark.databricks.delta.optimize.maxThreads", str(compaction_jobs))
    reports = []
    for name in MAINTAINED:
        path = lake.table_path(settings.lake_root, name)
        try:
            report = maintain_table(spark, name, path, settings, hold_changes)
        except Exception as exc:
            first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc)
            log.warning("maintenance of %s failed, will try again next time: %s", name, first_line)
            report = TableReport(name, 0, 0, 0, 0, 0.0, error=first_line[:300])
        if report is not None:
            log.info("maintenance: %s", report.line())
            reports.append(report)
    return reports
