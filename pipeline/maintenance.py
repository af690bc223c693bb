"""Keep the lake's tables healthy while the pipeline runs for days: compaction, a bounded
changelog, VACUUM.

A streaming table gets one or more small files per micro-batch; readers (the dashboard, SQL,
a restart's state load) open every file, so their cost grows with the count, not the rows.
``maintain`` runs, per table:

1. ``feature_changes`` only: deletes the rows no restart reads any more (windows that closed
   long ago; their final rows are in ``features``).
2. OPTIMIZE (bin-packing compaction of the small files; files already large are left alone, so
   a table is not rewritten again and again as it grows).
3. VACUUM with the retention of the settings (each table's own, set by
   ``apply_table_properties`` when the pipeline starts): files that compaction or deletion
   replaced are deleted once older than that. Readers still on an older snapshot, streams
   reading behind, and time travel within the retention keep working; the default is Delta's
   own (7 days).

It runs inside ``pipeline run`` every ``IOT_PIPELINE_MAINTENANCE_INTERVAL`` on a thread of its
own, and on demand with ``iotfraud maintain``. Its commits change neither data nor metadata, so
they conflict with nothing the streaming queries append, and an alerts MERGE that meets one is
retried (``pipeline.sinks.retry_on_conflict``); a maintenance step that loses is logged and
tried again next time.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from delta.tables import DeltaTable
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from infra import lake
from pipeline import columns as col
from pipeline.settings import PipelineSettings, seconds

log = logging.getLogger(__name__)

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

    def line(self) -> str:
        if self.error:
            return f"{self.table}: failed ({self.error})"
        deleted = f", {self.rows_deleted:,} changelog rows deleted" if self.rows_deleted else ""
        return (
            f"{self.table}: {self.files_before:,} -> {self.files_after:,} files{deleted}, "
            f"{self.files_vacuumed:,} old files removed ({self.seconds:.1f} s)"
        )


def active_files(table: DeltaTable) -> int:
    """Data files in the table's current snapshot (what a reader opens)."""
    row = table.detail().select("numFiles").first()
    return int(row[0]) if row is not None and row[0] is not None else 0


def changes_kept_s(settings: PipelineSettings) -> float:
    """How far back, from the newest event, ``feature_changes`` must reach: a restart reads the
    windows that may still be open, and those closed by the last batches whose ``features``
    append had not run yet (``pipeline.detection.load_state``); an hour more is slack."""
    return seconds(settings.watermark) + 2 * seconds(settings.window) + 3600


def prune_changes(spark: SparkSession, table: DeltaTable, keep_s: float) -> int:
    """Delete the changelog rows of windows that ended more than ``keep_s`` before the newest
    event; returns how many rows went."""
    newest = table.toDF().agg(F.max("last_event_time")).first()
    if newest is None or newest[0] is None:
        return 0
    cutoff = F.lit(newest[0]) - F.expr(f"INTERVAL {int(keep_s)} SECONDS")
    before = table.toDF().where(F.col(col.WINDOW_END) < cutoff).count()
    if before:
        table.delete(F.col(col.WINDOW_END) < cutoff)
    return before


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
    spark: SparkSession, name: str, path: str, settings: PipelineSettings
) -> TableReport | None:
    if not DeltaTable.isDeltaTable(spark, path):
        return None
    started = time.monotonic()
    table = DeltaTable.forPath(spark, path)
    before = active_files(table)
    deleted = prune_changes(spark, table, changes_kept_s(settings)) if (
        name == lake.FEATURE_CHANGES
    ) else 0  # fmt: skip
    table.optimize().executeCompaction()
    # VACUUM takes the table's own retention (``apply_table_properties`` set it from settings).
    # The Python API's vacuum() says nothing of what it deleted; a dry run lists it first.
    vacuumed = spark.sql(f"VACUUM delta.`{path}` DRY RUN").count()
    if vacuumed:
        table.vacuum()
    return TableReport(
        table=name,
        files_before=before,
        files_after=active_files(table),
        rows_deleted=deleted,
        files_vacuumed=vacuumed,
        seconds=time.monotonic() - started,
    )


def maintain(spark: SparkSession, settings: PipelineSettings) -> list[TableReport]:
    """Maintain every table the pipeline writes; a table that fails is reported, not raised."""
    spark.conf.set("spark.databricks.delta.optimize.minFileSize", str(COMPACT_MIN_FILE_BYTES))
    spark.conf.set("spark.databricks.delta.optimize.maxFileSize", str(COMPACT_MAX_FILE_BYTES))
    reports = []
    for name in MAINTAINED:
        path = lake.table_path(settings.lake_root, name)
        try:
            report = maintain_table(spark, name, path, settings)
        except Exception as exc:
            first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc)
            log.warning("maintenance of %s failed, will try again next time: %s", name, first_line)
            report = TableReport(name, 0, 0, 0, 0, 0.0, error=first_line[:300])
        if report is not None:
            log.info("maintenance: %s", report.line())
            reports.append(report)
    return reports
