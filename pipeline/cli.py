"""``iotfraud pipeline run [--available-now]`` and ``iotfraud pipeline maintain``."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from types import FrameType

from infra.logs import configure_logging
from infra.processes import stop_signals
from infra.settings import SparkSettings, load_settings
from infra.spark import build_spark_session
from pipeline import job
from pipeline.settings import PipelineSettings

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
    sub.add_parser(
        "maintain",
        help="compact the tables, trim the feature changelog, VACUUM (the running pipeline does "
        "it every IOT_PIPELINE_MAINTENANCE_INTERVAL)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure_logging(args.verbose)
    source = getattr(args, "source", None)
    settings = load_settings(PipelineSettings, **({"source": source} if source else {}))
    spark_settings = load_settings(SparkSettings)
    job.check_locations(settings)
    if args.action == "run":
        job.check_topic(settings)
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

    with stop_signals(request_stop):  # Ctrl-C, SIGTERM and a closed terminal
        pipeline = job.start(spark, settings)
        log.info("pipeline running; Ctrl-C stops it cleanly")
        job.run_until_stopped(pipeline, stop, on_status=lambda line: print(line, file=sys.stderr))
    return 0
