"""Pipeline throughput: events/s through the whole job on local[2], reading a pre-filled topic.

Usage::

    .venv/bin/python bench/pipeline_throughput.py [--events 200000] [--devices 1000] [--rounds 3]

Starts its own broker (free ports, temp folder) unless KAFKA_BOOTSTRAP_SERVERS is set, fills a
topic with the simulator (all scenarios on), trains and registers a small model (the detector
``iotfraud train`` makes, on a simulated fleet), then, on the same topic and one SparkSession,
``--rounds`` times in turn (the order rotates each round, each job on fresh tables and
checkpoints):

- ``floor``: read and parse the topic, one exactly-once Delta append of the valid events: what
  any job meeting the design spends before doing its own work;
- ``pipeline``: this project's job with ``availableNow``: ingest (parse, quarantine,
  exactly-once dedup, telemetry), then detection (parse, first copies, registry join, sliding
  windows, rules, the registered model, alerts, features);
- ``textbook``: ``from_json`` -> watermark -> sliding window -> ``foreachBatch`` with
  ``toPandas`` + the same registered model's ``predict`` + Delta append. A textbook job keeps no
  per-device profile, so the model's inputs it lacks are passed as missing; the call costs the
  same.

Every job first runs once, unmeasured, on a separate ``--warmup`` topic in the same session, so
the figures are sustained rates rather than a cold JVM's. Prints a JSON object: per job the
median events/s and the spread (min, max) over the rounds, and the ratios of the medians.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench_broker import bench_broker

from infra import contract as c
from infra.settings import SparkSettings
from infra.spark import build_spark_session
from pipeline import job
from pipeline.settings import PipelineSettings

# The contract's event read straight into its types (no checks): what the textbook job parses.
TYPED_EVENT_SCHEMA = c.spark_ddl(
    tuple((name, "timestamp" if name == "event_time" else kind) for name, kind in c.EVENT_FIELDS)
)


def fill_topic(bootstrap: str, topic: str, lake: str, events: int, devices: int) -> float:
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "simulator", "simulate", "--devices", str(devices),
         "--count", str(events), "--accelerate", "0", "--no-progress", "--partitions", "4",
         "--bootstrap-servers", bootstrap, "--topic", topic, "--lake-root", lake],
        check=True,
    )  # fmt: skip
    return time.perf_counter() - started


def textbook(spark: Any, bootstrap: str, topic: str, out: Path, settings: PipelineSettings) -> int:
    """The usual first version of such a job, scoring with the same registered model."""
    import mlflow
    import numpy as np
    from pyspark.sql import functions as F

    mlflow.set_tracking_uri(settings.mlflow_tracking_uri)
    model = mlflow.pyfunc.load_model(f"models:/{settings.model_name}@{settings.model_alias}")
    inputs = model.metadata.get_input_schema().input_names()
    metrics = ["voltage_v", "current_a", "power_w", "temperature_c"]
    rows = {"n": 0}

    def score(batch: Any, batch_id: int) -> None:
        pdf = batch.toPandas()
        if pdf.empty:
            return
        frame = pdf.reindex(columns=inputs).astype("float64")  # what it lacks: missing
        pdf["score"] = np.asarray(model.predict(frame), dtype=float)
        rows["n"] += len(pdf)
        batch.sparkSession.createDataFrame(pdf).write.format("delta").mode("append").save(
            str(out / "alerts")
        )

    events = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", settings.max_offsets_per_trigger)
        .load()
        .select(F.from_json(F.col("value").cast("string"), TYPED_EVENT_SCHEMA).alias("e"))
        .select("e.*", "e.metrics.*")
        .withWatermark("event_time", settings.watermark)
        .groupBy("device_id", F.window("event_time", settings.window, settings.slide))
        .agg(F.count("*").alias("count"), *(F.avg(m).alias(m) for m in metrics))
        .select("device_id", "window.start", "window.end", "count", *metrics)
    )
    query = (
        events.writeStream.outputMode("update")
        .option("checkpointLocation", str(out / "cp"))
        .trigger(availableNow=True)
        .foreachBatch(score)
        .start()
    )
    query.awaitTermination()
    return rows["n"]


def floor(spark: Any, out: Path, settings: PipelineSettings) -> None:
    """Read and parse the topic (the pipeline's own parse), one exactly-once append."""
    from pipeline.sinks import idempotent_append
    from pipeline.sources import raw_source
    from pipeline.transforms import parse_events, valid_events

    def append(batch: Any, batch_id: int) -> None:
        idempotent_append(valid_events(batch), str(out / "telemetry"), "floor", batch_id)

    parsed = parse_events(raw_source(spark, settings), max_clock_ahead=settings.max_clock_ahead)
    (
        parsed.writeStream.option("checkpointLocation", str(out / "cp"))
        .trigger(availableNow=True)
        .foreachBatch(append)
        .start()
        .awaitTermination()
    )


def job_settings(root: Path, bootstrap: str, topic: str, max_offsets: int, tracking: str
                 ) -> PipelineSettings:  # fmt: skip
    return PipelineSettings(
        lake_root=str(root / "lake"), checkpoint_root=str(root / "cp"),
        bootstrap_servers=bootstrap, topic=topic, max_offsets_per_trigger=max_offsets,
        mlflow_tracking_uri=tracking, trigger="available_now", firmware_topic="",
    )  # fmt: skip


def run_pipeline(spark: Any, settings: PipelineSettings) -> dict[str, Any]:
    """Ingest, then detection (in bulk the detection reads the ingest's duplicates after it)."""
    started = time.perf_counter()
    pipeline = job.prepare(spark, settings)
    try:
        pipeline.start_ingest().awaitTermination()
        ingest_s = time.perf_counter() - started
        pipeline.start_detection().awaitTermination()
    finally:
        spark.streams.removeListener(pipeline.listener)
    lake = settings.lake_root
    return {
        "ingest_s": ingest_s,
        "pipeline_s": time.perf_counter() - started,
        "telemetry_rows": spark.read.format("delta").load(f"{lake}/telemetry").count(),
        "alerts": spark.read.format("delta").load(f"{lake}/alerts").count(),
    }


def run_round(spark: Any, bootstrap: str, topic: str, root: Path, *, max_offsets: int,
              tracking: str, order: list[str]) -> dict[str, Any]:  # fmt: skip
    """The jobs on ``topic`` in ``order``, each on its own folder under ``root``."""
    result: dict[str, Any] = {}
    for name in order:
        settings = job_settings(root / name, bootstrap, topic, max_offsets, tracking)
        started = time.perf_counter()
        if name == "floor":
            floor(spark, root / name, settings)
        elif name == "pipeline":
            result.update(run_pipeline(spark, settings))
        else:
            result["textbook_windows_scored"] = textbook(spark, bootstrap, topic, root / name,
                                                         settings)  # fmt: skip
        result[f"{name}_s"] = time.perf_counter() - started
    return result


def register_model(spark: Any, root: Path) -> str:
    """Train the detector on a small simulated fleet and make it the champion; its registry."""
    from infra.mlflow_store import local_tracking_uri
    from iotfraud.training import simulate
    from models.settings import ModelSettings
    from models.train import train

    tracking = local_tracking_uri(root)
    defaults = PipelineSettings()
    settings = ModelSettings(devices=60, hours=3.0, holdout_hours=2.0,
                             workdir=str(root / "training"))  # fmt: skip
    train(spark, settings, tracking, window=defaults.window, slide=defaults.slide,
          spec=defaults.profile_spec(), history_source=simulate)  # fmt: skip
    return tracking


def spread(values: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(values)), "min": round(min(values)),
            "max": round(max(values))}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--devices", type=int, default=1_000)
    parser.add_argument("--max-offsets", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--warmup", type=int, default=20_000,
        help="events of a separate topic each job runs on first, unmeasured (0: none)",
    )  # fmt: skip
    args = parser.parse_args()

    jobs = ["floor", "pipeline", "textbook"]
    rounds = []
    with tempfile.TemporaryDirectory(prefix="pipebench-") as tmp:
        root = Path(tmp)
        with bench_broker(root / "kafka") as bootstrap:
            topic = f"bench.{uuid.uuid4().hex[:8]}"
            fill_s = fill_topic(bootstrap, topic, str(root / "lake"), args.events, args.devices)
            spark = build_spark_session("pipeline-bench", SparkSettings(master="local[2]"))
            tracking = register_model(spark, root)
            if args.warmup:
                # The first job of a session pays for JIT compilation and class loading (a cold
                # read of a topic ran at a third of a warm one's rate, a new topic read warm at
                # full speed): each job runs once on other data first, so the figures below are
                # sustained rates.
                warm = root / "warmup"
                fill_topic(bootstrap, f"{topic}.warmup", str(warm / "lake"), args.warmup,
                           args.devices)  # fmt: skip
                for name in jobs:
                    # The registry the simulator wrote for this topic is the one every job joins.
                    (warm / name / "lake").mkdir(parents=True, exist_ok=True)
                    shutil.copytree(warm / "lake" / "devices", warm / name / "lake" / "devices")
                run_round(spark, bootstrap, f"{topic}.warmup", warm, max_offsets=args.max_offsets,
                          tracking=tracking, order=jobs)  # fmt: skip
            for i in range(args.rounds):
                order = jobs[i % 3 :] + jobs[: i % 3]
                folder = root / f"round-{i}"
                for name in jobs:
                    (folder / name / "lake").mkdir(parents=True, exist_ok=True)
                    shutil.copytree(root / "lake" / "devices", folder / name / "lake" / "devices")
                run = run_round(
                    spark,
                    bootstrap,
                    topic,
                    folder,
                    max_offsets=args.max_offsets,
                    tracking=tracking,
                    order=order,
                )
                print(json.dumps({"round": i, "order": order,
                                  **{k: round(v, 1) if isinstance(v, float) else v
                                     for k, v in run.items()}}), flush=True)  # fmt: skip
                rounds.append(run)
    rate = {name: [args.events / r[f"{name}_s"] for r in rounds] for name in jobs}
    rate["ingest"] = [args.events / r["ingest_s"] for r in rounds]
    median = {name: statistics.median(values) for name, values in rate.items()}
    result = {
        "events": args.events,
        "devices": args.devices,
        "rounds": args.rounds,
        "warmup_events": args.warmup,
        "fill_topic_s": round(fill_s, 1),
        "events_per_s": {name: spread(values) for name, values in rate.items()},
        "pipeline_vs_textbook": round(median["pipeline"] / median["textbook"], 2),
        "pipeline_vs_floor": round(median["pipeline"] / median["floor"], 2),
        "telemetry_rows": [r["telemetry_rows"] for r in rounds],
        "alerts": [r["alerts"] for r in rounds],
        "textbook_windows_scored": [r["textbook_windows_scored"] for r in rounds],
    }
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
