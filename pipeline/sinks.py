"""Delta writes that are safe to repeat: idempotent appends, MERGE retried on conflicts."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import pandas as pd
import pyarrow as pa
from delta.tables import DeltaTable
from pyspark import InheritableThread
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from infra import contract as c
from infra import lake

log = logging.getLogger(__name__)

# Tables the pipeline writes whose schema the contract fixes; created empty at start.
CONTRACT_TABLES: dict[str, c.Columns] = {
    lake.TELEMETRY: c.TELEMETRY_COLUMNS,
    lake.QUARANTINE: c.QUARANTINE_COLUMNS,
    lake.ALERTS: c.ALERTS_COLUMNS,
    lake.PIPELINE_METRICS: c.PIPELINE_METRICS_COLUMNS,
    lake.DEVICES: c.DEVICES_COLUMNS,
    lake.FIRMWARE_UPDATES: c.FIRMWARE_UPDATES_COLUMNS,
    lake.FAST_ALERTS: c.FAST_ALERTS_COLUMNS,
}
PARTITIONED_BY: dict[str, tuple[str, ...]] = {lake.ALERTS: c.ALERTS_PARTITIONED_BY}


def driver_frame(
    spark: SparkSession,
    data: pd.DataFrame | list[dict[str, Any]] | list[tuple[Any, ...]],
    schema: str | StructType,
) -> DataFrame:
    """Rows the driver holds (pandas, or a list of dicts or of tuples in the schema's order) as a
    Spark frame of one partition.

    Through pandas and Arrow, never as a Python list: Spark turns a list into rows in Python
    workers, one task per core each time the frame is read (and a reused worker collects its
    garbage after every task, 0.1-0.2 s with the silence query's state in it). Spark also splits
    local data into one partition per core, and a write of it into one file per partition: a
    few rows then make several files, each a task in every later read, scan and MERGE of the
    table, queued behind the other queries' tasks on a busy machine."""
    struct = schema if isinstance(schema, StructType) else ddl_schema(schema)
    if not isinstance(data, pd.DataFrame):
        # A dict's keys name its values (one left out is null); a tuple's order does.
        data = pd.DataFrame.from_records(data, columns=struct.fieldNames())
    if not len(data):  # Spark sends an empty pandas frame as a list; an Arrow table it does not
        return spark.createDataFrame(pa.Table.from_pandas(data, preserve_index=False), struct)
    return spark.createDataFrame(data, struct).coalesce(1)


def ddl_schema(ddl: str) -> StructType:
    """``"a string, b long"`` as a StructType (needs a running SparkContext; runs no job)."""
    struct = StructType.fromDDL(ddl)
    assert isinstance(struct, StructType)
    return struct


def ensure_table(
    spark: SparkSession, path: str, columns: c.Columns, partitioned_by: tuple[str, ...] = ()
) -> None:
    """Create an empty Delta table with the contract's schema (and partitioning) unless one exists
    at ``path``; add the contract's columns an existing table lacks (written by an older version:
    its rows hold null there), and rewrite, once, one partitioned otherwise."""
    if DeltaTable.isDeltaTable(spark, path):
        present = set(spark.read.format("delta").load(path).columns)
        missing = tuple((name, kind) for name, kind in columns if name not in present)
        if missing:
            log.info("adding columns %s to Delta table %s", [n for n, _ in missing], path)
            spark.sql(f"ALTER TABLE delta.`{path}` ADD COLUMNS ({c.spark_ddl(missing)})")
        if partitioned_by:
            _partition(spark, path, partitioned_by)
        return
    log.info("creating Delta table %s", path)
    # A commit of the schema alone: writing an empty DataFrame would run a job as well.
    schema = ddl_schema(c.spark_ddl(columns))
    create = DeltaTable.createIfNotExists(spark).location(path).addColumns(schema)
    (create.partitionedBy(*partitioned_by) if partitioned_by else create).execute()


def _partition(spark: SparkSession, path: str, partitioned_by: tuple[str, ...]) -> None:
    """Rewrite the table at ``path`` partitioned by ``partitioned_by`` if it is not (a table an
    older version created): one commit, which keeps its rows, history and properties."""
    current = DeltaTable.forPath(spark, path).detail().select("partitionColumns").first()
    if current is not None and tuple(current[0]) == partitioned_by:
        return
    log.warning(
        "rewriting Delta table %s partitioned by %s (once)", path, ", ".join(partitioned_by)
    )
    (
        spark.read.format("delta").load(path)
        .write.format("delta").mode("overwrite").option("overwriteSchema", "true")
        .partitionBy(*partitioned_by).save(path)
    )  # fmt: skip


def ensure_tables(spark: SparkSession, lake_root: str) -> None:
    for table, columns in CONTRACT_TABLES.items():
        path = lake.table_path(lake_root, table)
        ensure_table(spark, path, columns, PARTITIONED_BY.get(table, ()))


def idempotent_append(
    df: DataFrame,
    path: str,
    app_id: str,
    version: int,
    *,
    rows: int | None = None,
    merge_schema: bool = False,
) -> None:
    """Append ``df`` once: Delta skips a write whose (txnAppId, txnVersion) it has committed.

    An empty ``df`` writes nothing: an empty commit would still cost a Delta version and its log
    write, and skipping a version is safe (Delta compares a later write's version with the
    highest one committed). ``rows``, when the caller knows it, spares the job that would find
    out whether ``df`` is empty.
    ``merge_schema`` adds columns ``df`` has that the table lacks (features added by an upgrade).
    """
    append(df, path, rows=rows, merge_schema=merge_schema, txn=(app_id, version))


def append(
    df: DataFrame,
    path: str,
    *,
    rows: int | None = None,
    merge_schema: bool = False,
    txn: tuple[str, int] | None = None,
) -> None:
    """Append ``df`` (nothing when empty, as ``idempotent_append``), with the Delta transaction
    id ``txn`` when given. Without it, a replayed batch appends again: only for a table whose
    writer or readers make that harmless. The id has a price: delta-spark 4.4.0 finds its last
    version with a job over the table's state before every append that carries one."""
    if rows == 0 or (rows is None and df.isEmpty()):
        return
    writer = (
        df.write.format("delta").mode("append").option("mergeSchema", str(merge_schema).lower())
    )
    if txn is not None:
        writer = writer.option("txnAppId", txn[0]).option("txnVersion", txn[1])
    writer.save(path)


def checkpoint_id(spark: SparkSession, checkpoint: str) -> str:
    """The id a streaming query keeps in its checkpoint (``metadata``), on any file system.

    Appends keyed by batch id name their ``txnAppId`` after it: a new checkpoint numbers its
    batches from 0 again, and under the old name Delta would skip them as already committed.
    """
    import json

    line = spark.read.text(f"{checkpoint.rstrip('/')}/metadata").first()
    if line is None:
        raise RuntimeError(f"no query id in {checkpoint}/metadata")
    return str(json.loads(line[0])["id"])


def hadoop_path(spark: SparkSession, path: str) -> tuple[Any, Any]:
    """``path`` on Spark's Hadoop file system (the lake's credentials, any scheme): the file
    system and the JVM ``Path``."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    where = jvm.org.apache.hadoop.fs.Path(path)
    return where.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration()), where


# What Spark requires empty in a checkpoint without a batch (see ``discard_unstarted_batch``).
_BATCH_LOGS = ("offsets", "commits")
_UNSTARTED = (*_BATCH_LOGS, "state")


def discard_unstarted_batch(spark: SparkSession, checkpoint: str) -> list[str]:
    """Delete what a query killed while it logged its first batch left in ``checkpoint``;
    return the paths deleted (none for a checkpoint with a batch, or a new one).

    Spark logs a batch's offsets into a temporary file that it then renames. A kill between the
    two leaves ``offsets/`` holding only that file: Spark reads the checkpoint as a query not yet
    started, finds ``offsets/`` not empty and refuses to start, at every start after
    (STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY). With no batch in ``offsets/`` nor in
    ``commits/``, the query processed and committed nothing: its leftovers go and it starts at
    batch 0, as it would have. ``metadata`` (the query's id, which names the appends'
    txnAppId) and ``sources/`` (the starting offsets resolved at the first start) stay.
    """
    fs, root = hadoop_path(spark, checkpoint)
    jvm = spark.sparkContext._jvm
    assert jvm is not None

    def entries(name: str) -> list[Any]:
        folder = jvm.org.apache.hadoop.fs.Path(root, name)
        return list(fs.listStatus(folder)) if fs.exists(folder) else []

    if any(e.getPath().getName().isdigit() for log_ in _BATCH_LOGS for e in entries(log_)):
        return []
    left = [str(e.getPath()) for name in _UNSTARTED for e in entries(name)]
    if left:
        log.warning("%s holds no batch but %s: left by a query killed as it logged its first "
                    "batch; deleted, the query starts at batch 0", checkpoint, left)  # fmt: skip
        for name in _UNSTARTED:
            fs.delete(jvm.org.apache.hadoop.fs.Path(root, name), True)
    return left


def side_by_side(*writes: Callable[[], None]) -> list[float]:
    """Run ``writes`` (to different tables) at the same time; return when all are done, with
    the seconds each took (for the debug log: which of them the batch waited for).

    A Delta write spends much of its time in planning and in its commit rather than on the
    cores, so two together take little more than the longer one. The first error is raised
    after every write has finished, so a failed batch never leaves a write running behind it.
    """
    errors: list[BaseException] = []
    seconds = [0.0] * len(writes)

    def run(i: int) -> None:
        start = time.perf_counter()
        try:
            writes[i]()
        except BaseException as exc:  # raised below, in the caller's thread
            errors.append(exc)
        seconds[i] = time.perf_counter() - start

    # InheritableThread carries Spark's thread-local properties (job group, scheduler pool).
    threads = [InheritableThread(target=run, args=(i,), daemon=True) for i in range(1, len(writes))]
    for thread in threads:
        thread.start()
    run(0)
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return seconds


class AfterBatch:
    """Writes a micro-batch leaves to run after it has returned, in order, on a thread of their
    own; one batch's at a time, in batch order (``start`` first waits for the last ones).

    Spark runs the next batch once ``foreachBatch`` returns, and cancels the query's job group
    when it stops: the writes run in a job group of their own (the query's, with
    ``JOB_GROUP_SUFFIX``), so that a stop does not cut them; the stop waits for them (``wait``).
    The next batch may wait for the first of them only (``wait_first``), when it holds the next
    batch's writes (``start``'s ``hold_next``). A failed write fails
    every later wait and ``start``: the next batch stops the query, and the next start does again
    what the writes would have done (``pipeline.detection``).
    """

    JOB_GROUP_SUFFIX = " after its batch"

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._first = threading.Event()
        self._first.set()

    def start(
        self, spark: SparkSession, what: str, *writes: Callable[[], None], hold_next: bool = True
    ) -> None:
        """Run ``writes`` one after the other, each once the one before it succeeded, when the
        last batch's are done; the debug log says ``what`` and their seconds. ``hold_next``: the
        next batch's ``wait_first`` waits for the first of them."""
        self.wait()
        context = spark.sparkContext
        group = context.getLocalProperty("spark.jobGroup.id")
        first = self._first = threading.Event()
        if not hold_next:
            first.set()

        def run() -> None:
            if group:
                context.setJobGroup(group + self.JOB_GROUP_SUFFIX, "a write after its batch")
            took = []
            try:
                for write in writes:
                    began = time.perf_counter()
                    write()
                    took.append(f"{time.perf_counter() - began:.2f}")
                    first.set()
            except BaseException as exc:  # raised by the next wait, in the batch's thread
                self._error = exc
                log.error("%s failed: %s", what, exc)
                return
            finally:
                first.set()  # after the error is recorded: a wait then raises it
            log.debug("%s, after it: %s s", what, " + ".join(took))

        # InheritableThread carries Spark's thread-local properties (scheduler pool).
        self._thread = InheritableThread(target=run, name="after-batch", daemon=True)
        self._thread.start()

    def wait_first(self) -> float:
        """Return once the first of the last batch's writes is done (the others may still run),
        with the seconds waited; raise if it (or an earlier one) failed."""
        began = time.perf_counter()
        self._first.wait()
        self.check()
        return time.perf_counter() - began

    def wait(self) -> None:
        """Return once the last writes are done; raise if one of them (or an earlier one)
        failed."""
        if self._thread is not None:
            self._thread.join()
        self.check()

    def check(self) -> None:
        """Raise if a write failed; one still running is not waited for."""
        if self._error is not None:
            raise RuntimeError("a write left to run after its micro-batch failed; the next "
                               "start does it again") from self._error  # fmt: skip


def is_write_conflict(exc: BaseException) -> bool:
    """A Delta commit that lost to a concurrent writer (``io.delta.exceptions.Concurrent*``)."""
    text = str(exc)
    return "DELTA_CONCURRENT" in text or "io.delta.exceptions.Concurrent" in text


def retry_on_conflict(write: Callable[[], None], what: str, attempts: int = 5) -> None:
    """Run ``write``, again when it conflicted with a concurrent commit to the same table.

    The detectors' writes to ``alerts`` never conflict with each other (each writes its own
    partitions, ``infra.contract.ALERTS_PARTITIONED_BY``), but a compaction can commit in between
    (the pipeline's periodic maintenance, ``iotfraud maintain``). A MERGE that lost commits
    nothing, and running it again is safe because MERGEs on deterministic keys are idempotent.
    """
    for attempt in range(1, attempts + 1):
        try:
            write()
            return
        except Exception as exc:
            if attempt == attempts or not is_write_conflict(exc):
                raise
            log.info("%s conflicted with a concurrent commit; retrying (%d)", what, attempt)
            time.sleep(0.2 * attempt)
