"""The MLflow pyfunc around ``Detector``: one artifact (the pickled detector), a signature and an
input example, and the alert threshold in the model's metadata (read by ``pipeline.scoring``).

The model carries the modules it imports when it loads and scores (``CODE_MODULES``, as MLflow
``code_paths``), so a process without iotfraud installed serves it: ``mlflow models serve``, a
notebook elsewhere. A module the loading process has already imported stays as it is (Python
imports a module once).
"""

from __future__ import annotations

import importlib
import pickle
import shutil
from pathlib import Path
from typing import Any

import mlflow
import numpy as np
import pandas as pd

from infra import contract as c
from models.detector import Detector

ARTIFACT = "detector"
# What unpickling the model and scoring with it import from this project: this module, the
# detector and the constants it reads. Pure Python on numpy and pandas, no Spark.
CODE_MODULES = (
    "infra.contract",
    "models.detector",
    "models.evaluation",
    "models.pyfunc",
    "pipeline.columns",
    "pipeline.profiles",
)


class DetectorModel(mlflow.pyfunc.PythonModel):  # type: ignore[misc,name-defined]
    """Scores window-feature rows (the detector's input columns) in [0, 1]; alert at
    ``metadata.threshold``."""

    detector: Detector

    def load_context(self, context: Any) -> None:
        with open(context.artifacts[ARTIFACT], "rb") as handle:
            self.detector = pickle.load(handle)

    def predict(self, context: Any, model_input: pd.DataFrame, params: Any = None) -> np.ndarray:
        # A column left out is a missing feature, as the signature's optional inputs promise.
        return self.detector.score(model_input.reindex(columns=list(self.detector.input_columns)))


def _requirements() -> list[str]:
    from importlib.metadata import version

    return [f"{name}=={version(name)}" for name in ("mlflow", "scikit-learn", "pandas", "numpy")]


def stage_code(folder: Path) -> list[str]:
    """Copy ``CODE_MODULES``, with their packages' ``__init__.py``, into ``folder`` as packages;
    returns the package folders (MLflow's ``code_paths``, which it copies with their layout)."""
    packages: set[Path] = set()
    for name in CODE_MODULES:
        source = Path(str(importlib.import_module(name).__file__))
        package = folder / name.rpartition(".")[0]
        package.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, package / source.name)
        shutil.copyfile(source.parent / "__init__.py", package / "__init__.py")
        packages.add(package)
    return [str(path) for path in sorted(packages)]


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
        code_paths=stage_code(folder / "code"),
        pip_requirements=_requirements(),
        signature=signature,
        input_example=example,
        metadata={"threshold": c.MODEL_ALERT_THRESHOLD, **metadata},
    )
