"""The anomaly detector: a supervised classifier for the injected value scenarios plus an
unsupervised robust z-score, combined into one score in [0, 1] with the alert threshold at 0.5.

- Unsupervised: per device type, the median and MAD of each window statistic over all training
  windows (no labels used); a window's anomaly is its largest robust |z|. It catches deviations
  no one labelled.
- Supervised: gradient-boosted trees on the window features and those z-scores, trained on windows
  of the scenarios the model is responsible for (``MODEL_SCENARIOS``) against clean windows.
- Thresholds: chosen on a validation split of devices so that clean windows raise at most
  ``max_false_alert_rate`` alerts; ``score = min(1, 0.5 * max(p / p_threshold, z / z_threshold))``
  so the alert threshold stored with the model is always 0.5.

Pure Python (numpy, pandas, scikit-learn); ``models.pyfunc`` wraps it for MLflow.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from infra import contract as c
from models.evaluation import CLEAN

# The scenarios whose alert types include model_anomaly: what the classifier learns.
MODEL_SCENARIOS = tuple(
    s for s, types in c.SCENARIO_ALERT_TYPES.items() if "model_anomaly" in types
)
ALERT_THRESHOLD = 0.5
_STATS = ("mean", "std", "min", "max", "slope")
NUMERIC_FEATURES = (
    *(f"{m}_{s}" for m in c.METRICS for s in _STATS),
    "event_count", "events_per_min", "duplicate_count", "seq_gap_count", "seq_excess_count",
    "power_ratio_mean", "power_ratio_min", "max_distance_km", "spread_km",
    # Not compared with the type's normal (no z-score): a slow signal read to two decimals
    # repeats now and then, and only the classifier learns how far that goes.
    *(f"{m}_distinct_share" for m in c.REPEAT_METRICS),
)  # fmt: skip
# Window statistics compared with the device type's normal (robust z-scores). Not the battery:
# a tracker's recharge is a legitimate jump of most of its range.
Z_FEATURES = (
    *(
        f"{m}_{s}"
        for m in c.METRICS
        if m != "battery_pct"
        for s in ("mean", "std", "range", "slope")
    ),
    "power_ratio_mean",
)
_MAD_TO_SIGMA = 1.4826
# Safety margins above the highest clean validation window (see ``choose_thresholds``).
Z_MARGIN = 1.25
P_MARGIN = 0.75


def _with_ranges(frame: pd.DataFrame) -> pd.DataFrame:
    ranges = {f"{m}_range": frame[f"{m}_max"] - frame[f"{m}_min"] for m in c.METRICS}
    return frame.assign(**ranges)


@dataclass
class Baseline:
    """Median and scale of each z feature per device type (the unsupervised part)."""

    median: dict[str, dict[str, float]] = field(default_factory=dict)
    scale: dict[str, dict[str, float]] = field(default_factory=dict)
    # The features it was fitted on: a later release may compare others.
    features: tuple[str, ...] = Z_FEATURES

    @classmethod
    def fit(cls, frame: pd.DataFrame) -> Baseline:
        frame = _with_ranges(frame)
        baseline = cls()
        for device_type, group in frame.groupby("device_type"):
            med = group[list(baseline.features)].median()
            mad = (group[list(baseline.features)] - med).abs().median() * _MAD_TO_SIGMA
            # A floor on the scale: a feature constant across a type must not divide by ~0.
            floor = (0.05 * med.abs()).clip(lower=0.01)
            scale = mad.where(mad > floor, floor)
            baseline.median[str(device_type)] = {str(k): float(v) for k, v in med.dropna().items()}
            baseline.scale[str(device_type)] = {str(k): float(v) for k, v in scale.dropna().items()}
        return baseline

    def z_scores(self, frame: pd.DataFrame) -> pd.DataFrame:
        frame = _with_ranges(frame)
        features = list(self.features)
        med = pd.DataFrame([self.median.get(t, {}) for t in frame["device_type"]],
                           index=frame.index, columns=features)  # fmt: skip
        scale = pd.DataFrame([self.scale.get(t, {}) for t in frame["device_type"]],
                             index=frame.index, columns=features)  # fmt: skip
        z = (frame[features].astype(float) - med) / scale
        return z.add_prefix("z_")


@dataclass
class Detector:
    """The fitted detector; ``score`` maps ``input_columns`` rows to [0, 1] (alert at >= 0.5)."""

    baseline: Baseline
    classifier: Any
    device_types: tuple[str, ...]
    p_threshold: float = 1.0
    z_threshold: float = float("inf")
    # The features it was fitted on (NUMERIC_FEATURES of its release), so a model keeps scoring
    # after an upgrade adds features, as long as the stream still computes these.
    numeric_features: tuple[str, ...] = NUMERIC_FEATURES

    @property
    def input_columns(self) -> tuple[str, ...]:
        return ("device_type", *self.numeric_features)

    def design(self, frame: pd.DataFrame) -> tuple[pd.DataFrame, np.ndarray]:
        """The classifier's matrix (features, z-scores, device type one-hot) and max |z|."""
        numeric = frame[list(self.numeric_features)].astype(float)
        z = self.baseline.z_scores(frame)
        types = pd.DataFrame({f"type_{t}": (frame["device_type"] == t).astype(float)
                              for t in self.device_types}, index=frame.index)  # fmt: skip
        max_z = np.nan_to_num(z.abs().max(axis=1, skipna=True).to_numpy(), nan=0.0)
        return pd.concat([numeric, z, types], axis=1), max_z

    def parts(self, frame: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
        """(classifier probability, max |z|) per row."""
        matrix, max_z = self.design(frame)
        return self.classifier.predict_proba(matrix)[:, 1], max_z

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
    """Baseline on every window, classifier on labelled ones; thresholds still open."""
    from sklearn.ensemble import HistGradientBoostingClassifier

    baseline = Baseline.fit(frame)
    device_types = tuple(sorted(frame["device_type"].dropna().unique()))
    detector = Detector(baseline, None, device_types)
    target = training_rows(labels)
    rows = target.notna()
    matrix, _ = detector.design(frame[rows])
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
