"""The MLflow pyfunc around ``Detector``: one artifact (the pickled detector), a signature and an
input example, and the alert threshold in the model's metadata (read by ``pipeline.scoring``).

The class is imported from this package when the model loads: whatever scores it (the pipeline,
a notebook) runs the same iotfraud install, as the Spark cluster image does.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import mlflow
import numpy as np
import pandas as pd

from infra import contract as c
from models.detector import Detector

ARTIFACT = "detector"


class DetectorModel(mlflow.pyfunc.PythonModel):  # type: ignore[misc,name-defined]
    """Scores window-feature rows (the detector's input columns) in [0, 1]; alert at
    ``metadata.threshold``."""

    detector: Detector

    def load_context(self, context: Any) -> None:
        with open(context.artifacts[ARTIFACT], "rb") as handle:
            self.detector = pickle.load(handle)

    def predict(self, context: Any, model_input: pd.DataFrame, params: Any = None) -> np.ndarray:
        return self.detector.score(model_input[list(self.detector.input_columns)])


def _requirements() -> list[str]:
    from importlib.metadata import version

    return [f"{name}=={version(name)}" for name in ("mlflow", "scikit-learn", "pandas", "numpy")]


def log_detector(
    detector: Detector, example: pd.DataFrame, folder: Path, metadata: dict[str, Any]
) -> Any:
    """Log the detector as a pyfunc in the active run; returns mlflow's ModelInfo."""
    from mlflow.models import ModelSignature, infer_signature
    from mlflow.types import ColSpec, Schema

    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "detector.pkl"
    with open(path, "wb") as handle:
        pickle.dump(detector, handle)
    columns = list(detector.input_columns)
    example = example[columns].head(5).reset_index(drop=True)
    example = example.astype("float64")
    # Every input optional: a metric a device lacks is missing, and so are its features.
    inferred = infer_signature(example, detector.score(example))
    inputs = Schema([
        ColSpec(spec.type, spec.name, required=False) for spec in inferred.inputs.inputs
    ])  # fmt: skip
    signature = ModelSignature(inputs=inputs, outputs=inferred.outputs)
    return mlflow.pyfunc.log_model(
        name="model",
        python_model=DetectorModel(),
        artifacts={ARTIFACT: str(path)},
        # The class lives in this package: the scoring side runs the same iotfraud install.
        pip_requirements=_requirements(),
        signature=signature,
        input_example=example,
        metadata={"threshold": c.MODEL_ALERT_THRESHOLD, **metadata},
    )
