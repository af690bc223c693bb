"""What a maintenance round (``pipeline.maintenance.maintain``) costs, per table and step, on a
copy of a lake the live pipeline wrote.

Usage::

    .venv/bin/python bench/pipeline_latency.py --rate 5000 --seconds 600 --devices 25000 \\
        --keep-lake DIR   # with IOT_PIPELINE_MAINTENANCE_INTERVAL="0 seconds": no round yet
    .venv/bin/python bench/maintenance_cost.py --lake DIR [--runs 2]

Each run copies ``--lake`` to a temp folder and maintains it as the running pipeline would
(``local[2]``, the settings' retention, the table properties a start gives), alone: what a round
costs the cores, not what it does to the queries beside it (``bench/pipeline_latency.py`` with
``IOT_PIPELINE_MAINTENANCE_INTERVAL`` shows that). It prints, per run and table, the files before
and after, the seconds of each step, the Spark jobs the table's round ran and their tasks, and the
executor CPU seconds of those tasks (the Spark UI's REST API).
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from spark_ui import application, rest, stage_cpu_s

from infra.settings import SparkSettings
from infra.spark import build_spark_session
from pipeline.maintenance import apply_table_properties, maintain
from pipeline.settings import PipelineSettings


def jobs_since(ui: str, app: str, seen: set[int]) -> list[dict[str, Any]]:
    """Spark jobs the UI lists that ``seen`` lacks (it gets them added)."""
    jobs = [j for j in rest(ui, f"/applications/{app}/jobs") if j["jobId"] not in seen]
    seen.update(j["jobId"] for j in jobs)
    return jobs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lake", type=Path, required=True, help="a lake folder to copy")
    parser.add_argument("--runs", type=int, default=2, help="each on a fresh copy")
    args = parser.parse_args()
    if not (args.lake / "telemetry" / "_delta_log").is_dir():
        raise SystemExit(f"{args.lake} holds no telemetry table: give a lake folder")

    spark = build_spark_session(
        "maintenance-cost",
        SparkSettings(master="local[2]"),
        extra_conf={"spark.ui.enabled": "true"},
    )
    # The port Spark took (the next free one when its default is in use).
    ui = spark.sparkContext.uiWebUrl
    if ui is None:
        raise SystemExit("the Spark UI did not start: its REST API gives the jobs")
    app = application(ui)
    seen: set[int] = set()
    results = []
    for run in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="maintcost-") as tmp:
            lake = str(Path(tmp) / "lake")
            shutil.copytree(args.lake, lake)
            settings = PipelineSettings(lake_root=lake)
            apply_table_properties(spark, settings)
            jobs_since(ui, app, seen)
            started = time.perf_counter()
            reports = maintain(spark, settings)
            took = time.perf_counter() - started
            jobs = jobs_since(ui, app, seen)
            stages = {s for j in jobs for s in j["stageIds"]}
            complete = rest(ui, f"/applications/{app}/stages?status=complete")
            results.append({
                "run": run,
                "seconds": round(took, 1),
                "spark_jobs": len(jobs),
                "tasks": sum(j["numTasks"] for j in jobs),
                "executor_cpu_s": round(sum(stage_cpu_s(s) for s in complete
                                          if s["stageId"] in stages), 1),
                "tables": {r.table: {"files": [r.files_before, r.files_after],
                                     "seconds": round(r.seconds, 1),
                                     "steps": {k: round(v, 1) for k, v in r.steps.items()},
                                     "error": r.error} for r in reports},
            })  # fmt: skip
            print(json.dumps(results[-1]), flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
