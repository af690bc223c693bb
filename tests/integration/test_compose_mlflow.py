"""The compose file's MLflow command line, run for real on this machine (no Docker engine).

Only the paths (the volume), the bind address, the port and the worker count are moved; the
containers' Host header is accepted, a foreign one refused, and an artifact logged through the
server lands in the artifacts folder of the volume.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from infra.ports import free_port
from tests.compose_helpers import (
    BIN,
    docker_compose_command,
    env_of,
    option,
    resolved_services,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def http_status(url: str, host: str) -> int:
    request = urllib.request.Request(url, headers={"Host": host})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def test_the_mlflow_command_serves_the_containers(tmp_path: Path) -> None:
    empty_env = tmp_path / "empty.env"
    empty_env.write_text("")
    services = resolved_services(docker_compose_command(), empty_env)
    service = services["mlflow"]
    assert service["entrypoint"] == ["mlflow"]
    args = list(service["command"])
    container_host = env_of(services["pipeline"])["MLFLOW_TRACKING_URI"].removeprefix("http://")
    assert container_host == f"{service['hostname']}:{option(args, '--port')[0]}"

    volume = tmp_path / "volume"
    volume.mkdir()
    port = free_port()
    moved = {"--host": "127.0.0.1", "--port": str(port), "--workers": "1"}
    local = []
    for arg in args:
        name = arg.split("=", 1)[0]
        value = moved.get(name)
        local.append(f"{name}={value}" if value else arg.replace("/mlflow/", f"{volume}/"))
    assert f"--port={port}" in local
    assert f"--backend-store-uri=sqlite:///{volume}/mlflow.db" in local

    proc = subprocess.Popen(
        [str(BIN / "mlflow"), *local], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        cwd=tmp_path, start_new_session=True,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 240
        while True:
            if proc.poll() is not None:
                pytest.fail(f"mlflow server exited: {proc.stderr.read().decode()[-2000:]}")  # type: ignore[union-attr]
            try:
                if http_status(f"{base}/health", "localhost") == 200:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, "the MLflow server did not start"
            time.sleep(1)

        api = f"{base}/api/2.0/mlflow/experiments/search?max_results=1"
        assert http_status(api, container_host) == 200
        assert http_status(api, f"localhost:{port}") == 200
        assert http_status(api, "attacker.example.com") == 403

        import mlflow

        client = mlflow.MlflowClient(tracking_uri=base)
        experiment = client.create_experiment("compose-check")
        run = client.create_run(experiment)
        client.log_text(run.info.run_id, "hello", "note.txt")
        stored = list((volume / "artifacts").rglob("note.txt"))
        assert len(stored) == 1
        assert stored[0].read_text() == "hello"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
