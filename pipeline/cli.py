"""``iotfraud pipeline run [--available-now]`` and ``iotfraud pipeline maintain`` (also
``python -m pipeline ...``)."""

from __future__ import annotations

import logging
import signal
import threading
from pathlib import Path
from types import FrameType

import click

from infra.commandline import group, invocation, setting, settings_from
from infra.commandline import run as run_command
from infra.processes import stop_signals
from infra.settings import SparkSettings, load_settings
from infra.spark import build_spark_session
from pipeline import job
from pipeline.fastpath import realtime_master
from pipeline.progress import FallingBehind
from pipeline.settings import PipelineSettings

log = logging.getLogger(__name__)


@group("pipeline")
def cli() -> None:
    """The Spark Structured Streaming job."""


@cli.command()
@click.option("--available-now", is_flag=True, help="Process what is there, then stop (backfill).")
@setting(PipelineSettings, "source")
@click.option(
    "--no-progress",
    is_flag=True,
    help="No progress line on stderr (the demo prints its own); warnings stay.",
)
@click.option(
    "--ready-file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Create this file once every query has run its first micro-batch and the model is "
    "loaded (the demo starts its simulator then).",
)
def run(
    available_now: bool, no_progress: bool, ready_file: Path | None, **_settings: object
) -> int:
    """Run ingest, features and detection (Ctrl-C stops it cleanly; SIGUSR1 once it has
    processed what the topic holds)."""
    current = invocation()
    settings = settings_from(PipelineSettings)
    spark_settings = load_settings(SparkSettings)
    job.check_locations(settings)
    job.check_topic(settings)
    if current.log_file is not None and not no_progress:
        click.echo(f"logs (Spark, MLflow, warnings): {current.log_file}"
                   f"{'' if current.verbose else '; -v shows them here'}", err=True)  # fmt: skip
    if not available_now and job.runs_fast_path(settings):
        partitions = job.topic_partitions(settings)
        if partitions:  # the fast path holds a task slot per partition for as long as it runs
            master = realtime_master(spark_settings.master, partitions)
            spark_settings = spark_settings.model_copy(update={"master": master})
    spark = build_spark_session("iotfraud-pipeline", spark_settings)
    if available_now:
        job.run_available_now(spark, settings)
        click.echo("caught up: all available input processed", err=True)
        return 0

    stop = threading.Event()

    def request_stop(signum: int, _frame: FrameType | None) -> None:
        log.info("received %s: stopping (a micro-batch cut short is done again at the next start)",
                 signal.Signals(signum).name)  # fmt: skip
        stop.set()

    drain = threading.Event()

    def request_drain(signum: int, _frame: FrameType | None) -> None:
        log.info("received %s: processing what the sources hold, then stopping",
                 signal.Signals(signum).name)  # fmt: skip
        drain.set()
        stop.set()

    behind = FallingBehind(log_file=None if current.log_file is None else str(current.log_file),
                           bounds=job.batch_bounds(settings))  # fmt: skip
    # SIGUSR1: stop once caught up (the demo's stop, after its simulator's).
    signal.signal(signal.SIGUSR1, request_drain)
    with stop_signals(request_stop):  # Ctrl-C, SIGTERM and a closed terminal
        pipeline = job.start(spark, settings)

        def warn_if_behind(row: dict[str, object]) -> None:
            if warning := behind.observe(row):
                log.warning(warning)

        # Every micro-batch, not the one the status line finds every few seconds: a growth
        # is counted batch by batch. The first batches go by before this is set; they are
        # slow anyway (state loads, code compiles), and none alone makes the warning.
        pipeline.listener.on_progress = warn_if_behind
        starting = pipeline.wait_until_running(stop)
        if not stop.is_set():
            if starting:
                log.warning("still in their first micro-batch after %.0f s: %s",
                            job.FIRST_TRIGGER_WAIT_S, ", ".join(starting))  # fmt: skip
            log.info("pipeline running; Ctrl-C stops it cleanly")
            if ready_file is not None:
                ready_file.write_text("running\n")

        def on_status(line: str) -> None:
            if not no_progress:
                click.echo(line, err=True)

        job.run_until_stopped(pipeline, stop, on_status=on_status, drain=drain)
    log.info("pipeline stopped")
    return 0


@cli.command()
def maintain() -> int:
    """Compact the tables, trim the feature changelog, VACUUM (the running pipeline does it
    every IOT_PIPELINE_MAINTENANCE_INTERVAL)."""
    from pipeline.maintenance import maintain as maintain_tables

    settings = load_settings(PipelineSettings)
    job.check_locations(settings)
    spark = build_spark_session("iotfraud-pipeline", load_settings(SparkSettings))
    # Alone on its session: compaction may take every core.
    reports = maintain_tables(spark, settings, compaction_jobs=None)
    for report in reports:
        click.echo(report.line())
    if not reports:
        click.echo(f"no tables under {settings.lake_root} yet", err=True)
    return 1 if any(r.error for r in reports) else 0


def main(argv: list[str] | None = None) -> int:
    return run_command(cli, argv, prog="iotfraud pipeline")
