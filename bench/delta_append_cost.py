"""What an exactly-once append of a few rows costs, against a plain append, on a copy of a table.

Usage::

    .venv/bin/python bench/delta_append_cost.py --table DIR/seed-11/lake/alerts [--appends 24]

Most tables the pipeline writes per micro-batch are appended with ``txnAppId``/``txnVersion``
(``pipeline.sinks.idempotent_append``), so a batch replayed after a crash is skipped where it had
committed; the new alerts and ``feature_changes`` no longer are, for the cost this bench shows
(``pipeline.sinks.append``). This bench copies ``--table`` (e.g. the ``alerts`` of a kept
bounded demo, ``bench/live_quality.py --keep``) to a temp folder, then alternates a plain
append and an idempotent one of the same 50 rows (new ids each time), on ``local[2]``. It prints,
for each kind, the median and max seconds after ``--warm-up`` appends of each, and the Spark
jobs each append ran (job id, then per stage its task count): what Delta does beyond the write.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from infra.settings import SparkSettings
from infra.spark import build_spark_session
from pipeline.alerts import to_spark
from pipeline.sinks import idempotent_append


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--table", type=Path, required=True, help="an alerts table to copy")
    parser.add_argument("--appends", type=int, default=24, help="of both kinds together")
    parser.add_argument("--warm-up", type=int, default=3, help="appends of each kind not counted")
    args = parser.parse_args()
    if not (args.table / "_delta_log").is_dir():
        raise SystemExit(f"{args.table} is not a Delta table (no _delta_log)")

    spark = build_spark_session("delta-append-cost", SparkSettings(master="local[2]"))
    context = spark.sparkContext
    with tempfile.TemporaryDirectory() as tmp:
        path = str(Path(tmp) / "table")
        shutil.copytree(args.table, path)
        rows = spark.read.format("delta").load(path).limit(50).toPandas()
        seconds: dict[str, list[float]] = {"plain": [], "idempotent": []}
        jobs: dict[str, list[list[list[object]]]] = {"plain": [], "idempotent": []}
        for i in range(args.appends):
            kind = "idempotent" if i % 2 else "plain"
            batch = rows.assign(alert_id=rows["alert_id"] + f"-{i}")
            frame = to_spark(spark, batch)
            context.setJobGroup(f"append-{i}", kind)
            start = time.perf_counter()
            if kind == "plain":
                frame.write.format("delta").mode("append").save(path)
            else:
                idempotent_append(frame, path, "bench-append-cost", i, rows=len(batch))
            seconds[kind].append(time.perf_counter() - start)
            tracker = context.statusTracker()
            ran: list[list[object]] = []
            for job in sorted(tracker.getJobIdsForGroup(f"append-{i}")):
                info = tracker.getJobInfo(job)
                stages = [tracker.getStageInfo(s) for s in (info.stageIds if info else [])]
                ran.append([job, [s.numTasks for s in stages if s is not None]])
            jobs[kind].append(ran)
    spark.stop()
    report = {
        kind: {
            "median_s": round(statistics.median(times[args.warm_up :]), 3),
            "max_s": round(max(times[args.warm_up :]), 3),
            "jobs_of_the_last_append": jobs[kind][-1],
        }
        for kind, times in seconds.items()
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
