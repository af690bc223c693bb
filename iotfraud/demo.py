"""``iotfraud demo``: the whole product on one machine.

Brings the local stack up, creates the device registry when there is none, then runs the
simulator, the pipeline and the dashboard as child processes, shows progress, and stops them all
cleanly on Ctrl-C (or after ``--duration`` seconds, ending with a summary).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import click

from infra import contract as c
from infra import lake, stack
from infra.commandline import command, invocation, run
from infra.kafka_client import ensure_topic
from infra.mlflow_store import tracking_uri
from infra.model_trust import DIGEST_TAG
from infra.processes import Children, Stopped, run_child, stop_signals
from infra.settings import CommonSettings, StackSettings, load_settings

log = logging.getLogger(__name__)


def table_rows(
    lake_root: str, table: str, columns: list[str] | None = None
) -> list[dict[str, Any]]:
    """Rows of a Delta table read with deltalake; empty when the table does not exist yet."""
    found = lake.open_table(lake_root, table)
    if found is None:
        return []
    rows: list[dict[str, Any]] = found.to_pyarrow_table(columns=columns).to_pylist()
    return rows


def row_count(lake_root: str, table: str) -> int:
    """Rows of a Delta table from its log's file statistics (no data read; the tables grow all
    demo long and the progress line is redrawn every few seconds); 0 before the table exists."""
    import pyarrow as pa

    found = lake.open_table(lake_root, table)
    if found is None:
        return 0
    files = pa.table(found.get_add_actions(True))
    counts = files.column("num_records").to_pylist()
    if None in counts:  # a file written without statistics: count its rows
        return len(table_rows(lake_root, table, []))
    return int(sum(counts))


def alerts_by_type(lake_root: str) -> Counter[str]:
    """Standing alerts (not withdrawn when their window closed) per alert type."""
    from models.live_eval import standing_alerts

    alerts = standing_alerts(lake_root, ["alert_type"])
    return Counter() if alerts is None else Counter(alerts["alert_type"])


def progress_line(lake_root: str) -> str:
    telemetry = row_count(lake_root, lake.TELEMETRY)
    quarantine = row_count(lake_root, lake.QUARANTINE)
    alerts = alerts_by_type(lake_root)
    top = ", ".join(f"{t} {n}" for t, n in alerts.most_common(4))
    return (
        f"telemetry {telemetry:,} | quarantine {quarantine:,} | alerts {sum(alerts.values()):,}"
        + (f" ({top})" if top else "")
    )


def drain(pipeline: subprocess.Popen[bytes], lake_root: str, timeout_s: float = 300.0) -> None:
    """Let the pipeline finish what the simulator sent: asked with SIGUSR1, it processes what
    the topic holds and stops. Progress lines meanwhile; at most ``timeout_s`` (then the stop
    that follows interrupts it)."""
    if pipeline.poll() is not None:
        return
    print("finishing what the simulator sent", flush=True)
    pipeline.send_signal(signal.SIGUSR1)
    deadline, last = time.monotonic() + timeout_s, progress_line(lake_root)
    while time.monotonic() < deadline:
        with contextlib.suppress(subprocess.TimeoutExpired):
            if pipeline.wait(5) != 0:
                print(f"the pipeline exited with {pipeline.returncode} while finishing (its log "
                      "says why: see the logs line above)", file=sys.stderr)  # fmt: skip
            return
        line = progress_line(lake_root)
        if line != last:
            print(line, flush=True)
            last = line
    print(f"the pipeline had not caught up after {timeout_s:.0f} s: stopping it", file=sys.stderr)


def ensure_model(
    env: dict[str, str], devices: int, hours: float, options: list[str] | None = None
) -> None:
    """Train and register a first model (on accelerated simulated history) when none is the
    champion, so the pipeline scores with one from its first micro-batch. ``options`` go to
    ``iotfraud train`` (``-v``)."""
    from models import registry
    from models.settings import ModelSettings

    settings = load_settings(ModelSettings)
    uri = tracking_uri(settings.mlflow_tracking_uri)
    mlflow_client = registry.client(uri)
    champion = registry.alias_version(mlflow_client, settings.name, registry.CHAMPION)
    if champion is None:
        why = "no champion yet"
    elif not registry.compares_with_own_normal(uri, settings.name, champion):
        why = (f"champion v{champion} was trained by an earlier release (absolute statistics "
               "per device type)")  # fmt: skip
    elif not mlflow_client.get_model_version(settings.name, champion).tags.get(DIGEST_TAG):
        why = f"champion v{champion} has no recorded digest, so the pipeline would not load it"
    else:
        return
    print(
        f"{settings.name}: {why}: training a first model on {hours:g} simulated hours "
        f"of {devices} devices (a few minutes; `iotfraud train` trains a bigger one)",
        flush=True,
    )
    run_child(
        "training",
        [sys.executable, "-m", "iotfraud", "train", *(options or []), "--devices", str(devices),
         "--hours", str(hours), "--holdout-hours", str(max(1.0, hours / 2))],
        env,
    )  # fmt: skip


def detection_summary(lake_root: str) -> str:
    """Precision, recall and time to detect per injected scenario (``iotfraud eval``'s table),
    and the alerts it leaves out."""
    from models.live_eval import evaluate_lake, format_table

    try:
        result = evaluate_lake(lake_root)
    except FileNotFoundError as exc:
        return f"  (no evaluation: {exc})"
    left_out = result.left_out_line()
    return format_table(result.table) + ("" if left_out is None else f"\n{left_out}")


def unscored_injections(lake_root: str) -> str | None:
    """The injections the detection table leaves out (the scenarios that test robustness, not
    in ``infra.contract.FRAUD_SCENARIOS``), so that its count and the simulator's add up; None
    when there are none."""
    scenarios = Counter(
        r["scenario"] for r in table_rows(lake_root, lake.GROUND_TRUTH, ["scenario"])
    )
    left_out = sorted((s, n) for s, n in scenarios.items() if s not in c.FRAUD_SCENARIOS)
    if not left_out:
        return None
    listed = ", ".join(f"{scenario} {n:,}" for scenario, n in left_out)
    return (f"not in the table (they test robustness, not detection): {listed}; "
            f"{sum(scenarios.values()):,} injections in all")  # fmt: skip


def batch_offsets(lake_root: str, query: str = "detection") -> Any:
    """The Kafka offsets each micro-batch of ``query`` read, from ``pipeline_metrics``: columns
    batch_id, kafka_topic, kafka_partition, start, end (offsets ``start`` to ``end - 1``). A
    batch's start is its previous batch's end, so a batch whose previous one has no row (its
    metrics lost with a killed process) is left out; batch 0 starts at offset 0."""
    import pandas as pd

    columns = ["batch_id", "kafka_topic", "kafka_partition", "start", "end"]
    found = lake.open_table(lake_root, lake.PIPELINE_METRICS)
    # A lake from before the column was added: no offsets known.
    if found is None or "kafka_end_offsets" not in found.schema().to_arrow().names:
        return pd.DataFrame(columns=columns)
    rows = found.to_pyarrow_table(
        columns=["query_name", "batch_id", "kafka_end_offsets"]
    ).to_pylist()
    ends = [
        (row["batch_id"], topic, int(partition), int(offset))
        for row in rows
        if row["query_name"] == query and row["kafka_end_offsets"]
        for topic, parts in json.loads(row["kafka_end_offsets"]).items()
        for partition, offset in parts.items()
    ]
    frame = pd.DataFrame(ends, columns=["batch_id", "kafka_topic", "kafka_partition", "end"])
    # A batch replayed after a crash reads the same offsets: one row per batch.
    frame = frame.drop_duplicates(["batch_id", "kafka_topic", "kafka_partition"], keep="last")
    frame = frame.sort_values("batch_id")
    before = frame.groupby(["kafka_topic", "kafka_partition"])
    frame["start"] = before["end"].shift(1)
    known = before["batch_id"].shift(1) == frame["batch_id"] - 1
    frame.loc[frame["batch_id"] == 0, "start"] = 0
    frame = frame[known | (frame["batch_id"] == 0)]
    return frame.astype({"start": "int64"})[columns].reset_index(drop=True)


@dataclass(frozen=True)
class AlertLatency:
    """Seconds from a device's message reaching Kafka to the alert on it being committed to the
    ``alerts`` table (the commit that first held its row), p50 and p95. ``first_*``: from the
    device's first message in the micro-batch that raised the alert instead of its newest, so
    the wait of a message for the batch that reads it is in it (the alert's evidence is one of
    the messages between the two); None without the batches' offsets."""

    p50: float
    p95: float
    first_p50: float | None = None
    first_p95: float | None = None

    def __str__(self) -> str:
        text = f"p50 {self.p50:.1f} s, p95 {self.p95:.1f} s"
        if self.first_p50 is not None and self.first_p95 is not None:
            text += (f"; from the device's first message in the batch: p50 {self.first_p50:.1f}"
                     f" s, p95 {self.first_p95:.1f} s")  # fmt: skip
        return text


def alert_latency(lake_root: str, by_batch: bool = True) -> AlertLatency | None:
    """From a device's message reaching Kafka to the alert on it being committed to the table.

    ``by_batch``: the message is the device's newest one (and, for ``AlertLatency.first_*``,
    its first) in the Kafka offsets of the detection micro-batch that raised the alert (its
    ``batch_id``), as ``pipeline_metrics`` recorded them (``batch_offsets``); alerts raised by
    no message of that batch (replays, counted from the ingest's duplicates) and the alerts of
    other queries (firmware tamper, silences: their batch ids are not detection's) are left
    out. Otherwise, or when no offsets were recorded: the device's newest message that
    ``telemetry`` holds from before the alert was raised (``detected_at``).
    """
    import pandas as pd

    from models.live_eval import standing_alerts

    columns = ["alert_id", "device_id", "detected_at", "batch_id", "alert_type"]
    alerts = standing_alerts(lake_root, columns)
    if alerts is None:
        return None
    coords = ["kafka_topic", "kafka_partition", "kafka_offset"]
    telemetry = pd.DataFrame(table_rows(
        lake_root, lake.TELEMETRY, ["device_id", "ingest_time", "kafka_timestamp", *coords]
    ))  # fmt: skip
    if alerts.empty or telemetry.empty:
        return None
    committed = lake.first_commit_times(lake_root, lake.ALERTS, "alert_id")
    alerts["committed_at"] = pd.to_datetime(alerts["alert_id"].map(committed), utc=True)
    # One unit for every time (the readers give microseconds or nanoseconds): merge_asof needs it.
    for frame, names in ((alerts, ("detected_at", "committed_at")),
                         (telemetry, ("ingest_time", "kafka_timestamp"))):  # fmt: skip
        for name in names:
            frame[name] = pd.to_datetime(frame[name], utc=True).dt.as_unit("ns")
    batches = batch_offsets(lake_root) if by_batch else None
    if batches is not None and not batches.empty:
        messages = pd.merge_asof(
            telemetry.sort_values("kafka_offset"), batches.sort_values("start"),
            left_on="kafka_offset", right_on="start", by=["kafka_topic", "kafka_partition"],
            direction="backward",
        )  # fmt: skip
        messages = messages[messages["kafka_offset"] < messages["end"]]
        sent = messages.groupby(["device_id", "batch_id"], as_index=False).agg(
            kafka_timestamp=("kafka_timestamp", "max"), first_timestamp=("kafka_timestamp", "min")
        )
        # A batch id names a detection batch only on the detection query's alerts.
        other_queries = alerts["alert_type"].isin(["firmware_tamper", *c.SILENCE_ALERT_TYPES])
        matched = alerts[~other_queries].merge(sent, on=["device_id", "batch_id"])
    else:
        matched = pd.merge_asof(
            alerts.sort_values("detected_at"), telemetry.sort_values("ingest_time"),
            left_on="detected_at", right_on="ingest_time", by="device_id", direction="backward",
        ).dropna(subset=["kafka_timestamp"])  # fmt: skip
    matched = matched.dropna(subset=["committed_at"])
    if matched.empty:
        return None
    seconds = (matched["committed_at"] - matched["kafka_timestamp"]).dt.total_seconds()
    if "first_timestamp" not in matched:
        return AlertLatency(float(seconds.quantile(0.5)), float(seconds.quantile(0.95)))
    first = (matched["committed_at"] - matched["first_timestamp"]).dt.total_seconds()
    return AlertLatency(float(seconds.quantile(0.5)), float(seconds.quantile(0.95)),
                        float(first.quantile(0.5)), float(first.quantile(0.95)))  # fmt: skip


def messages_in_topic(bootstrap: str, topic: str) -> int:
    """Messages the topic holds: the sum over its partitions of end minus start offset."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "iotfraud-demo-summary"})
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        total = 0
        for partition in partitions:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), 10)
            total += high - low
        return total
    finally:
        consumer.close()


def alerts_topic_line(bootstrap_servers: str, topic: str, lake_root: str) -> str:
    """How many messages the alerts topic holds, for how many alerts, and how to read it; then
    the fast path's messages, and how much earlier than the windowed path it raised the alerts
    both raised."""
    import json
    from datetime import datetime, timezone
    from statistics import median

    from infra.kafka_client import read_topic
    from pipeline.publish import FAST, PATH

    messages = read_topic({"bootstrap.servers": bootstrap_servers}, topic)
    records = [json.loads(m.value()) for m in messages]
    windowed = {r["alert_id"] for r in records if r.get(PATH) != FAST}
    fast_first: dict[str, datetime] = {}
    for message, record in zip(messages, records, strict=True):
        if record.get(PATH) == FAST:
            at = datetime.fromtimestamp(message.timestamp()[1] / 1000, timezone.utc)
            fast_first[record["alert_id"]] = min(at, fast_first.get(record["alert_id"], at))
    line = (f"alerts topic {topic}: {len(messages):,} messages, {len(windowed):,} alerts from "
            f"the windowed path (kcat -C -b {bootstrap_servers} -t {topic})")  # fmt: skip
    if not fast_first:
        return line
    fast_messages = sum(1 for r in records if r.get(PATH) == FAST)
    detected = {r["alert_id"]: r["detected_at"]
                for r in table_rows(lake_root, "alerts", ["alert_id", "detected_at"])
                if r["alert_id"] in fast_first and r["detected_at"] is not None}  # fmt: skip
    leads = [
        (at if at.tzinfo else at.replace(tzinfo=timezone.utc)).timestamp()
        - fast_first[alert_id].timestamp()
        for alert_id, at in detected.items()
    ]
    line += (f"\nfast path: {fast_messages:,} messages for {len(fast_first):,} alerts; "
             f"{len(leads):,} of them in the table")  # fmt: skip
    if leads:
        first = sum(1 for lead in leads if lead > 0)
        line += (f", {first:,} raised first by the fast path, a median "
                 f"{median(leads):.1f} s before the windowed path")  # fmt: skip
    return line


def summary(
    lake_root: str,
    produced: int | None = None,
    published: str | None = None,
) -> str:
    """What the demo ends with: messages produced, row counts, alerts by type (and the alerts
    topic's line, ``published``), quality per scenario, latency."""
    latency = alert_latency(lake_root)
    latency_line = f"alert latency (Kafka -> alert committed): {latency or 'n/a (no alerts)'}"
    by_type = alerts_by_type(lake_root)
    statuses = Counter(r["status"] for r in table_rows(lake_root, lake.ALERTS, ["status"]))
    unscored = unscored_injections(lake_root)
    return "\n".join([
        *([] if produced is None else [f"produced to Kafka: {produced:,} messages"]),
        "summary: " + progress_line(lake_root),
        "alerts by type: " + (", ".join(f"{t} {n:,}" for t, n in by_type.most_common()) or "none"),
        f"withdrawn when their window closed (not counted above): {statuses[c.ALERT_WITHDRAWN]:,}",
        *([] if published is None else [published]),
        "detection against ground truth (an injection is detected when an alert of its type "
        "overlaps it on its device):",
        detection_summary(lake_root),
        *([] if unscored is None else [unscored]),
        latency_line,
    ])  # fmt: skip


def scenario_timing(bounded: bool) -> dict[str, str]:
    """Simulator settings that give every injection a fair chance against the pipeline's
    settings (unless set in the environment): value scenarios start once devices are past the
    detector's cold start, and in a bounded run none starts so late that its windows cannot
    close (a window plus the watermark) before the end."""
    from pipeline.settings import PipelineSettings, seconds

    pipeline = load_settings(PipelineSettings)
    timing = {"IOT_SIM_SCENARIO_WARMUP_S": str(pipeline.profile_spec().cold_start_s)}
    if bounded:
        tail = seconds(pipeline.window) + seconds(pipeline.watermark)
        timing["IOT_SIM_QUIET_TAIL_S"] = str(tail)
    return {k: v for k, v in timing.items() if k not in os.environ}


SILENCE_TRIGGER = "IOT_PIPELINE_SILENCE_TRIGGER_INTERVAL"
# The demo's silence query reads no more often than this, in wall-clock seconds. Every simulated
# minute (4 s at 15x) is more often than its batches finish on a small machine: it ran back to
# back and took the cores detection needs for the alerts an analyst waits for (docs/PERFORMANCE.md,
# issue 21, 2026-12-04). A silence is minutes of simulated time, and the bounded run's quiet tail
# (``scenario_timing``) leaves room for the last read.
SILENCE_READ_FLOOR_S = 20


def pipeline_timing(accelerate: float) -> dict[str, str]:
    """The silence query's trigger at the simulated clock's pace, but not more often than every
    SILENCE_READ_FLOOR_S of wall clock (unless set in the environment): its default suits a
    fleet in real time, and at ``accelerate`` 15 it would let 15 simulated minutes pass between
    two reads, so a bounded run would end before its last silences are called. The pipeline's
    trigger is 1 s already."""
    from pipeline.settings import PipelineSettings, seconds

    if SILENCE_TRIGGER in os.environ or accelerate == 1:
        return {}
    every = seconds(load_settings(PipelineSettings).silence_trigger_interval)
    pace = accelerate or math.inf  # 0: as fast as it can
    # Never more often than the floor, nor less often than the setting itself asks for.
    wall = max(round(every / pace), min(every, SILENCE_READ_FLOOR_S))
    return {SILENCE_TRIGGER: f"{wall} seconds"}


@dataclass(frozen=True)
class DemoOptions:
    """The demo's command line (``demo``)."""

    duration: float
    no_dashboard: bool
    devices: int
    accelerate: float
    seed: int | None
    train_devices: int
    train_hours: float
    no_train: bool
    verbose: bool


@command("demo")
@click.option(
    "--duration",
    type=click.FloatRange(min=0),
    default=0.0,
    help="Stop after N seconds (0: run until Ctrl-C).",
)
@click.option("--no-dashboard", is_flag=True, help="Do not start the dashboard.")
@click.option(
    "--devices",
    type=click.IntRange(min=1),
    default=2000,
    show_default=True,
    help="Fleet size of a new registry.",
)
@click.option(
    "--accelerate",
    type=click.FloatRange(min=0),
    default=1.0,
    show_default=True,
    help="Simulated seconds per wall second (1 = real time; more shows more "
    "scenarios); needs --duration.",
)
@click.option("--seed", type=int, help="Seed of the telemetry (default: new each run).")
@click.option(
    "--train-devices",
    type=click.IntRange(min=1),
    default=150,
    show_default=True,
    help="Fleet size of the first model's history (when none is registered).",
)
@click.option(
    "--train-hours",
    type=click.FloatRange(min=0, min_open=True),
    default=2.0,
    show_default=True,
    help="Simulated hours of the first model's history.",
)
@click.option(
    "--no-train",
    is_flag=True,
    help="Do not train a first model (the pipeline runs its rules only).",
)
def demo(**options: Any) -> int:
    """Run the whole demo: a Kafka broker, a first model, the simulator, the pipeline and the
    dashboard, until --duration or Ctrl-C; then a summary of what was detected."""
    current = invocation()
    args = DemoOptions(**options, verbose=current.verbose)
    if args.accelerate != 1.0 and not args.duration:
        raise click.UsageError(
            "--accelerate needs --duration (so the simulated clock ends near now)"
        )
    stack_settings, common = load_settings(StackSettings), load_settings(CommonSettings)
    # A broker the demo starts is the demo's: it stops with it. One started before (`iotfraud
    # stack up`) keeps running.
    own_broker = not stack.local_broker(stack_settings).is_running()
    try:
        with stop_signals():  # until the children run, any stop signal ends the demo at once
            return run_demo(args, stack_settings, common, current.log_file)
    except Stopped as stopped:
        print(f"demo stopped ({stopped}) before the pipeline started", file=sys.stderr)
        return 1
    finally:
        if own_broker and stack.down(stack_settings):
            log.info("stopped the Kafka broker the demo started")


def main(argv: list[str] | None = None) -> int:
    """``iotfraud demo`` (also ``python -m iotfraud.demo``)."""
    return run(demo, argv, prog="iotfraud demo")


def run_demo(
    args: DemoOptions,
    stack_settings: StackSettings,
    common: CommonSettings,
    log_file: Path | None = None,
) -> int:
    status = stack.up(stack_settings, common, die_with_parent=True)
    print("\n".join(status.lines()))
    if log_file is not None:
        # The children log there too (same state folder); -v passes on to them.
        print(f"logs (Spark, MLflow, warnings): {log_file}"
              f"{'' if args.verbose else '; -v shows them here'}", flush=True)  # fmt: skip
    if not status.healthy:
        print("stack NOT healthy", file=sys.stderr)
        return 1
    env = {**os.environ, "IOT_LAKE_ROOT": common.lake_root,
           "KAFKA_BOOTSTRAP_SERVERS": status.bootstrap_servers}  # fmt: skip
    if not table_rows(common.lake_root, lake.DEVICES, ["device_id"]):
        run_child(
            "registry",
            [sys.executable, "-m", "simulator", *verbose(args), "registry", "create",
             "--devices", str(args.devices)],
            env,
        )  # fmt: skip
    if not args.no_train:
        ensure_model(env, args.train_devices, args.train_hours, verbose(args))

    # The pipeline checks its topic at start: create it before either side runs.
    ensure_topic({"bootstrap.servers": status.bootstrap_servers}, common.topic, partitions=4)
    if common.firmware_topic:
        ensure_topic({"bootstrap.servers": status.bootstrap_servers}, common.firmware_topic, 1)
    stop = threading.Event()

    def request_stop(signum: int, _frame: FrameType | None) -> None:
        stop.set()

    children = Children()
    # Ctrl-C, SIGTERM or a closed terminal end the run as --duration does, with the summary.
    with stop_signals(request_stop):
        try:
            ready = stack_settings.state_dir / "pipeline.ready"
            return supervise(args, env, status.bootstrap_servers, common,
                             children=children, stop=stop, ready=ready)  # fmt: skip
        finally:
            children.stop()


def verbose(args: DemoOptions) -> list[str]:
    """The children's options for the demo's ``-v``."""
    return ["-v"] if args.verbose else []


def wait_until_ready(
    ready: Path, children: Children, stop: threading.Event, timeout_s: float = 600.0
) -> bool:
    """Wait until the pipeline has created ``ready`` (the model loaded, every query past its
    first micro-batch); False, said on the terminal, when it failed, a stop was asked for or it
    took ``timeout_s``."""
    print("starting the pipeline (Spark, its queries, the model)", flush=True)
    started = time.monotonic()
    while not ready.exists():
        failed = children.failed()
        if failed:
            print("demo stopped: " + "; ".join(failed), file=sys.stderr)
            return False
        if stop.wait(1):
            return False
        if time.monotonic() - started > timeout_s:
            print(f"demo stopped: the pipeline did not start in {timeout_s:.0f} s (its log says "
                  "why: see the logs line above)", file=sys.stderr)  # fmt: skip
            return False
    print(f"pipeline running after {time.monotonic() - started:.0f} s; starting the simulator",
          flush=True)  # fmt: skip
    return True


def supervise(
    args: DemoOptions,
    env: dict[str, str],
    bootstrap_servers: str,
    common: CommonSettings,
    *,
    children: Children,
    stop: threading.Event,
    ready: Path,
) -> int:
    """Run the children until --duration, a stop request or a child's failure; then let the
    pipeline finish what was sent, stop it and print the summary."""
    python = [sys.executable, "-m"]
    ready.unlink(missing_ok=True)
    # The demo's progress line stands for the pipeline's; the pipeline's warnings still show.
    pipeline = children.start(
        "pipeline",
        [*python, "pipeline", *verbose(args), "run", "--no-progress", "--ready-file", str(ready)],
        {**env, **pipeline_timing(args.accelerate)},
    )
    # The devices start once the pipeline runs: what they send while Spark and the model load
    # would wait in Kafka, and the first alerts would come that much later (at --accelerate 15,
    # half a minute of start is seven simulated minutes of backlog).
    if not wait_until_ready(ready, children, stop):
        return 1
    # Real time by default: each device reports every 10-30 s, so event times stay close to
    # now. A new seed per run: a rerun must not resend the event ids of the previous one.
    seed = str(args.seed if args.seed is not None else int(time.time()))
    sim_env = {**env, **scenario_timing(args.duration > 0)}
    simulate = [*python, "simulator", *verbose(args), "simulate",
                "--accelerate", str(args.accelerate), "--seed", seed, "--no-progress"]  # fmt: skip
    if args.duration:
        simulate += ["--duration", str(args.duration)]
    children.start("simulator", simulate, sim_env)
    started = time.monotonic()
    if not args.no_dashboard:
        children.start("dashboard", [*python, "dashboard", *verbose(args)], env)
        port = os.environ.get("IOT_DASH_PORT", "8501")
        print(f"dashboard: http://localhost:{port} (Ctrl-C stops the demo)", flush=True)
    while not stop.wait(10):
        print(progress_line(common.lake_root), flush=True)
        failed = children.failed()
        if failed:
            print("demo stopped: " + "; ".join(failed), file=sys.stderr)
            return 1
        if args.duration and time.monotonic() - started >= args.duration:
            break
    children.stop("simulator")
    drain(pipeline, common.lake_root)
    children.stop()
    from pipeline.settings import PipelineSettings

    alerts_topic = load_settings(PipelineSettings).alerts_topic
    produced = messages_in_topic(bootstrap_servers, common.topic)
    published = (alerts_topic_line(bootstrap_servers, alerts_topic, common.lake_root)
                 if alerts_topic else None)  # fmt: skip
    print("\n" + summary(common.lake_root, produced, published))
    return 0
