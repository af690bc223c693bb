"""``iotfraud pipeline run`` as an operator runs it: bad set-ups fail at start, SIGTERM stops it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from tests.pipeline_helpers import device_series, encoded, produce, write_registry

pytestmark = pytest.mark.integration


def pipeline_env(tmp_path: Path, bootstrap: str, topic: str, **extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "IOT_LAKE_ROOT": str(tmp_path / "lake"),
        "IOT_PIPELINE_CHECKPOINT_ROOT": str(tmp_path / "cp"),
        "KAFKA_BOOTSTRAP_SERVERS": bootstrap,
        "IOT_TOPIC": topic,
        "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}",
        "IOT_SPARK_MASTER": "local[2]",
        "IOT_SPARK_DRIVER_MEMORY": "1g",
        "IOT_PIPELINE_STATUS_INTERVAL_S": "1",
        "IOT_FIRMWARE_TOPIC": "",
        **extra,
    }


def run_cli(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "iotfraud", "pipeline", "run"],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_missing_topic_fails_at_start(tmp_path: Path, bootstrap: str) -> None:
    result = run_cli(pipeline_env(tmp_path, bootstrap, "no.such.topic"))
    assert result.returncode == 2
    assert "Topic 'no.such.topic' does not exist" in result.stderr


def test_unwritable_lake_fails_at_start(
    tmp_path: Path, bootstrap: str, make_topic: Callable[..., str]
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    env = pipeline_env(tmp_path, bootstrap, make_topic(), IOT_LAKE_ROOT=str(blocker / "lake"))
    result = run_cli(env)
    assert result.returncode == 2
    assert "is not writable" in result.stderr and "IOT_LAKE_ROOT" in result.stderr


def test_inconsistent_windows_fail_at_start(tmp_path: Path, bootstrap: str) -> None:
    env = pipeline_env(tmp_path, bootstrap, "t", IOT_PIPELINE_SLIDE="3 minutes")
    result = run_cli(env)
    assert result.returncode == 2
    assert "must be a multiple of slide" in result.stderr


def telemetry_version(path: Path) -> int:
    from deltalake import DeltaTable

    try:
        return int(DeltaTable(str(path)).version())
    except Exception:  # not created yet, or its first commit is being written
        return -1


def ingest_metrics_rows(lake: Path) -> int:
    """The ingest query's rows in ``pipeline_metrics`` (other queries may report first)."""
    from deltalake import DeltaTable

    try:
        table = DeltaTable(str(lake / "pipeline_metrics")).to_pyarrow_table(columns=["query_name"])
    except Exception:  # not created yet, or its first commit is being written
        return 0
    return sum(1 for name in table.column("query_name").to_pylist() if name == "ingest")


def test_sigterm_stops_the_pipeline_cleanly(
    tmp_path: Path, bootstrap: str, make_topic: Callable[..., str]
) -> None:
    from deltalake import DeltaTable

    topic = make_topic()
    write_registry(str(tmp_path / "lake"), ["dev-1"])
    start = datetime.now(timezone.utc) - timedelta(minutes=30)
    produce(bootstrap, topic, encoded(device_series("dev-1", start, 30)))
    proc = subprocess.Popen(
        [sys.executable, "-m", "iotfraud", "pipeline", "run"],
        env=pipeline_env(tmp_path, bootstrap, topic),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    telemetry = tmp_path / "lake" / "telemetry"
    deadline = time.monotonic() + 180
    try:
        while True:
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "no telemetry written"
            # The status loop flushes metrics and then prints the status line: once
            # pipeline_metrics has ingest rows, a status line with its batch has been printed.
            if telemetry_version(telemetry) >= 1 and ingest_metrics_rows(tmp_path / "lake") > 0:
                break
            time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, stderr[-3000:]
    assert "received SIGTERM" in stderr
    assert "ingest: batch" in stderr  # the live status line
    assert DeltaTable(str(telemetry)).to_pyarrow_table().num_rows == 30
