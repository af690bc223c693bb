"""The broker goes down mid-stream and comes back: the simulator and the pipeline recover on
their own, every message sent ends up in the lake exactly once, every alert on the alerts topic,
and the fast path's alert of every rogue reading."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

from infra import lake as lake_tables
from infra.kafka import KafkaBroker
from infra.ports import free_port
from infra.settings import StackSettings
from tests.pipeline_helpers import (
    device_series,
    encoded,
    latest_alerts,
    produce,
    table_alerts,
    topic_messages,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def rows(lake: str, table: str) -> list[dict[str, object]]:
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        data = DeltaTable(lake_tables.table_path(lake, table)).to_pyarrow_table(
            columns=["event_id"]
        )
    except TableNotFoundError:
        return []
    return data.to_pylist()


def fast_alerted(bootstrap: str, topic: str) -> set[str]:
    """The events the fast path published an alert for."""
    from pipeline.publish import FAST, PATH

    messages = [json.loads(m.value()) for m in topic_messages(bootstrap, topic)]
    return {m["event_id"] for m in messages if m[PATH] == FAST}


def test_simulator_and_pipeline_ride_out_a_broker_restart(tmp_path: Path) -> None:
    broker = KafkaBroker(home=tmp_path / "kafka", cache_dir=StackSettings().cache_dir,
                         port=free_port(), controller_port=free_port())  # fmt: skip
    broker.start(timeout_s=90)
    lake = str(tmp_path / "lake")
    env = {
        **os.environ,
        "KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap_servers,
        "IOT_TOPIC": "restart.telemetry",
        "IOT_FIRMWARE_TOPIC": "",
        "IOT_LAKE_ROOT": lake,
        "IOT_PIPELINE_CHECKPOINT_ROOT": str(tmp_path / "cp"),
        "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'none.db'}",
        "IOT_SPARK_MASTER": "local[2]",
        "IOT_SPARK_DRIVER_MEMORY": "1g",
        "IOT_SIM_DEVICES": "100",
        "IOT_SIM_PARTITIONS": "3",
    }
    logs = {name: (tmp_path / f"{name}.log").open("wb") for name in ("simulator", "pipeline")}
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        procs["simulator"] = subprocess.Popen(
            [sys.executable, "-m", "simulator", "simulate", "--rate", "200", "--duration", "90",
             "--no-scenarios", "--no-progress"],
            env=env, stdout=subprocess.PIPE, stderr=logs["simulator"], start_new_session=True,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while not (tmp_path / "lake" / "devices").exists():
            assert time.monotonic() < deadline, "the simulator did not create the registry"
            time.sleep(0.5)
        time.sleep(2)  # the simulator creates the topic before it sends
        procs["pipeline"] = subprocess.Popen(
            [sys.executable, "-m", "pipeline", "run"], env=env, stdout=logs["pipeline"],
            stderr=logs["pipeline"], start_new_session=True,
        )  # fmt: skip
        deadline = time.monotonic() + 180
        while len(rows(lake, "telemetry")) < 1000:
            assert procs["pipeline"].poll() is None, (tmp_path / "pipeline.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the pipeline ingested nothing"
            time.sleep(1)

        # An unregistered device reports around the outage: rogue_device alerts, published.
        rogue = device_series("rogue-restart", datetime.now(timezone.utc), 10, every_s=5)
        produce(broker.bootstrap_servers, "restart.telemetry", encoded(rogue))
        broker.kill()  # the broker dies mid-stream, without a clean shutdown
        time.sleep(15)
        broker.start(timeout_s=90)

        out, _ = procs["simulator"].communicate(timeout=300)
        final = out.decode().strip().splitlines()[-1]
        assert procs["simulator"].returncode == 0, final
        match = re.search(r"sent ([\d,]+) \| delivered ([\d,]+) \| failures 0", final)
        assert match, final
        sent = int(match.group(1).replace(",", ""))
        assert match.group(2) == match.group(1)

        deadline = time.monotonic() + 240
        sent += len(rogue)
        while len(rows(lake, "telemetry")) + len(rows(lake, "quarantine")) < sent:
            assert procs["pipeline"].poll() is None, (tmp_path / "pipeline.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the pipeline did not catch up after the restart"
            time.sleep(2)
        telemetry = rows(lake, "telemetry")
        assert len(telemetry) == sent  # clean telemetry: every message valid, none twice
        assert len({r["event_id"] for r in telemetry}) == sent
        assert rows(lake, "quarantine") == []
        # Once detection has caught up too (no batch between publishing and writing), the
        # alerts topic holds every alert of the table, each latest message equal to its row.
        deadline = time.monotonic() + 180
        while True:
            alerts = table_alerts(lake)
            rogues = {a["alert_type"] for a in alerts.values() if a["device_id"] == "rogue-restart"}
            if rogues and latest_alerts(broker.bootstrap_servers, "iot.alerts") == alerts:
                break
            assert procs["pipeline"].poll() is None, (tmp_path / "pipeline.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the alerts topic does not hold the table's alerts"
            time.sleep(3)
        assert rogues == {"rogue_device"}
        # The fast path rode out the outage too: every rogue reading has its fast alert.
        wanted = {e["event_id"] for e in rogue}
        while not wanted <= fast_alerted(broker.bootstrap_servers, "iot.alerts"):
            assert procs["pipeline"].poll() is None, (tmp_path / "pipeline.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the fast path lost alerts in the restart"
            time.sleep(3)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(60)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
        for log in logs.values():
            log.close()
        broker.stop()
