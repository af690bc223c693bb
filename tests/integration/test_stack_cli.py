"""``iotfraud stack up | status | down`` as a user runs it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from infra.ports import free_port

pytestmark = pytest.mark.integration


def run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "iotfraud", *args],
        check=False, env=env, capture_output=True, text=True, timeout=180,
    )  # fmt: skip


def test_stack_up_status_down(tmp_path: Path) -> None:
    port = free_port()
    env = {
        **os.environ,
        "IOT_STACK_STATE_DIR": str(tmp_path / "state"),
        "IOT_STACK_KAFKA_PORT": str(port),
        "IOT_STACK_KAFKA_CONTROLLER_PORT": str(free_port()),
        "IOT_LAKE_ROOT": str(tmp_path / "lake"),
    }
    up = run(["stack", "up"], env)
    try:
        assert up.returncode == 0, up.stderr
        assert "stack healthy" in up.stdout
        assert f"127.0.0.1:{port}" in up.stdout
        assert (tmp_path / "lake").is_dir()
        assert (tmp_path / "state" / "mlflow").is_dir()

        status = run(["stack", "status"], env)
        assert status.returncode == 0 and "[ok  ] kafka broker" in status.stdout
    finally:
        down = run(["stack", "down"], env)
    assert down.returncode == 0 and "broker stopped" in down.stdout
    after = run(["stack", "status"], env)
    assert after.returncode == 1 and "[DOWN] kafka broker" in after.stdout
    assert "no broker of this stack was running" in run(["stack", "down"], env).stdout


def test_bad_setting_fails_at_start_with_its_name(tmp_path: Path) -> None:
    env = {**os.environ, "IOT_STACK_KAFKA_HEAP": "lots", "IOT_STACK_STATE_DIR": str(tmp_path)}
    result = run(["stack", "status"], env)
    assert result.returncode == 2
    assert "IOT_STACK_KAFKA_HEAP" in result.stderr
    assert "must look like 512m or 1g" in result.stderr
