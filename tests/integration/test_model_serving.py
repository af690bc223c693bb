"""``mlflow models serve`` answers with the champion's scores from the model's own files (issue 23):
the registered model carries the code it imports (``code_paths``), so the server runs in a
process where this repository cannot be imported at all. Serving from the local store writes
beside the model's files; the pipeline still loads the version afterwards."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import mlflow
import numpy as np
import pandas as pd
import pytest

from infra.mlflow_store import artifact_root_for, ensure_experiment
from infra.model_trust import load_trusted, sign_version
from infra.ports import free_port
from models import registry
from models.pyfunc import log_detector
from pipeline.profiles import RELATIVE_FEATURES
from tests.mlflow_helpers import MODEL
from tests.unit.models.test_detector import fitted

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
PACKAGES = ("dashboard", "infra", "iotfraud", "models", "pipeline", "simulator")
START_TIMEOUT_S = 120.0
# Loaded by every Python process of the server (PYTHONPATH): the repository's packages are found
# only outside the repository (the editable install's finder is never asked), so only the copy
# the model carries can satisfy them.
BLOCKER = """
import importlib.abc
import importlib.machinery
import sys

REPO = {repo!r}
PACKAGES = {packages!r}


class RepositoryBlocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.partition(".")[0] not in PACKAGES:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        where = [spec.origin, *(spec.submodule_search_locations or [])] if spec else []
        if spec is None or any(str(w).startswith(REPO) for w in where if w):
            raise ModuleNotFoundError(f"{{name}}: the repository is blocked here", name=name)
        return spec


sys.meta_path.insert(0, RepositoryBlocker())
"""


def register_champion(tracking_uri: str, tmp_path: Path) -> str:
    """Fit the detector on synthetic clean windows and register it as ``iotfraud train`` does:
    ``log_detector`` in a run, registered, signed, promoted. Returns its version."""
    detector, validation = fitted(np.random.default_rng(3))
    mlflow.set_tracking_uri(tracking_uri)
    mlflow.set_registry_uri(tracking_uri)
    experiment = ensure_experiment("serving", tracking_uri, artifact_root_for(tracking_uri))
    with mlflow.start_run(experiment_id=experiment):
        info = log_detector(detector, validation, tmp_path / "model",
                            {"deviation_threshold": detector.threshold})  # fmt: skip
        version = str(mlflow.register_model(info.model_uri, MODEL).version)
    client = registry.client(tracking_uri)
    sign_version(client, MODEL, version, None)
    registry.promote(client, MODEL, version)
    return version


def isolated_env(tracking_uri: str, tmp_path: Path) -> dict[str, str]:
    """The server's environment: the store, this venv's tools first on PATH (MLflow starts
    ``uvicorn`` by name) and the blocker as the only PYTHONPATH entry."""
    blocker = tmp_path / "blocker"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text(BLOCKER.format(repo=str(REPO), packages=PACKAGES))
    # As a user's shell has it: Python caches the bytecode of what it imports.
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("MLFLOW_") and k != "PYTHONDONTWRITEBYTECODE"}  # fmt: skip
    env.update(
        MLFLOW_TRACKING_URI=tracking_uri,
        PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}",
        PYTHONPATH=str(blocker),
    )
    return env


def post(url: str, body: dict[str, Any]) -> list[float]:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return [float(v) for v in json.loads(response.read())["predictions"]]


def split_body(frame: pd.DataFrame) -> dict[str, Any]:
    """A ``dataframe_split`` request body; NaN goes as JSON null."""
    rows = frame.astype(object).where(frame.notna(), None).to_numpy().tolist()
    return {"dataframe_split": {"columns": list(frame.columns), "data": rows}}


def wait_until_up(url: str, server: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.poll() is not None:
            pytest.fail(f"mlflow models serve exited with {server.returncode}:\n"
                        f"{log.read_text()[-4000:]}")  # fmt: skip
        try:
            with urllib.request.urlopen(f"{url}/ping", timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.5)
    pytest.fail(f"no answer on {url}/ping in {START_TIMEOUT_S:.0f} s:\n{log.read_text()[-4000:]}")


def stop(server: subprocess.Popen[bytes]) -> None:
    """End the server's whole process group (mlflow, the shell it starts, uvicorn)."""
    for sig, wait_s in ((signal.SIGTERM, 15), (signal.SIGKILL, 5)):
        try:
            os.killpg(server.pid, sig)
        except ProcessLookupError:
            return
        try:
            server.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def windows() -> pd.DataFrame:
    """Four windows: a device as usual, a temperature spike, a tamper's power ratio drop, and one
    whose power sensors report nothing (missing features)."""
    frame = pd.DataFrame(0.0, index=range(4), columns=list(RELATIVE_FEATURES))
    frame.loc[1, "rel_temperature_c_level"] = 40.0
    frame.loc[2, "rel_power_ratio"] = -0.5
    frame.loc[3, [f for f in RELATIVE_FEATURES if "power" in f]] = np.nan
    return frame


@pytest.mark.timeout(300)
def test_the_served_champion_scores_as_the_model_loaded_here_without_the_repository(
    tmp_path: Path, mlflow_uri: str
) -> None:
    version = register_champion(mlflow_uri, tmp_path)
    uri = f"models:/{MODEL}@champion"
    env = isolated_env(mlflow_uri, tmp_path)
    workdir = tmp_path / "elsewhere"
    workdir.mkdir()
    # The blocker works: in the server's environment the repository's code does not import.
    probe = subprocess.run([sys.executable, "-c", "import models.detector"], cwd=workdir, env=env,
                           capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert probe.returncode != 0 and "the repository is blocked here" in probe.stderr, probe

    port = free_port()
    log = tmp_path / "serve.log"
    with open(log, "wb") as out:
        server = subprocess.Popen(
            [str(BIN / "mlflow"), "models", "serve", "-m", uri, "--env-manager", "local",
             "--host", "127.0.0.1", "--port", str(port)],
            cwd=workdir, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until_up(url, server, log)
        frame = windows()
        thermostat = frame[["rel_temperature_c_level", "rel_humidity_pct_level"]].copy()
        served = post(f"{url}/invocations", split_body(frame))
        # A client may send only the features a device has: the others are missing.
        served_thermostat = post(f"{url}/invocations", split_body(thermostat))
    finally:
        stop(server)

    path = list(sys.path)
    model = mlflow.pyfunc.load_model(uri)
    sys.path[:] = path  # loading put the model's code first: the rest of the session keeps ours
    np.testing.assert_allclose(served, model.predict(frame), rtol=0, atol=1e-9)
    np.testing.assert_allclose(served_thermostat, model.predict(thermostat), rtol=0, atol=1e-9)
    assert all(0.0 <= score <= 1.0 for score in served + served_thermostat)
    assert [score >= 0.5 for score in served] == [False, True, True, False]
    assert [score >= 0.5 for score in served_thermostat] == [False, True, False, False]

    # The pipeline's loading path: the checked copy, deleted once loaded, is left off sys.path.
    trusted = load_trusted(registry.client(mlflow_uri), MODEL, version, None)
    assert sys.path == path
    np.testing.assert_allclose(trusted.predict(frame), served, rtol=0, atol=1e-9)
