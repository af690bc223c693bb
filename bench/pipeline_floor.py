"""The floor of any pipeline on this machine: the least a job meeting the design must do.

Usage::

    .venv/bin/python bench/pipeline_floor.py throughput [--events 400000] [--devices 2000]
    .venv/bin/python bench/pipeline_floor.py latency [--rate 5000] [--seconds 120]

Every job that meets ``DESIGN.md`` reads the topic, parses each message with the explicit schema
and commits what it parsed to Delta exactly once. This bench runs only that (no dedup, no
quarantine table, no registry join, no windows, no model, no alerts) with the pipeline's own
``parse_events`` and idempotent append, so its figures bound what the whole pipeline can reach
here: when the floor is below a target, no design of the pipeline meets it on this machine.

``throughput`` fills a topic with the simulator (all scenarios), then runs, one after the other
on the same SparkSession (``local[2]``, the product's shuffle partitions, ``availableNow``,
``--max-offsets`` per micro-batch), each stage once on a separate warm-up topic first:

1. read: the Kafka source into the ``noop`` sink;
2. typed: the same plus the least parse of the contract (``from_json`` straight into the typed
   fields: no checks, no quarantine reasons);
3. typed_append: the same plus one idempotent Delta append per micro-batch;
4. parse: the Kafka source plus the pipeline's ``parse_events`` (every check) into ``noop``;
5. append: the same plus one idempotent Delta append of the valid events per micro-batch.

``latency`` runs stage 5 (or ``--stage typed_append``) live (1 s trigger) while the simulator
sends ``--rate`` events/s, and reports the time from a message's Kafka timestamp to the commit of
the Delta append holding it (p50/p95/max), and the batch durations.

Starts its own broker (free ports, temp folder) unless KAFKA_BOOTSTRAP_SERVERS is set. Prints a
JSON object last (after the simulator's own lines).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from bench_broker import bench_broker
from pipeline_throughput import TYPED_EVENT_SCHEMA, fill_topic

from infra.settings import SparkSettings
from infra.spark import build_spark_session
from pipeline.settings import PipelineSettings
from pipeline.sinks import idempotent_append
from pipeline.sources import kafka_source
from pipeline.transforms import parse_events, valid_events

STAGES = ("read", "typed", "typed_append", "parse", "append")


def typed_events(raw: Any) -> Any:
    """Messages parsed with ``TYPED_EVENT_SCHEMA`` and their Kafka coordinates: the least parse
    of the contract, nothing checked."""
    from pyspark.sql import functions as F

    event = F.from_json(F.col("value").cast("string"), TYPED_EVENT_SCHEMA).alias("e")
    return raw.select(event, "topic", "partition", "offset", "timestamp").select(
        "e.*", "topic", "partition", "offset", "timestamp"
    )


def stage_query(
    spark: Any, settings: PipelineSettings, stage: str, root: Path
) -> tuple[Any, dict[int, float]]:
    """Start ``stage`` on ``settings.topic``; the query and the wall time each batch's append
    committed (filled as it runs)."""
    raw = kafka_source(spark, settings)
    commits: dict[int, float] = {}
    if stage == "read":
        writer = raw.writeStream.format("noop")
    elif stage in ("typed", "parse"):
        parsed = typed_events(raw) if stage == "typed" else parse_events(raw)
        writer = parsed.writeStream.format("noop")
    else:
        table = str(root / "telemetry")

        def append(batch: Any, batch_id: int) -> None:
            from pyspark.sql import functions as F

            rows = batch if stage == "typed_append" else valid_events(batch)
            idempotent_append(rows.withColumn("batch_id", F.lit(batch_id)), table, "floor",
                              batch_id)  # fmt: skip
            commits[batch_id] = time.time()

        parsed = typed_events(raw) if stage == "typed_append" else parse_events(raw)
        writer = parsed.writeStream.foreachBatch(append)
    writer = writer.option("checkpointLocation", str(root / f"cp-{stage}"))
    if settings.trigger == "available_now":
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=settings.trigger_interval)
    return writer.start(), commits


def settings_for(bootstrap: str, topic: str, root: Path, **overrides: Any) -> PipelineSettings:
    return PipelineSettings(
        lake_root=str(root / "lake"), checkpoint_root=str(root / "cp"),
        bootstrap_servers=bootstrap, topic=topic, **overrides,
    )  # fmt: skip


def throughput(args: argparse.Namespace, root: Path, bootstrap: str, spark: Any) -> dict[str, Any]:
    topic = f"floor.{uuid.uuid4().hex[:8]}"
    fill_s = fill_topic(bootstrap, topic, str(root / "lake"), args.events, args.devices)
    runs: dict[str, Any] = {}
    if args.warmup:
        fill_topic(bootstrap, f"{topic}.warmup", str(root / "lake"), args.warmup, args.devices)
    for stage in STAGES:
        if args.warmup:
            warm = settings_for(bootstrap, f"{topic}.warmup", root / f"warm-{stage}",
                                trigger="available_now",
                                max_offsets_per_trigger=args.max_offsets)  # fmt: skip
            stage_query(spark, warm, stage, root / f"warm-{stage}")[0].awaitTermination()
        measured = settings_for(bootstrap, topic, root / stage, trigger="available_now",
                                max_offsets_per_trigger=args.max_offsets)  # fmt: skip
        started = time.perf_counter()
        stage_query(spark, measured, stage, root / stage)[0].awaitTermination()
        seconds = time.perf_counter() - started
        runs[stage] = {"seconds": round(seconds, 1), "events_per_s": round(args.events / seconds)}
    rows = spark.read.format("delta").load(str(root / "append" / "telemetry")).count()
    return {"events": args.events, "devices": args.devices, "max_offsets": args.max_offsets,
            "fill_topic_s": round(fill_s, 1), "stages": runs, "appended_rows": rows}  # fmt: skip


def latency(args: argparse.Namespace, root: Path, bootstrap: str, spark: Any) -> dict[str, Any]:
    import pandas as pd

    topic = f"floor.{uuid.uuid4().hex[:8]}"
    # A short warm-up run of the same query on other data: the figures are a warm JVM's.
    fill_topic(bootstrap, f"{topic}.warmup", str(root / "lake"), 20_000, args.devices)
    warm = settings_for(bootstrap, f"{topic}.warmup", root / "warm", trigger="available_now")
    stage_query(spark, warm, args.stage, root / "warm")[0].awaitTermination()
    # The topic exists before the query starts (a one-message run creates it).
    fill_topic(bootstrap, topic, str(root / "lake"), 1, args.devices)
    live = settings_for(bootstrap, topic, root / "live", trigger="processing",
                        trigger_interval="1 second", starting_offsets="latest")  # fmt: skip
    query, commits = stage_query(spark, live, args.stage, root / "live")
    time.sleep(5)
    durations: list[float] = []

    def watch() -> None:
        seen = -1
        while query.isActive:
            progress = query.lastProgress
            if progress and progress["batchId"] != seen and progress["numInputRows"]:
                seen = progress["batchId"]
                durations.append(progress["durationMs"]["triggerExecution"] / 1000)
            time.sleep(0.2)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    sender = subprocess.run(
        [sys.executable, "-m", "simulator", "simulate", "--devices", str(args.devices),
         "--rate", str(args.rate), "--duration", str(args.seconds), "--no-progress",
         "--partitions", "4", "--bootstrap-servers", bootstrap, "--topic", topic,
         "--lake-root", str(root / "lake")],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    time.sleep(args.drain)
    query.stop()
    rows = (
        spark.read.format("delta")
        .load(str(root / "live" / "telemetry"))
        .select("batch_id", "kafka_timestamp" if args.stage == "append" else "timestamp")
        .toPandas()
    )
    committed = rows["batch_id"].map(commits)
    epoch = pd.Timestamp(0, tz="UTC")
    sent_at = (pd.to_datetime(rows.iloc[:, 1], utc=True) - epoch).dt.total_seconds()
    latency_s = committed - sent_at

    def quantiles(values: Any) -> dict[str, float]:
        return {q: round(float(values.quantile(p)), 2)
                for q, p in (("p50", 0.5), ("p95", 0.95), ("max", 1.0))}  # fmt: skip

    return {"stage": args.stage, "rate": args.rate, "seconds": args.seconds,
            "devices": args.devices,
            "simulator": sender.stdout.strip().splitlines()[-1] if sender.stdout else "",
            "rows": len(rows), "batches": len(durations),
            "commit_latency_s": quantiles(latency_s),
            "batch_duration_s": quantiles(pd.Series(durations))}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    sub = parser.add_subparsers(dest="mode", required=True)
    tp = sub.add_parser("throughput")
    tp.add_argument("--events", type=int, default=400_000)
    tp.add_argument("--devices", type=int, default=2_000)
    tp.add_argument("--max-offsets", type=int, default=200_000)
    tp.add_argument("--warmup", type=int, default=40_000)
    lat = sub.add_parser("latency")
    lat.add_argument("--rate", type=float, default=5_000)
    lat.add_argument("--seconds", type=float, default=120)
    lat.add_argument("--devices", type=int, default=100_000)
    lat.add_argument("--drain", type=float, default=15)
    lat.add_argument("--stage", choices=("typed_append", "append"), default="append")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="floorbench-") as tmp:
        root = Path(tmp)
        with bench_broker(root / "kafka") as bootstrap:
            spark = build_spark_session("floor-bench", SparkSettings(master="local[2]"))
            measure = throughput if args.mode == "throughput" else latency
            result = measure(args, root, bootstrap, spark)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
