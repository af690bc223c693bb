"""Streaming sources, both shaped like the Kafka source (key, value, topic, partition, offset,
timestamp) so everything downstream is the same code."""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from pipeline.settings import PipelineSettings


def kafka_source(
    spark: SparkSession,
    settings: PipelineSettings,
    topic: str | None = None,
    *,
    starting_offsets: str | None = None,
    max_offsets: int | None = None,
) -> DataFrame:
    """The telemetry topic (or ``topic``); every ``kafka.*`` option is passed through (SASL_SSL,
    Event Hubs). At most ``max_offsets`` messages a micro-batch (``job.batch_bounds``; 0: no
    bound, as Real-time Mode has no micro-batches to bound), ``max_offsets_per_trigger`` when not
    given. ``starting_offsets``: instead of the setting's."""
    reader = (
        spark.readStream.format("kafka")
        .options(**kafka_connection_options(settings))
        .option("subscribe", topic or settings.topic)
        .option("startingOffsets", starting_offsets or settings.starting_offsets)
        # A topic recreated or truncated under a checkpoint must not stop the pipeline silently.
        .option("failOnDataLoss", "false")
    )
    bound = settings.max_offsets_per_trigger if max_offsets is None else max_offsets
    if bound:
        reader = reader.option("maxOffsetsPerTrigger", bound)
    return kafka_records(reader.load())


def kafka_records(raw: DataFrame) -> DataFrame:
    """Records of Spark's Kafka source (stream or batch) in the shape the parse expects."""
    return raw.select(
        F.col("key").cast("string").alias("key"),
        "value",
        "topic",
        "partition",
        "offset",
        "timestamp",
    )


def kafka_connection_options(settings: PipelineSettings) -> dict[str, str]:
    """``kafka.bootstrap.servers`` and every ``kafka.*`` option: SASL_SSL from ``IOT_KAFKA_*``,
    anything else from ``IOT_PIPELINE_KAFKA_OPTIONS``. Holds the password: never log it."""
    return {"kafka.bootstrap.servers": settings.bootstrap_servers, **settings.kafka_options}


def files_source(spark: SparkSession, settings: PipelineSettings) -> DataFrame:
    """A landing folder of JSON-lines files, one event per line (see ``file_records``)."""
    lines = (
        spark.readStream.format("text")
        .option("maxFilesPerTrigger", settings.max_files_per_trigger)
        .load(settings.landing_dir)
    )
    return file_records(lines)


def file_records(lines: DataFrame) -> DataFrame:
    """Lines of a ``text`` source (stream or batch) in the Kafka source's shape.

    Files have no offsets: ``topic`` is the file path and ``offset`` a hash of the line, which is
    stable across restarts and so keeps the Kafka-coordinate bookkeeping deterministic.
    """
    located = lines.select(
        "value",
        F.col("_metadata.file_path").alias("path"),
        F.col("_metadata.file_modification_time").alias("mtime"),
    )
    return located.where(F.length("value") > 0).select(
        F.lit(None).cast("string").alias("key"),
        F.col("value").cast("binary").alias("value"),
        F.col("path").alias("topic"),
        F.lit(-1).alias("partition"),
        F.xxhash64("value").alias("offset"),
        F.col("mtime").alias("timestamp"),
    )


def raw_source(
    spark: SparkSession, settings: PipelineSettings, max_offsets: int | None = None
) -> DataFrame:
    """The configured source; ``max_offsets``: the Kafka bound of the query's batches."""
    if settings.source == "kafka":
        return kafka_source(spark, settings, max_offsets=max_offsets)
    return files_source(spark, settings)
