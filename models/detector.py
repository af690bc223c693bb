"""The anomaly detector: window features relative to the device's own normal
(``pipeline.profiles.relative_features``), scored by a supervised classifier plus an
unsupervised z-score, combined into one score in [0, 1] with the alert threshold at 0.5.

- Unsupervised: a window's largest |z| of level and trend, in the device's own standard
  deviations (``pipeline.profiles.Z_FEATURES``). It catches deviations no one labelled.
- Supervised: gradient-boosted trees on the relative features, trained on windows of the
  scenarios the model is responsible for (``MODEL_SCENARIOS``) against clean windows.
- Thresholds: chosen on a validation split of devices so that clean windows raise at most
  ``max_false_alert_rate`` alerts; ``score = min(1, 0.5 * max(p / p_threshold, z / z_threshold))``
  so the alert threshold stored with the model is always 0.5.

The inputs carry no device type and no level in a unit: a device unlike any simulated one is
compared with itself only. Pure Python (numpy, pandas, scikit-learn); ``models.pyfunc`` wraps
it for MLflow.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from infra import contract as c
from models.evaluation import CLEAN
from pipeline.profiles import RELATIVE_FEATURES, Z_FEATURES

# The scenarios whose alert types include model_anomaly: what the classifier learns.
MODEL_SCENARIOS = tuple(
    s for s, types in c.SCENARIO_ALERT_TYPES.items() if "model_anomaly" in types
)
ALERT_THRESHOLD = 0.5
# Safety margins above the highest clean validation window (see ``choose_thresholds``).
Z_MARGIN = 1.25
P_MARGIN = 0.75


@dataclass
class Detector:
    """The fitted detector; ``score`` maps ``input_columns`` rows to [0, 1] (alert at >= 0.5)."""

    classifier: Any
    p_threshold: float = 1.0
    z_threshold: float = float("inf")
    # The features it was fitted on, so a model keeps scoring after an upgrade adds features,
    # as long as the pipeline still computes these.
    features: tuple[str, ...] = RELATIVE_FEATURES
    z_features: tuple[str, ...] = Z_FEATURES

    @property
    def input_columns(self) -> tuple[str, ...]:
        return self.features

    def max_z(self, frame: pd.DataFrame) -> np.ndarray:
        z = frame[list(self.z_features)].astype(float).abs().max(axis=1, skipna=True)
        return np.nan_to_num(z.to_numpy(), nan=0.0)

    def parts(self, frame: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
        """(classifier probability, max |z|) per row."""
        matrix = frame[list(self.features)].astype(float)
        return self.classifier.predict_proba(matrix)[:, 1], self.max_z(frame)

    def combine(self, p: np.ndarray, max_z: np.ndarray) -> np.ndarray:
        return np.minimum(1.0, 0.5 * np.maximum(p / self.p_threshold, max_z / self.z_threshold))

    def score(self, frame: pd.DataFrame) -> np.ndarray:
        return self.combine(*self.parts(frame))


def training_rows(labels: pd.Series) -> pd.Series:
    """1 for windows of the model's scenarios, 0 for clean windows, NaN for the rest."""
    target = pd.Series(np.nan, index=labels.index)
    target[labels == CLEAN] = 0.0
    target[labels.isin(MODEL_SCENARIOS)] = 1.0
    return target


def fit(frame: pd.DataFrame, labels: pd.Series, seed: int) -> Detector:
    """The classifier on labelled windows; thresholds still open."""
    from sklearn.ensemble import HistGradientBoostingClassifier

    detector = Detector(None)
    target = training_rows(labels)
    rows = target.notna()
    matrix = frame.loc[rows, list(detector.features)].astype(float)
    detector.classifier = HistGradientBoostingClassifier(
        max_iter=300, learning_rate=0.1, max_leaf_nodes=31, l2_regularization=1.0,
        # Leaves of at least 40 windows: smaller ones learn single training devices, and new
        # devices' clean windows then score high (held-out false alerts).
        min_samples_leaf=40, class_weight="balanced", random_state=seed,
    ).fit(matrix, target[rows].astype(int))  # fmt: skip
    return detector


def choose_thresholds(
    detector: Detector, frame: pd.DataFrame, labels: pd.Series, max_false_alert_rate: float
) -> Detector:
    """Pick z and p thresholds on validation windows: clean windows alert at most at the rate.

    The z threshold takes half of the false-alert budget, the classifier the rest; among
    classifier thresholds within budget the lowest (most recall) wins. Then both move up by a
    margin (z times Z_MARGIN, p three quarters of the way to 1): a validation split of a few
    thousand clean windows sees less than the 1-in-10,000 tail it is meant to bound, and
    anomalies score far above it.
    """
    p, max_z = detector.parts(frame)
    clean = (labels == CLEAN).to_numpy()
    budget = int(np.floor(max_false_alert_rate * clean.sum()))
    z_clean = np.sort(max_z[clean])[::-1]
    # Above the (budget // 2 + 1)-th largest clean z: at most budget // 2 clean windows exceed it.
    detector.z_threshold = float(z_clean[budget // 2] if z_clean.size > budget // 2 else 0) * 1.001
    detector.z_threshold = max(detector.z_threshold, 1.0) * Z_MARGIN
    z_alerts = max_z >= detector.z_threshold
    p_clean = np.sort(p[clean & ~z_alerts])[::-1]
    left = max(0, budget - int((z_alerts & clean).sum()))
    detector.p_threshold = float(min(1.0, p_clean[left] * 1.0001)) if p_clean.size > left else 1e-6
    detector.p_threshold = max(detector.p_threshold, 1e-6)
    detector.p_threshold += (1.0 - detector.p_threshold) * P_MARGIN
    return detector
