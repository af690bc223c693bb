"""What the parse costs: ``parse_events`` on messages held in memory, against the least parse.

Usage::

    .venv/bin/python bench/parse_cost.py [--events 400000] [--rounds 3]

Builds ``--events`` messages in the simulator's wire format (uuid event ids, 25,000 devices, every
metric set), cached in memory in the Kafka source's shape, then runs, ``--rounds`` times in turn,
each into Spark's ``noop`` sink on the project's SparkSession (``local[2]``):

- ``typed_first``: ``parse_events`` as the pipeline runs it (each record read into the
  contract's types first, read again as text only when that fails);
- ``as_text``: ``parse_events(typed_first=False)``: every record read as text, field by field;
- ``least``: ``from_json`` straight into the typed fields, no checks (the floor of any parse,
  ``pipeline_floor.typed_events``).

``typed_first`` and ``as_text`` also run with Spark's default ``spark.sql.codegen.hugeMethodLimit``
(65535, where the session sets HotSpot's 8000): the JVM does not compile a method above 8000
bytes of bytecode, and runs it interpreted. The first round is a warm-up and is not reported.
Prints a JSON object: per job the median seconds and events/s over the reported rounds, and the
spread.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

from pipeline_floor import typed_events

from infra import contract as c
from infra.settings import SparkSettings
from infra.spark import build_spark_session
from pipeline.transforms import parse_events

HUGE_METHOD_LIMIT = "spark.sql.codegen.hugeMethodLimit"


def messages(spark: Any, events: int) -> Any:
    """``events`` simulator-like messages with Kafka coordinates, cached."""
    from pyspark.sql import functions as F

    metrics = F.struct(*[F.round(F.rand(3 + i) * 100, 2).alias(m) for i, m in enumerate(c.METRICS)])
    device = F.format_string("dev-%06d", (F.col("id") % 25000).cast("int"))
    event = F.struct(
        F.expr("uuid()").alias("event_id"),
        device.alias("device_id"),
        F.date_format(F.timestamp_seconds(F.lit(1767225600) + F.col("id") / 400),
                      "yyyy-MM-dd'T'HH:mm:ss.SSS'Z'").alias("event_time"),
        F.col("id").alias("seq"),
        F.lit("sm-4.2.1").alias("firmware"),
        F.round(F.rand(1) * 10, 6).alias("lat"),
        F.round(F.rand(2) * 10, 6).alias("lon"),
        metrics.alias("metrics"),
    )  # fmt: skip
    raw = spark.range(events).select(
        device.alias("key"),
        F.to_json(event).cast("binary").alias("value"),
        F.lit("telemetry").alias("topic"),
        (F.col("id") % 4).cast("int").alias("partition"),
        F.col("id").alias("offset"),
        F.current_timestamp().alias("timestamp"),
    )
    cached = raw.repartition(4).cache()
    cached.count()
    return cached


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=400_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    spark = build_spark_session("parse-cost", SparkSettings(master="local[2]"))
    raw = messages(spark, args.events)
    session_limit = spark.conf.get(HUGE_METHOD_LIMIT)
    jobs: dict[str, tuple[Callable[[Any], Any], str]] = {
        "typed_first": (parse_events, session_limit),
        "as_text": (lambda r: parse_events(r, typed_first=False), session_limit),
        "typed_first, Spark's default method limit": (parse_events, "65535"),
        "as_text, Spark's default method limit": (
            lambda r: parse_events(r, typed_first=False), "65535"),
        "least": (typed_events, session_limit),
    }  # fmt: skip
    seconds: dict[str, list[float]] = {name: [] for name in jobs}
    for round_ in range(args.rounds + 1):
        for name, (parse, limit) in jobs.items():
            spark.conf.set(HUGE_METHOD_LIMIT, limit)
            started = time.perf_counter()
            parse(raw).write.format("noop").mode("overwrite").save()
            if round_:  # the first round warms the JVM up
                seconds[name].append(time.perf_counter() - started)
    spark.conf.set(HUGE_METHOD_LIMIT, session_limit)
    report = {
        "events": args.events,
        "session_huge_method_limit": session_limit,
        "jobs": {
            name: {
                "seconds_median": round(statistics.median(s), 2),
                "seconds_min_max": [round(min(s), 2), round(max(s), 2)],
                "events_per_s": round(args.events / statistics.median(s)),
            }
            for name, s in seconds.items()
        },
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
