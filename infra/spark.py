"""The one way to build a SparkSession, with the Kafka connector and Delta configured."""

from __future__ import annotations

import logging
import os
import re
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from infra.jars import spark_connector_jars
from infra.logs import jvm_output, spark_log_conf
from infra.settings import SparkSettings, StackSettings

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
# Whether a RocksDB state store counts the rows it holds. It can count them only by reading each
# key before it writes or removes it, a second read for every key a batch changes
# (docs/PERFORMANCE.md, session 68). Off unless ``SparkSettings.rocksdb_count_rows``; Spark then
# reports 0 rows held, which ``pipeline.metrics`` records as unknown. Rows updated and removed
# are counted either way.
ROCKSDB_COUNTS_ROWS = "spark.sql.streaming.stateStore.rocksdb.trackTotalNumberOfRows"
# The fair scheduler's pools (the file says what each is for). Queries share the task slots of
# one session; a query started in ALERTS_POOL (``scheduler_pool``) gets them first, one in
# INGEST_POOL next.
SCHEDULER_POOLS = Path(__file__).with_name("scheduler_pools.xml")
ALERTS_POOL = "alerts"
INGEST_POOL = "ingest"
# Generated classes the session keeps compiled (Spark's default: 100). A few kilobytes of
# metaspace each; the running pipeline compiles more than 100 within a few batches.
CODEGEN_CACHE_ENTRIES = 1000
# HotSpot's HugeMethodLimit: the largest method (bytes of bytecode) its JIT compiles.
HOTSPOT_HUGE_METHOD_LIMIT = 8000
# A local session's JVM is the whole cluster: the driver and its tasks in one heap (2 GB by
# default, IOT_SPARK_DRIVER_MEMORY), on the cores the queries need. Its objects live for a batch
# or for the session, and its queries wait seconds for a batch anyway: the CPU a collector takes
# matters more than its pauses. In the running pipeline G1 (the JVM's default) ran a concurrent
# marking cycle every 5-7 s, as batch-long objects kept its old generation past its threshold,
# and its marking threads and write barriers took CPU from the queries. The parallel collector
# takes none between its collections; its full collections stop the queries for half a second
# or so, a few times a minute under load (docs/PERFORMANCE.md, session 66). A collector chosen
# for the driver elsewhere is kept: the JVM refuses to start with two.
COLLECTOR = "-XX:+UseParallelGC"
# HotSpot's collectors (-XX:+Use<name>), and the environment variables whose options reach a
# local session's JVM besides the session's own: the JVM's and the java launcher's, and Spark's
# (PySpark's spark-submit arguments, --driver-java-options among them, and SPARK_SUBMIT_OPTS).
# Not seen: spark.driver.extraJavaOptions in a spark-defaults.conf (README, Sizing).
COLLECTORS = ("SerialGC", "ParallelGC", "G1GC", "ZGC", "ShenandoahGC", "EpsilonGC")
JVM_ENVIRONMENT = (
    "JAVA_TOOL_OPTIONS", "JDK_JAVA_OPTIONS", "_JAVA_OPTIONS", "SPARK_SUBMIT_OPTS",
    "PYSPARK_SUBMIT_ARGS",
)  # fmt: skip
_CHOOSES_COLLECTOR = re.compile(r"-XX:\+Use(?:{})\b".format("|".join(COLLECTORS)))
# When HotSpot compiles a method with its optimizing compiler (C2): after 5,000 calls or 40,000
# loop turns by default. A micro-batch calls thousands of methods of Spark's and Delta's
# planning and commits a few times each, so every few batches more of them cross the line, and
# in the running pipeline C2 never stopped compiling them, on the cores the queries need
# (docs/PERFORMANCE.md, session 64). Ten times the thresholds leave such methods to the quick
# compiler (C1); the per-row code of a batch crosses them within seconds and is compiled by C2
# as before.
C2_THRESHOLDS = (
    "-XX:Tier4InvocationThreshold=50000 -XX:Tier4MinInvocationThreshold=6000 "
    "-XX:Tier4CompileThreshold=150000 -XX:Tier4BackEdgeThreshold=400000"
)
# Spark's unit of memory for its hash maps, sorts and broadcast relations (spark.buffer.pageSize),
# held whole from the first row. Spark's default is a sixteenth of a core's share of the heap:
# 32 MB on a 2 GB driver, so a broadcast of a 1,000-device registry held 32 MB, per micro-batch.
# A task can hold 8,192 pages: 2 GB of Spark's memory per task at this size; a row larger than a
# page gets a page of its own size.
PAGE_SIZE = "256k"


def local_java_options(environ: Mapping[str, str]) -> str:
    """The options a local session gives its JVM (spark.driver.defaultJavaOptions; Spark adds
    those given elsewhere after them): the compiler's thresholds, and COLLECTOR unless an
    option in ``environ`` (JVM_ENVIRONMENT) chooses a collector."""
    if any(_CHOOSES_COLLECTOR.search(environ.get(name, "")) for name in JVM_ENVIRONMENT):
        return C2_THRESHOLDS
    return f"{COLLECTOR} {C2_THRESHOLDS}"


def default_shuffle_partitions() -> int:
    """Shuffle partitions: half the cores, at least one. Each stateful partition is a task and a
    state store in every micro-batch, overhead that Spark's default of 200 makes a small machine
    pay. The pipeline's queries run side by side and share the cores among them, so none needs
    a partition per core (docs/PERFORMANCE.md, session 63; measured on two cores only). A
    checkpoint keeps the number it started with."""
    return max(1, (os.cpu_count() or 2) // 2)


def spark_conf(settings: SparkSettings, jars: list[Path]) -> dict[str, str]:
    """The Spark configuration the project relies on, as plain key/value pairs."""
    partitions = settings.shuffle_partitions or default_shuffle_partitions()
    conf = {
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
        "spark.sql.shuffle.partitions": str(partitions),
        "spark.sql.session.timeZone": "UTC",
        "spark.ui.enabled": str(settings.ui_enabled).lower(),
        # `[Stage 12:>   (0 + 2) / 2]` bars on stderr bury a command's own progress line.
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.streaming.stopGracefullyOnShutdown": "true",
        # Small tables are the norm in the lake: no need to write 50 checkpoint files per commit.
        "spark.databricks.delta.snapshotPartitions": str(partitions),
        "spark.sql.streaming.minBatchesToRetain": "20",
        # Delta's VACUUM lists a table's folder with this many tasks; Spark's default (10,000)
        # turns the VACUUM of a small table into tens of thousands of tasks.
        "spark.sql.sources.parallelPartitionDiscovery.parallelism": str(partitions),
        "spark.sql.adaptive.enabled": "false",
        # Compiled query code, shared by all queries. Spark keeps 100 classes; the pipeline's
        # queries and Delta's commits in their batches use more, so the cache evicted code still
        # in use, and every batch waited for it to be compiled again (and the JVM's compilers
        # then compiled the new classes once more).
        "spark.sql.codegen.cache.maxEntries": str(CODEGEN_CACHE_ENTRIES),
        # The JVM never compiles a method of more than 8,000 bytes of bytecode: it interprets it
        # for as long as the query runs. The parse's fused code is such a method. Above this
        # limit Spark runs a stage's operators one by one, each compiled, instead of fused
        # (Spark's documented value for HotSpot).
        "spark.sql.codegen.hugeMethodLimit": str(HOTSPOT_HUGE_METHOD_LIMIT),
        # Detection runs on the driver in pandas: window rows cross to it through Arrow.
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        # The firmware join's update stream is quiet most of the time: with the default (min)
        # policy its stale watermark would hold back the telemetry's, and with it every alert.
        "spark.sql.streaming.multipleWatermarkPolicy": "max",
        # Delta copies a MERGE's source first (a job, and a cached copy) unless it reads only
        # Delta tables, so that a source that could change between the MERGE's two passes
        # cannot. Every MERGE here merges rows the driver holds, which cannot change; a MERGE of
        # a source that can (files being written, a non-Delta table) must copy it ("auto").
        "spark.databricks.delta.merge.materializeSource": "none",
        "spark.scheduler.mode": "FAIR",
        "spark.scheduler.allocation.file": SCHEDULER_POOLS.as_uri(),
        # Every RocksDB store: the silence query's is one whatever ``state_store`` says.
        ROCKSDB_COUNTS_ROWS: str(settings.rocksdb_count_rows).lower(),
    }
    if settings.master.startswith("local"):
        conf["spark.driver.memory"] = settings.driver_memory
        conf["spark.driver.defaultJavaOptions"] = local_java_options(os.environ)
        conf["spark.buffer.pageSize"] = PAGE_SIZE
    if jars:
        conf["spark.jars"] = ",".join(str(p) for p in jars)
    if settings.state_store == "rocksdb":
        conf["spark.sql.streaming.stateStore.providerClass"] = ROCKSDB_PROVIDER
    return conf


def build_spark_session(
    app_name: str,
    settings: SparkSettings | None = None,
    stack: StackSettings | None = None,
    extra_conf: dict[str, str] | None = None,
) -> SparkSession:
    """Build (or return the running) SparkSession with the Kafka source and Delta available.

    Args:
        app_name: shown in the Spark UI and logs.
        settings: master, partitions, memory; read from ``IOT_SPARK_*`` when omitted.
        stack: where the jar cache lives; read from ``IOT_STACK_*`` when omitted.
        extra_conf: any further Spark configuration, applied last.
    """
    from pyspark.sql import SparkSession

    settings = settings or SparkSettings()
    stack = stack or StackSettings()
    # Spark's Python workers must run this interpreter, which has pandas, mlflow and the project.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    jars = spark_connector_jars(stack.cache_dir) if settings.resolve_jars else []

    # The driver JVM's log goes where the command's logging goes (infra.logs).
    conf = {**spark_conf(settings, jars), **spark_log_conf(), **(extra_conf or {})}
    builder = SparkSession.builder.appName(app_name).master(settings.master)
    for key, value in conf.items():
        builder = builder.config(key, value)
    # PySpark starts the JVM unless one started this process (spark-submit).
    starts_jvm = "PYSPARK_GATEWAY_PORT" not in os.environ
    with jvm_output() as log_file:
        try:
            spark = builder.getOrCreate()
        except Exception:
            if log_file is not None:
                log.error("Spark did not start; its output is in %s", log_file)
            raise
    if starts_jvm:
        leave_stop_signals_to_python(spark)
    spark.sparkContext.setLogLevel("WARN")
    log.info(
        "SparkSession %s on %s (%s shuffle partitions)",
        app_name, settings.master, spark.conf.get("spark.sql.shuffle.partitions"),
    )  # fmt: skip
    return spark


def leave_stop_signals_to_python(spark: SparkSession) -> None:
    """Have the driver JVM that PySpark started ignore SIGTERM and SIGHUP (PySpark already has it
    ignore SIGINT, Ctrl-C).

    A stop sent to the whole process group (``kill -- -PGID``) or control group (systemd's default
    ``KillMode``) reached the JVM too. It shut down under the Python driver, which was still
    stopping its queries: the stop was unclean and the command exited 1. The Python process
    stops Spark itself on those signals, and the JVM still ends with it: PySpark's gateway exits
    when its Python process's pipe closes, even on SIGKILL.

    Not for a JVM that started this process (spark-submit): there the JVM is the process a
    container's stop signal reaches, and its own shutdown stops the queries."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    for name in ("TERM", "HUP"):
        jvm.sun.misc.Signal.handle(jvm.sun.misc.Signal(name), jvm.sun.misc.SignalHandler.SIG_IGN)


@contextmanager
def scheduler_pool(spark: SparkSession, pool: str) -> Iterator[None]:
    """Start queries in the fair scheduler's ``pool`` (SCHEDULER_POOLS) inside this block: a
    query keeps the pool of the thread that started it, for its batches and its foreachBatch."""
    context = spark.sparkContext
    before = context.getLocalProperty("spark.scheduler.pool")
    context.setLocalProperty("spark.scheduler.pool", pool)
    try:
        yield
    finally:
        context.setLocalProperty("spark.scheduler.pool", before)  # type: ignore[arg-type]
