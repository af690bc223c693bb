"""The one SparkSession (``infra.spark``), on the real JVM."""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from infra import contract as c
from infra.java import java_executable
from infra.spark import COLLECTORS, JVM_ENVIRONMENT, local_java_options
from pipeline.alerts import alert_frame, as_written, merge_alerts
from pipeline.firmware import parse_firmware_updates
from pipeline.job import session_conf
from pipeline.sinks import ensure_table
from pipeline.transforms import parse_events, senders

RAW_DDL = "key string, value binary, topic string, partition int, offset long, timestamp timestamp"


def compilation_count(spark: SparkSession) -> Any:
    """Spark's count of the code it compiled (Janino), over the JVM's life."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    return jvm.org.apache.spark.metrics.source.CodegenMetrics.METRIC_COMPILATION_TIME()


@contextmanager
def generated_code(spark: SparkSession) -> Iterator[None]:
    """The session compiles its queries' code, as the pipeline's does: the test step runs Spark's
    expressions interpreted (tests/spark-conf)."""
    with (
        session_conf(spark, "spark.sql.codegen.factoryMode", "CODEGEN_ONLY"),
        session_conf(spark, "spark.sql.codegen.wholeStage", "true"),
    ):
        yield


# More distinct compiled queries than Spark's default cache of generated classes (100) holds.
DISTINCT_QUERIES = 150


def test_code_compiled_once_is_not_compiled_again_while_many_queries_run(
    spark: SparkSession,
) -> None:
    """Spark compiles the code of each query's operators and expressions (Janino), and keeps the
    compiled classes in a cache shared by every query of the session. The running pipeline's
    queries, and Delta's reads and commits in each of their batches, need several hundred such
    classes, some new every batch. With Spark's default of 100 the cache evicted classes still
    in use: they were compiled again, loaded as new classes, and compiled again by the JVM's own
    compilers, which then took most of a core (docs/PERFORMANCE.md). The session keeps more.

    Here: 20 queries compiled, then 150 others, then the first 20 again. Their code must come
    from the cache. With the default cache size, all 20 are compiled again."""
    compilations = compilation_count(spark)

    def run(i: int) -> None:
        # A literal is part of the generated code: each i is code of its own.
        rows = spark.range(3).selectExpr(f"id * {i} + {i} AS v").collect()
        assert [row.v for row in rows] == [i, 2 * i, 3 * i]

    with generated_code(spark):
        before = compilations.getCount()
        for i in range(1, 21):
            run(i)
        first = compilations.getCount()
        assert first > before, "the queries compiled nothing: is code generation off?"
        for i in range(1_000, 1_000 + DISTINCT_QUERIES):
            run(i)
        assert compilations.getCount() - first >= DISTINCT_QUERIES
        recompiled = []
        for i in range(1, 21):
            count = compilations.getCount()
            run(i)
            if compilations.getCount() > count:
                recompiled.append(i)
        # Up to 2: the JVM is shared with the worker's other tests, whose streams may still be
        # stopping. Evicted, all 20 are compiled again.
        assert len(recompiled) <= 2, (
            f"queries compiled a moment ago were compiled again: {recompiled}; the cache of "
            "generated classes is smaller than the queries' code (spark.sql.codegen.cache."
            "maxEntries)"
        )


@pytest.mark.parametrize(
    "parse", [parse_events, senders, parse_firmware_updates], ids=lambda f: f.__name__
)
def test_a_parse_run_again_compiles_nothing(
    spark: SparkSession, tmp_path: Path, parse: Callable[[DataFrame], DataFrame]
) -> None:
    """Every micro-batch plans its query again, and its code comes from the cache when it is the
    code of the batch before. The parses are the largest (thousands of lines of Java). A value in
    them that changes from one run to the next (``current_timestamp()`` did: Spark makes it a
    literal of the run's time) is new code every batch, compiled before the batch can run."""
    sent = datetime(2026, 12, 2, 12, 0, tzinfo=timezone.utc)
    values = [b'{"device_id": "dev-1", "event_time": "2026-12-02T12:00:00Z"}', b"{}", b"not json"]
    path = str(tmp_path / "raw")
    rows = [("dev-1", v, "t", 0, i, sent) for i, v in enumerate(values)]
    spark.createDataFrame(rows, RAW_DDL).write.parquet(path)  # a scan Spark compiles code for
    compilations = compilation_count(spark)
    with generated_code(spark):
        parse(spark.read.parquet(path)).collect()
        first = compilations.getCount()
        again = parse(spark.read.parquet(path)).collect()
        assert compilations.getCount() == first, "the second run compiled its code again"
    assert len(again) == len(values)


def test_a_merge_of_alerts_compiles_no_new_code_and_copies_no_source(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A detection batch that closes windows MERGEs the final values of their alerts, and the
    next batch waits for it. Spark compiles code for the MERGE (several classes of 20-100 KB),
    with the MERGE's bounds on the window start in it: bounds that moved with every MERGE, as
    windows close a slide apart, were new code to compile every time. And Delta copied the
    MERGE's source first, a job of its own, unless told the source cannot change.

    Here: MERGEs of alerts (new ones: the MERGE's plan has both its update and its insert
    clauses whichever it takes) on windows 5 minutes apart, in one hour. Once the first two have
    compiled the MERGE's code, the next ones compile nothing (bounds to the second: 3 classes
    each) and run 5 Spark jobs each (6 with the copy)."""
    path = str(tmp_path / "alerts")
    ensure_table(spark, path, c.ALERTS_COLUMNS, c.ALERTS_PARTITIONED_BY)
    start = pd.Timestamp("2026-12-03 08:00:00")

    def alert_on_window(i: int) -> pd.DataFrame:
        window = start + pd.Timedelta(minutes=5 * i)
        windows = pd.DataFrame([{
            "device_id": f"d{i}", "window_start": window,
            "window_end": window + pd.Timedelta(minutes=10), "first_event_time": window,
            "last_event_time": window + pd.Timedelta(minutes=4),
        }])  # fmt: skip
        raised = alert_frame(windows, "flood", "high", pd.Series([0.9]), pd.Series(["40 events"]))
        return as_written(raised, i, window + pd.Timedelta(minutes=15))

    compilations = compilation_count(spark)
    context = spark.sparkContext
    with generated_code(spark):
        for i in range(2):
            merge_alerts(spark, alert_on_window(i), path)
        before = compilations.getCount()
        jobs = []
        for i in range(2, 5):
            context.setJobGroup(f"merge {i} {tmp_path}", "a test MERGE")
            merge_alerts(spark, alert_on_window(i), path)
            jobs.append(len(context.statusTracker().getJobIdsForGroup(f"merge {i} {tmp_path}")))
        compiled = compilations.getCount() - before
    context.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
    assert spark.read.format("delta").load(path).count() == 5, "a MERGE lost or doubled a row"
    # Up to 2: the JVM is shared with the worker's other tests (see above).
    assert compiled <= 2, f"three MERGEs compiled {compiled} classes: new code for each MERGE"
    assert max(jobs) <= 5, f"Spark jobs per MERGE: {jobs}; Delta copies the source first?"


def broadcast_sizes(frame: DataFrame) -> list[int]:
    """Spark's "data size" (bytes) of each broadcast relation in ``frame``'s executed plan, as
    its UI shows it; run the frame first."""
    sizes = []
    nodes = [frame._jdf.queryExecution().executedPlan()]
    while nodes:
        node = nodes.pop()
        if node.nodeName() == "BroadcastExchange":
            sizes.append(node.metrics().apply("dataSize").value())
        children = node.children()
        nodes.extend(children.apply(i) for i in range(children.size()))
    return sizes


def test_a_broadcast_registry_holds_the_memory_its_rows_need(spark: SparkSession) -> None:
    """Every detection micro-batch joins its events with a broadcast of the registry: a new
    relation each batch, kept in the driver's heap until Spark's cleaner drops it. Spark built
    it in pages of its default size, a sixteenth of a core's share of the memory (32 MB on a
    2 GB driver), taken whole for the first row. A 1,000-device registry then held 32 MB per
    batch, and hundreds of MB in all at 500 events/s (docs/PERFORMANCE.md).

    Here: a registry of 1,000 devices broadcast and joined; the relation must hold under 1 MB
    (one 256 KB page and its hash table: 294,912 bytes)."""
    registry = spark.range(1_000).selectExpr(
        "concat('dev-', id) AS device_id", "'thermostat' AS device_type", "'th-3.0.5' AS firmware"
    )
    events = spark.createDataFrame([("dev-7",), ("dev-999",), ("rogue",)], "device_id string")
    joined = events.join(F.broadcast(registry), "device_id", "left")
    rows = sorted(joined.collect(), key=lambda row: row.device_id)
    assert [(row.device_id, row.device_type) for row in rows] == [
        ("dev-7", "thermostat"), ("dev-999", "thermostat"), ("rogue", None)
    ]  # fmt: skip
    sizes = broadcast_sizes(joined)
    assert len(sizes) == 1, f"expected the registry's one broadcast in the plan, found {sizes}"
    assert sizes[0] < 1024 * 1024, (
        f"a broadcast of 1,000 registry rows holds {sizes[0]:,} bytes: a page of "
        "spark.buffer.pageSize per relation, taken whole"
    )


@pytest.mark.parametrize(
    ("environment", "collector"),
    [({}, "UseParallelGC"), ({"JAVA_TOOL_OPTIONS": "-XX:+UseSerialGC"}, "UseSerialGC")],
)
def test_a_local_session_s_jvm_collects_with_the_parallel_collector_unless_told_otherwise(
    environment: dict[str, str], collector: str
) -> None:
    """A local session's JVM runs the driver and the tasks on the cores the queries need: the
    parallel collector takes no CPU between its collections, where G1 ran a marking cycle every
    5-7 s in the running pipeline (docs/PERFORMANCE.md, session 66). A collector its environment
    chooses is kept: a JVM given two does not start ("Multiple garbage collectors selected").

    Here: a JVM started with a local session's options (``infra.spark.local_java_options``),
    with and without a collector in JAVA_TOOL_OPTIONS."""
    env = {key: value for key, value in os.environ.items() if key not in JVM_ENVIRONMENT}
    env.update(environment)
    options = local_java_options(env).split()
    run = subprocess.run(
        [java_executable(), *options, "-XX:+PrintFlagsFinal", "-version"],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert run.returncode == 0, f"the JVM did not start with {options}: {run.stderr}"
    flags = dict(re.findall(r"^\s*bool (\w+)\s+= (true|false)", run.stdout, re.MULTILINE))
    chosen = [f"Use{name}" for name in COLLECTORS if flags.get(f"Use{name}") == "true"]
    assert chosen == [collector]


def test_a_local_session_s_jvm_leaves_code_run_a_few_times_a_batch_to_the_quick_compiler(
    spark: SparkSession,
) -> None:
    """HotSpot's optimizing compiler (C2) takes a method after 5,000 calls by default: in the
    running pipeline it kept compiling Spark's and Delta's per-batch planning and commit code
    for the whole half hour, a fifth of a core (docs/PERFORMANCE.md, session 64). The session's
    JVM runs with ten times the thresholds (``infra.spark.C2_THRESHOLDS``)."""
    values = {name: vm_option(spark, name) for name in (
        "Tier4InvocationThreshold", "Tier4MinInvocationThreshold", "Tier4CompileThreshold",
        "Tier4BackEdgeThreshold")}  # fmt: skip
    assert values == {"Tier4InvocationThreshold": 50000, "Tier4MinInvocationThreshold": 6000,
                      "Tier4CompileThreshold": 150000, "Tier4BackEdgeThreshold": 400000}, (
        f"{values}: spark.driver.defaultJavaOptions did not reach the JVM?"
    )  # fmt: skip


def vm_option(spark: SparkSession, name: str) -> int:
    """A numeric HotSpot option of the session's JVM, as that JVM runs with it."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    diagnostics = jvm.java.lang.management.ManagementFactory.getPlatformMXBean(
        jvm.java.lang.Class.forName("com.sun.management.HotSpotDiagnosticMXBean")
    )
    return int(diagnostics.getVMOption(name).getValue())


def test_a_rocksdb_store_reads_each_key_a_batch_adds_once_and_its_rows_held_are_unknown(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Counting the rows a RocksDB store holds costs a read of each key before every write
    (docs/PERFORMANCE.md, session 68). The session turns it off (``infra.spark.
    ROCKSDB_COUNTS_ROWS``), and the metrics row of such a query records the rows held as
    unknown, not the 0 Spark then reports."""
    import json

    from infra.spark import ROCKSDB_PROVIDER
    from pipeline.job import STATE_STORE_CONF
    from pipeline.metrics import progress_row, rocksdb_counts_rows

    keys = 500
    source = tmp_path / "in"
    spark.range(keys).selectExpr("id AS key").write.parquet(str(source))
    with session_conf(spark, STATE_STORE_CONF, ROCKSDB_PROVIDER):
        query = (
            spark.readStream.schema("key long").parquet(str(source)).dropDuplicates(["key"])
            .writeStream.format("noop").trigger(availableNow=True)
            .option("checkpointLocation", str(tmp_path / "checkpoint")).start()
        )  # fmt: skip
    try:
        assert query.awaitTermination(120), "the deduplication did not end within 120 s"
    finally:
        query.stop()
    progresses = [json.loads(p.json) for p in query.recentProgress]
    progress = next(p for p in progresses if p["numInputRows"] == keys)
    (state,) = progress["stateOperators"]
    assert state["numRowsUpdated"] == keys
    # One read a key to find it new; with the count on, a second before its write (1,000).
    assert keys <= state["customMetrics"]["rocksdbGetCount"] < 1.5 * keys
    row = progress_row(progress, rocksdb_counts_rows=rocksdb_counts_rows(spark))
    assert row["state_rows"] is None
