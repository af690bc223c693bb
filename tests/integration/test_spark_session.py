"""The one SparkSession (``infra.spark``), on the real JVM."""

from __future__ import annotations

from pyspark.sql import SparkSession

from pipeline.job import session_conf

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
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    compilations = jvm.org.apache.spark.metrics.source.CodegenMetrics.METRIC_COMPILATION_TIME()

    def run(i: int) -> None:
        # A literal is part of the generated code: each i is code of its own.
        rows = spark.range(3).selectExpr(f"id * {i} + {i} AS v").collect()
        assert [row.v for row in rows] == [i, 2 * i, 3 * i]

    # The test step runs Spark's expressions interpreted (tests/spark-conf); the pipeline does not.
    with (
        session_conf(spark, "spark.sql.codegen.factoryMode", "CODEGEN_ONLY"),
        session_conf(spark, "spark.sql.codegen.wholeStage", "true"),
    ):
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
