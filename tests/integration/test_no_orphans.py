"""The real commands leave no process behind (issue 24): the dashboard's Streamlit server, and
the demo's broker, pipeline, simulator and dashboard, end with the command that started them.

Before, a SIGTERM to ``iotfraud dashboard`` left its Streamlit server serving, and a demo stopped
with Ctrl-C left the Streamlit server and the Kafka broker running.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
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


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGKILL])
def test_the_demo_leaves_nothing_running(tmp_path: Path, signum: signal.Signals) -> None:
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
        os.kill(proc.pid, signum)
        proc.wait(300)
        if signum == signal.SIGINT:  # stopped as --duration would: drained, with a summary
            assert proc.returncode == 0, log.read_text()[-3000:]
            assert "summary: telemetry" in log.read_text()
        assert not wait_gone(started, 60), f"left running after {signum.name}: {started}"
        assert not listening(kafka_port), "the broker the demo started still listens"
        assert not listening(dash_port)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        leftovers = descendants(proc.pid)
        for pid in leftovers:
            os.kill(pid, signal.SIGKILL)
