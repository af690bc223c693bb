"""The real commands leave no process behind (issue 24): the dashboard's Streamlit server, and
the demo's broker, pipeline, simulator and dashboard, end with the command that started them.

Before, a SIGTERM to ``iotfraud dashboard`` left its Streamlit server serving, and a demo stopped
with Ctrl-C left the Streamlit server and the Kafka broker running.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import pytest

from infra.ports import free_port
from tests.process_helpers import descendants, wait_gone

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def serving(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def listening(port: int, timeout_s: float = 10.0) -> bool:
    """True if ``port`` still accepts connections after waiting up to ``timeout_s`` for it to
    close (a killed process's last threads can outlive its main one for a moment)."""
    deadline = time.monotonic() + timeout_s
    while True:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) != 0:
                return False
        if time.monotonic() > deadline:
            return True
        time.sleep(0.2)


def wait_for(condition: object, what: str, timeout_s: float, proc: subprocess.Popen[bytes],
             log: Path) -> None:  # fmt: skip
    deadline = time.monotonic() + timeout_s
    while not condition():  # type: ignore[operator]
        if proc.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"{what} did not happen:\n{log.read_text()[-3000:]}")
        time.sleep(0.5)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGKILL])
def test_the_dashboard_server_ends_with_the_command(tmp_path: Path, signum: signal.Signals) -> None:
    port, log = free_port(), tmp_path / "dashboard.log"
    env = {**os.environ, "IOT_LAKE_ROOT": str(tmp_path / "lake"),
           "IOT_STACK_STATE_DIR": str(tmp_path / "state"),
           "IOT_DASH_MAP_STYLE": "none"}  # fmt: skip
    command = [sys.executable, "-m", "iotfraud", "dashboard", "--port", str(port)]
    with log.open("wb") as out:
        proc = subprocess.Popen(command, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip
    try:
        wait_for(lambda: serving(port), "the dashboard serving", 60, proc, log)
        started = descendants(proc.pid)
        assert started, "the dashboard command runs its server as a child"
        os.kill(proc.pid, signum)
        proc.wait(30)
        assert not wait_gone(started, 20), f"left running after {signum.name}: {started}"
        assert not listening(port)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def ingested(checkpoint: Path) -> int:
    """How many messages the query whose checkpoint this is has read and committed: the end
    offsets of its last committed micro-batch, summed over the partitions (from offset 0)."""
    last = max(int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit())
    offsets = json.loads((checkpoint / "offsets" / str(last)).read_text().splitlines()[2])
    return sum(end for partitions in offsets.values() for end in partitions.values())


# The demo's own call, in a process of its own that the test SIGKILLs.
BROKER_PARENT = textwrap.dedent("""
    import time
    from infra import stack
    from infra.settings import CommonSettings, StackSettings, load_settings

    status = stack.up(load_settings(StackSettings), load_settings(CommonSettings),
                      die_with_parent=True)
    print(status.bootstrap_servers, flush=True)
    time.sleep(600)
""")


def test_the_demos_broker_ends_with_a_killed_demo(tmp_path: Path) -> None:
    """A SIGKILLed demo leaves no broker: the kernel ends it (its other children are started by
    ``infra.processes``, which tests/unit/test_processes.py kills the same way)."""
    kafka_port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO), "IOT_STACK_STATE_DIR": str(tmp_path / "state"),
           "IOT_LAKE_ROOT": str(tmp_path / "lake"), "IOT_STACK_KAFKA_PORT": str(kafka_port),
           "IOT_STACK_KAFKA_CONTROLLER_PORT": str(free_port())}  # fmt: skip
    parent = subprocess.Popen(
        [sys.executable, "-c", BROKER_PARENT], env=env, cwd=tmp_path, stdout=subprocess.PIPE,
        text=True, start_new_session=True,
    )  # fmt: skip
    started: set[int] = set()
    try:
        assert parent.stdout is not None
        assert parent.stdout.readline().strip() == f"127.0.0.1:{kafka_port}"
        started = descendants(parent.pid)
        assert started, "the broker runs as the parent's child"
        assert listening(kafka_port, timeout_s=0)
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(30)
        assert not wait_gone(started, 60), f"left running after SIGKILL: {started}"
        assert not listening(kafka_port), "the broker still listens"
    finally:
        if parent.poll() is None:
            os.killpg(parent.pid, signal.SIGKILL)
        for pid in started | descendants(parent.pid):  # an orphan is no descendant any more
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_ctrl_c_ends_the_demo_with_a_summary_and_leaves_nothing_running(tmp_path: Path) -> None:
    dash_port, kafka_port = free_port(), free_port()
    log = tmp_path / "demo.log"
    env = {
        **os.environ,
        "IOT_STACK_STATE_DIR": str(tmp_path / "state"),
        "IOT_LAKE_ROOT": str(tmp_path / "lake"),
        "IOT_PIPELINE_CHECKPOINT_ROOT": str(tmp_path / "checkpoints"),
        "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}",
        "IOT_STACK_KAFKA_PORT": str(kafka_port),
        "IOT_STACK_KAFKA_CONTROLLER_PORT": str(free_port()),
        "IOT_DASH_PORT": str(dash_port),
        "IOT_DASH_MAP_STYLE": "none",
        "IOT_SPARK_DRIVER_MEMORY": "1g",
    }
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "iotfraud", "demo", "--no-train", "--devices", "50"],
            cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        # Everything the demo starts is up: broker, dashboard, and a first progress line.
        wait_for(lambda: serving(dash_port), "the demo's dashboard serving", 240, proc, log)
        wait_for(lambda: "telemetry " in log.read_text(), "a progress line", 120, proc, log)
        started = descendants(proc.pid)
        assert len(started) >= 5, started  # broker, pipeline (and its JVM), simulator, dashboard
        os.kill(proc.pid, signal.SIGINT)
        proc.wait(300)
        # Stopped as --duration would: drained, with a summary.
        assert proc.returncode == 0, log.read_text()[-3000:]
        text = log.read_text()
        assert "summary: telemetry" in text
        # Drained: the pipeline read every message the demo produced before it stopped.
        produced = re.search(r"produced to Kafka: ([\d,]+) messages", text)
        assert produced, text[-3000:]
        ingest = tmp_path / "checkpoints" / "ingest"
        assert ingested(ingest) == int(produced.group(1).replace(",", ""))
        assert not wait_gone(started, 60), f"left running after Ctrl-C: {started}"
        assert not listening(kafka_port), "the broker the demo started still listens"
        assert not listening(dash_port)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        leftovers = descendants(proc.pid)
        for pid in leftovers:
            os.kill(pid, signal.SIGKILL)
