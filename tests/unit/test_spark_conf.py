"""The Spark configuration a session gets from the settings (``infra.spark.spark_conf``)."""

from __future__ import annotations

import pytest

from infra.settings import SparkSettings
from infra.spark import C2_THRESHOLDS, COLLECTOR, JVM_ENVIRONMENT, ROCKSDB_COUNTS_ROWS, spark_conf


@pytest.mark.parametrize(("cores", "partitions"), [(1, "1"), (2, "1"), (3, "1"), (8, "4")])
def test_unset_shuffle_partitions_are_half_the_cores_and_at_least_one(
    monkeypatch: pytest.MonkeyPatch, cores: int, partitions: str
) -> None:
    """The pipeline's queries share the cores among them: a stateful query's partitions are
    each a task and a state store per micro-batch (docs/PERFORMANCE.md, session 63)."""
    monkeypatch.setattr("os.cpu_count", lambda: cores)
    conf = spark_conf(SparkSettings(master="local[*]", shuffle_partitions=0), [])
    assert conf["spark.sql.shuffle.partitions"] == partitions


def test_shuffle_partitions_set_are_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("os.cpu_count", lambda: 8)
    conf = spark_conf(SparkSettings(master="local[*]", shuffle_partitions=3), [])
    assert conf["spark.sql.shuffle.partitions"] == "3"


def test_rocksdb_counts_the_rows_it_holds_only_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    """Counting costs a read of every key a batch writes or removes (docs/PERFORMANCE.md,
    session 68); an operator who wants the state's rows sets IOT_SPARK_ROCKSDB_COUNT_ROWS."""
    assert spark_conf(SparkSettings(), [])[ROCKSDB_COUNTS_ROWS] == "false"
    monkeypatch.setenv("IOT_SPARK_ROCKSDB_COUNT_ROWS", "true")
    assert spark_conf(SparkSettings(), [])[ROCKSDB_COUNTS_ROWS] == "true"


@pytest.mark.parametrize(
    ("variable", "options"),
    [("JAVA_TOOL_OPTIONS", "-XX:+UseSerialGC"), ("JDK_JAVA_OPTIONS", "-Xss4m -XX:+UseZGC"),
     ("_JAVA_OPTIONS", "-XX:+UseG1GC -XX:G1HeapRegionSize=32m"),
     ("SPARK_SUBMIT_OPTS", "-XX:+UseSerialGC"),
     ("PYSPARK_SUBMIT_ARGS", "--driver-java-options '-XX:+UseZGC' pyspark-shell")],
)  # fmt: skip
def test_a_collector_chosen_for_every_jvm_is_kept(
    monkeypatch: pytest.MonkeyPatch, variable: str, options: str
) -> None:
    """The JVM refuses to start with two collectors: a local session adds none of its own when
    the environment chooses one (its compiler thresholds still apply)."""
    for name in JVM_ENVIRONMENT:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(variable, options)
    java_options = spark_conf(SparkSettings(master="local[2]"), [])[
        "spark.driver.defaultJavaOptions"
    ]
    assert java_options == C2_THRESHOLDS


def test_a_local_session_collects_with_the_parallel_collector(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in JVM_ENVIRONMENT:
        monkeypatch.delenv(name, raising=False)
    # Options that switch a collector off, or only mention collection, choose none.
    monkeypatch.setenv("JAVA_TOOL_OPTIONS", "-XX:-UseG1GC -XX:+UseMaximumCompactionOnSystemGC")
    java_options = spark_conf(SparkSettings(master="local[2]"), [])[
        "spark.driver.defaultJavaOptions"
    ]
    assert java_options.split() == [COLLECTOR, *C2_THRESHOLDS.split()]


def test_a_cluster_s_executors_keep_their_own_jvm_options() -> None:
    conf = spark_conf(SparkSettings(master="spark://spark-master:7077"), [])
    assert "spark.driver.defaultJavaOptions" not in conf
