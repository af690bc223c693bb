"""Alert latency on the alerts topic, fast path and windowed path in the same live run.

Usage::

    .venv/bin/python bench/alert_latency.py [--rate 5000] [--seconds 180] [--devices 25000]

Starts its own broker (free ports, temp folder) unless KAFKA_BOOTSTRAP_SERVERS is set, creates a
registry, starts ``python -m pipeline run`` as a user would (every query, the fast path on, rules
only, ``local[2]`` plus the fast path's slot per partition, 4 partitions) and, once it runs, the
simulator at ``--rate`` events/s for ``--seconds`` with every scenario, rogue devices and firmware
changes ten times as often as by default (devices report every 4-6 s, so 5 x ``--rate`` devices
run the simulated clock in real time). After a drain it reads the
alerts topic and the lake and prints a JSON object:

- ``fast``: per fast-path message, its Kafka timestamp minus the Kafka timestamp of the telemetry
  message that raised it (both stamped by the producers on this machine's clock), p50/p95/max in
  milliseconds;
- ``windowed``: per windowed ``rogue_device`` or ``firmware_mismatch`` alert, its first message's
  Kafka timestamp minus the Kafka timestamp of the telemetry message that made its window call
  for it (the rules' minimum of events reached with an offending one among them);
- ``fast_ahead_s``: for alerts both paths raised, how much earlier the fast path's first message
  was;
- the query metrics of ``bench/pipeline_latency.py`` (batch durations, input rates).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pandas as pd
from bench_broker import bench_broker
from pipeline_latency import check_running, lake_rows, quantiles, query_metrics, stop

from infra import contract as c
from infra.kafka_client import read_topic
from iotfraud.demo import table_rows
from pipeline.publish import FAST, PATH, WINDOWED, read_alert_message
from pipeline.rules import Thresholds

SCENARIOS = ("rogue_device", "firmware_change")  # what the simulator injects to raise them
ALERTS_TOPIC = "bench.alerts"


def run(root: Path, bootstrap: str, args: argparse.Namespace) -> int:
    """Registry, pipeline and simulator against ``bootstrap``; the messages sent."""
    lake = str(root / "lake")
    env = {**os.environ, "KAFKA_BOOTSTRAP_SERVERS": bootstrap, "IOT_LAKE_ROOT": lake,
           "IOT_TOPIC": "bench.telemetry", "IOT_PIPELINE_CHECKPOINT_ROOT": str(root / "cp"),
           "IOT_PIPELINE_ALERTS_TOPIC": ALERTS_TOPIC,
           "MLFLOW_TRACKING_URI": f"sqlite:///{root / 'none.db'}",
           "IOT_SPARK_MASTER": "local[2]",
           "IOT_SIM_DEVICES": str(args.devices), "IOT_SIM_PARTITIONS": "4",
           "IOT_SIM_INTERVAL_MIN_S": "4", "IOT_SIM_INTERVAL_MAX_S": "6",
           # Enough rogue devices and firmware changes in a few minutes to measure.
           "IOT_SIM_SCENARIO_RATES": json.dumps({s: 60 for s in SCENARIOS})}  # fmt: skip
    subprocess.run([sys.executable, "-m", "simulator", "registry", "create"], env=env,
                   check=True, capture_output=True)  # fmt: skip
    subprocess.run([sys.executable, "-m", "simulator", "simulate", "--count", "1",
                    "--no-scenarios", "--no-progress"], env=env, check=True,
                   capture_output=True)  # fmt: skip
    log_path = root / "pipeline.log"
    log = log_path.open("wb")
    pipeline = subprocess.Popen([sys.executable, "-m", "pipeline", "run"], env=env,
                                stdout=log, stderr=log, start_new_session=True)  # fmt: skip
    try:
        while lake_rows(lake) < 1:  # the warm-up message is through: it runs
            check_running(pipeline, log_path)
            time.sleep(1)
        time.sleep(10)  # the fast path's tasks are up
        simulator = subprocess.Popen(
            [sys.executable, "-m", "simulator", "simulate", "--rate", str(args.rate),
             "--duration", str(args.seconds), "--no-progress"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        while simulator.poll() is None:
            check_running(pipeline, log_path, simulator)
            time.sleep(2)
        out, _ = simulator.communicate()
        final = out.decode().strip().splitlines()[-1]
        match = re.search(r"sent ([\d,]+)", final)
        assert match, final
        sent = int(match.group(1).replace(",", "")) + 1
        deadline = time.monotonic() + args.drain
        while lake_rows(lake) < sent and time.monotonic() < deadline:
            check_running(pipeline, log_path)
            time.sleep(5)
        time.sleep(30)  # detection finishes its last batches
    finally:
        stop(pipeline)
        log.close()
    return sent


def topic_alerts(bootstrap: str) -> pd.DataFrame:
    """Every message of the alerts topic: path, alert id and type, device, window start, the
    raising event's Kafka timestamp (fast path), and the message's own Kafka timestamp."""
    rows = []
    for message in read_topic({"bootstrap.servers": bootstrap}, ALERTS_TOPIC, timeout_s=300):
        record = read_alert_message(message.value())
        published = pd.Timestamp(message.timestamp()[1], unit="ms", tz="UTC")
        rows.append({"path": record[PATH], "alert_id": record["alert_id"],
                     "alert_type": record["alert_type"], "device_id": record["device_id"],
                     "window_start": record["window_start"], "published": published,
                     "event_sent": record.get("kafka_timestamp")})  # fmt: skip
    frame = pd.DataFrame(rows)
    for name in ("window_start", "event_sent"):
        frame[name] = pd.to_datetime(frame[name], utc=True)
    return frame


def windowed_due(alerts: pd.DataFrame, lake: str, window_s: int) -> pd.Series:
    """Per windowed per-event alert, the Kafka timestamp of the telemetry message with which its
    window first held the rules' minimum of events and an offending one (NaT if none did)."""
    telemetry = pd.DataFrame(table_rows(lake, "telemetry", ["device_id", "event_time", "firmware",
                                                            "kafka_timestamp"]))  # fmt: skip
    devices = pd.DataFrame(table_rows(lake, "devices", ["device_id", "expected_firmware"]))
    telemetry = telemetry[telemetry["device_id"].isin(set(alerts["device_id"]))]
    telemetry = telemetry.merge(devices, on="device_id", how="left")
    for name in ("event_time", "kafka_timestamp"):
        telemetry[name] = pd.to_datetime(telemetry[name], utc=True)
    rogue = telemetry["expected_firmware"].isna()
    differs = telemetry["firmware"].notna() & (
        telemetry["firmware"] != telemetry["expected_firmware"]
    )
    telemetry["offends"] = rogue | differs.fillna(False)
    by_device = {
        d: rows.sort_values("kafka_timestamp") for d, rows in telemetry.groupby("device_id")
    }
    minimum = Thresholds().min_events
    due = []
    for alert in alerts.itertuples():
        rows = by_device.get(alert.device_id)
        if rows is None:
            due.append(pd.NaT)
            continue
        end = alert.window_start + pd.Timedelta(seconds=window_s)
        inside = rows[(rows["event_time"] >= alert.window_start) & (rows["event_time"] < end)]
        ready = (pd.Series(range(1, len(inside) + 1), index=inside.index) >= minimum) & (
            inside["offends"].cumsum() > 0
        )
        due.append(inside.loc[ready, "kafka_timestamp"].iloc[0] if ready.any() else pd.NaT)
    return pd.Series(due, index=alerts.index, dtype="datetime64[ns, UTC]")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rate", type=float, default=5000)
    parser.add_argument("--seconds", type=float, default=180)
    parser.add_argument("--devices", type=int, default=25000)
    parser.add_argument("--drain", type=float, default=300)
    args = parser.parse_args()

    from pipeline.settings import PipelineSettings, seconds

    window_s = seconds(PipelineSettings().window)
    with tempfile.TemporaryDirectory(prefix="alertbench-") as tmp:
        root = Path(tmp)
        with bench_broker(root / "kafka") as bootstrap:
            sent = run(root, bootstrap, args)
            messages = topic_alerts(bootstrap)
        lake = str(root / "lake")
        fast = messages[messages["path"] == FAST]
        fast_s = (fast["published"] - fast["event_sent"]).dt.total_seconds()
        windowed = messages[(messages["path"] == WINDOWED)
                            & messages["alert_type"].isin(c.PER_EVENT_ALERT_TYPES)]  # fmt: skip
        first = windowed.sort_values("published").drop_duplicates("alert_id").reset_index()
        first["due"] = windowed_due(first, lake, window_s)
        windowed_s = (first["published"] - first["due"]).dt.total_seconds().dropna()
        fast_first = fast.groupby("alert_id")["published"].min()
        both = first[first["alert_id"].isin(fast_first.index)]
        ahead = (both["published"] - both["alert_id"].map(fast_first)).dt.total_seconds()
        result: dict[str, Any] = {
            "rate": args.rate, "seconds": args.seconds, "devices": args.devices, "sent": sent,
            "fast": {"messages": len(fast), "alerts": int(fast["alert_id"].nunique()),
                     "latency_ms": quantiles(fast_s * 1000) if len(fast) else None},
            "windowed": {"alerts": len(first), "measured": len(windowed_s),
                         "latency_s": quantiles(windowed_s) if len(windowed_s) else None},
            "windowed_alerts_without_fast": int(len(first) - len(both)),
            "fast_ahead_s": quantiles(ahead) if len(ahead) else None,
            "queries": query_metrics(lake),
        }  # fmt: skip
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
