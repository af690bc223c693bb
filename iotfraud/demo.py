"""``iotfraud demo``: the whole product on one machine.

Brings the local stack up, creates the device registry when there is none, then runs the
simulator, the pipeline and the dashboard as child processes, shows progress, and stops them all
cleanly on Ctrl-C (or after ``--duration`` seconds, ending with a summary).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from infra import contract as c
from infra import lake, stack
from infra.logs import configure_logging
from infra.settings import CommonSettings, StackSettings, load_settings
from simulator.producer import ensure_topic

log = logging.getLogger(__name__)


@dataclass
class Children:
    """The demo's child processes, stopped in reverse start order."""

    procs: list[tuple[str, subprocess.Popen[bytes]]] = field(default_factory=list)

    def start(self, name: str, args: list[str], env: dict[str, str]) -> None:
        log.info("starting %s", name)
        proc = subprocess.Popen([sys.executable, "-m", *args], env=env, start_new_session=True)
        self.procs.append((name, proc))

    def failed(self) -> list[str]:
        return [
            f"{n} exited with {p.returncode}" for n, p in self.procs if p.poll() not in (None, 0)
        ]

    def stop(self, name: str | None = None, timeout_s: float = 90.0) -> None:
        for child, proc in reversed(self.procs):
            if (name is None or child == name) and proc.poll() is None:
                log.info("stopping %s", child)
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout_s)
                except subprocess.TimeoutExpired:
                    log.warning("%s did not stop in %.0fs; killing it", child, timeout_s)
                    os.killpg(proc.pid, signal.SIGKILL)


def table_rows(
    lake_root: str, table: str, columns: list[str] | None = None
) -> list[dict[str, Any]]:
    """Rows of a Delta table read with deltalake; empty when the table does not exist yet."""
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        rows: list[dict[str, Any]] = (
            DeltaTable(lake.table_path(lake_root, table))
            .to_pyarrow_table(columns=columns)
            .to_pylist()
        )
    except TableNotFoundError:
        return []
    return rows


def progress_line(lake_root: str) -> str:
    telemetry = len(table_rows(lake_root, lake.TELEMETRY, ["event_id"]))
    quarantine = len(table_rows(lake_root, lake.QUARANTINE, ["reason"]))
    alerts = Counter(r["alert_type"] for r in table_rows(lake_root, lake.ALERTS, ["alert_type"]))
    top = ", ".join(f"{t} {n}" for t, n in alerts.most_common(4))
    return (
        f"telemetry {telemetry:,} | quarantine {quarantine:,} | alerts {sum(alerts.values()):,}"
        + (f" ({top})" if top else "")
    )


def detection_summary(lake_root: str) -> list[str]:
    """Per injected scenario: devices injected, devices with a matching alert (recall)."""
    truth = table_rows(lake_root, lake.GROUND_TRUTH, ["device_id", "scenario"])
    alerts = table_rows(lake_root, lake.ALERTS, ["device_id", "alert_type"])
    alerted: dict[str, set[str]] = {}
    for alert in alerts:
        alerted.setdefault(alert["device_id"], set()).add(alert["alert_type"])
    lines = []
    for scenario in c.FRAUD_SCENARIOS:
        devices = {r["device_id"] for r in truth if r["scenario"] == scenario}
        if not devices:
            continue
        wanted = set(c.SCENARIO_ALERT_TYPES.get(scenario, ()))
        found = {d for d in devices if alerted.get(d, set()) & wanted}
        lines.append(f"  {scenario:<18} injected on {len(devices):>3} devices, detected on "
                     f"{len(found):>3} (recall {len(found) / len(devices):.2f})")  # fmt: skip
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="iotfraud demo", description=__doc__)
    parser.add_argument("--duration", type=float, default=0, help="stop after N seconds")
    parser.add_argument("--no-dashboard", action="store_true", help="do not start the dashboard")
    parser.add_argument("--devices", type=int, default=2000, help="fleet size of a new registry")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    configure_logging(args.verbose)

    stack_settings, common = load_settings(StackSettings), load_settings(CommonSettings)
    status = stack.up(stack_settings, common)
    print("\n".join(status.lines()))
    if not status.healthy:
        print("stack NOT healthy", file=sys.stderr)
        return 1
    env = {**os.environ, "IOT_LAKE_ROOT": common.lake_root,
           "KAFKA_BOOTSTRAP_SERVERS": status.bootstrap_servers}  # fmt: skip
    if not table_rows(common.lake_root, lake.DEVICES, ["device_id"]):
        subprocess.run(
            [sys.executable, "-m", "simulator", "registry", "create",
             "--devices", str(args.devices)],
            env=env, check=True,
        )  # fmt: skip

    # The pipeline checks its topic at start: create it before either side runs.
    ensure_topic({"bootstrap.servers": status.bootstrap_servers}, common.topic, partitions=4)
    stop = threading.Event()

    def request_stop(signum: int, _frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGINT, request_stop)
    signal.signal(signal.SIGTERM, request_stop)
    children = Children()
    started = time.monotonic()
    try:
        # Real time: each device reports every 10-30 s, so event times stay close to now.
        # A new seed per run: a rerun must not resend the event ids of the previous one.
        seed = str(int(time.time()))
        children.start("simulator", ["simulator", "simulate", "--accelerate", "1", "--seed", seed,
                                     "--no-progress"], env)  # fmt: skip
        children.start("pipeline", ["pipeline", "run"], env)
        if not args.no_dashboard:
            children.start("dashboard", ["dashboard"], env)
            print("dashboard: http://localhost:8501 (Ctrl-C stops the demo)")
        while not stop.wait(10):
            print(progress_line(common.lake_root), flush=True)
            failed = children.failed()
            if failed:
                print("demo stopped: " + "; ".join(failed), file=sys.stderr)
                return 1
            if args.duration and time.monotonic() - started >= args.duration:
                break
        # Let the pipeline drain what the simulator sent before it stops.
        children.stop("simulator")
        time.sleep(15)
    finally:
        children.stop()
    print("\nsummary: " + progress_line(common.lake_root))
    print("\n".join(detection_summary(common.lake_root)) or "  (no ground truth yet)")
    return 0
