"""Small MLflow pyfunc models registered in a test's SQLite store (real MLflow)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlflow
import numpy as np
import pandas as pd

MODEL = "iot-fraud-test"


def register_model(
    tracking_uri: str, tmp_path: Path, model: Any, example: Any, *, sign: bool = True,
    key: str | None = None,
) -> str:  # fmt: skip
    """Log ``model`` (a PythonModel) with a signature and ``example``; make it the champion.

    ``sign`` records the digest of its files (with ``key``), as ``iotfraud models sign`` does:
    the pipeline loads no version without one."""
    import mlflow
    from mlflow.models import infer_signature

    from infra.model_trust import sign_version

    mlflow.set_tracking_uri(tracking_uri)
    mlflow.set_registry_uri(tracking_uri)
    client = mlflow.MlflowClient()
    if client.get_experiment_by_name("detect") is None:
        client.create_experiment("detect", artifact_location=(tmp_path / "art").as_uri())
    mlflow.set_experiment("detect")
    output = np.zeros(len(example))
    with mlflow.start_run():
        info = mlflow.pyfunc.log_model(
            name="model",
            python_model=model,
            signature=infer_signature(example, output),
            input_example=example,
            registered_model_name=MODEL,
            metadata={"threshold": 0.5},
        )
    version = str(info.registered_model_version)
    if sign:
        sign_version(client, MODEL, version, key)
    client.set_registered_model_alias(MODEL, "champion", version)
    return version


class BusyWindow(mlflow.pyfunc.PythonModel):  # type: ignore[misc,name-defined]
    """Scores 1.0 for windows with at least ``min_events`` events."""

    def __init__(self, min_events: float) -> None:
        self.min_events = min_events

    def predict(self, context: Any, model_input: pd.DataFrame, params: Any = None) -> Any:
        return (model_input["event_count"] >= self.min_events).astype(float)


class Broken(mlflow.pyfunc.PythonModel):  # type: ignore[misc,name-defined]
    """Fails on any input, as a model pickled by an older release can."""

    def predict(self, context: Any, model_input: pd.DataFrame, params: Any = None) -> Any:
        raise KeyError("['power_w_slope'] not in index")


BUSY_EXAMPLE = pd.DataFrame({"event_count": [1.0, 30.0], "voltage_v_mean": [230.0, 231.0]})


def register_busy_window_model(tracking_uri: str, tmp_path: Path, min_events: float) -> str:
    return register_model(tracking_uri, tmp_path, BusyWindow(min_events), BUSY_EXAMPLE)
