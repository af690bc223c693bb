"""``iotfraud pipeline run [--available-now]`` and ``iotfraud pipeline maintain``."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from pathlib import Path
from types import FrameType

from infra.logs import configure_logging
from infra.processes import stop_signals
from infra.settings import SparkSettings, load_settings
from infra.spark import build_spark_session
from pipeline import job
from pipeline.fastpath import realtime_master
from pipeline.progress import FallingBehind
from pipeline.settings import PipelineSettings, seconds

log = logging.getLogger(__name__)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="iotfraud pipeline", description="The streaming job.")
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="action", required=True)
    run = sub.add_parser("run", help="run ingest, features and detection")
    run.add_argument(
        "--available-now", action="store_true", help="process what is there, then stop (backfill)"
    )
    run.add_argument("--source", choices=["kafka", "files"], help="override IOT_PIPELINE_SOURCE")
    run.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress line on stderr (the demo prints its own); warnings stay",
    )
    sub.add_parser(
        "maintain",
        help="compact the tables, trim the feature changelog, VACUUM (the running pipeline does "
        "it every IOT_PIPELINE_MAINTENANCE_INTERVAL)",
    )
    return parser


def falling_behind(settings: PipelineSettings, log_file: Path | None) -> FallingBehind:
    """The once-only warning about queries slower than their trigger (the job's intervals)."""
    trigger = seconds(settings.trigger_interval)
    firmware = seconds(settings.firmware_trigger_interval)
    intervals = {job.INGEST: trigger, job.DETECTION: trigger,
                 job.FIRMWARE_INGEST: firmware, job.FIRMWARE: firmware}  # fmt: skip
    return FallingBehind(intervals, log_file=None if log_file is None else str(log_file))


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    log_file = configure_logging(args.verbose)
    source = getattr(args, "source", None)
    settings = load_settings(PipelineSettings, **({"source": source} if source else {}))
    spark_settings = load_settings(SparkSettings)
    job.check_locations(settings)
    if args.action == "run":
        job.check_topic(settings)
        if log_file is not None and not args.no_progress:
            print(f"logs (Spark, MLflow, warnings): {log_file}"
                  f"{'' if args.verbose else '; -v shows them here'}", file=sys.stderr)  # fmt: skip
    live = args.action == "run" and not args.available_now
    if live and job.runs_fast_path(settings):
        partitions = job.topic_partitions(settings)
        if partitions:  # the fast path holds a task slot per partition for as long as it runs
            master = realtime_master(spark_settings.master, partitions)
            spark_settings = spark_settings.model_copy(update={"master": master})
    spark = build_spark_session("iotfraud-pipeline", spark_settings)
    if args.action == "maintain":
        from pipeline.maintenance import maintain

        reports = maintain(spark, settings)
        for report in reports:
            print(report.line())
        if not reports:
            print(f"no tables under {settings.lake_root} yet", file=sys.stderr)
        return 1 if any(r.error for r in reports) else 0
    if args.available_now:
        job.run_available_now(spark, settings)
        print("caught up: all available input processed", file=sys.stderr)
        return 0

    stop = threading.Event()

    def request_stop(signum: int, _frame: FrameType | None) -> None:
        log.info("received %s: stopping (a micro-batch cut short is done again at the next start)",
                 signal.Signals(signum).name)  # fmt: skip
        stop.set()

    behind = falling_behind(settings, log_file)
    with stop_signals(request_stop):  # Ctrl-C, SIGTERM and a closed terminal
        pipeline = job.start(spark, settings)
        log.info("pipeline running; Ctrl-C stops it cleanly")

        def on_status(line: str) -> None:
            if not args.no_progress:
                print(line, file=sys.stderr)
            if warning := behind.update(dict(pipeline.listener.latest)):
                log.warning(warning)

        job.run_until_stopped(pipeline, stop, on_status=on_status)
    return 0
