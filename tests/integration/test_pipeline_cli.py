"""``iotfraud pipeline run`` as an operator runs it: bad set-ups fail at start (SIGTERM stopping
it cleanly: ``test_quiet_terminal.py``)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

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
