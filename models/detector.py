"""The anomaly detector: how far a window is from its device's own normal, in units learned
from clean windows.

Its inputs are ``pipeline.profiles.RELATIVE_FEATURES``: level and trend in the device's own
standard deviations, log ratios of spread, range and rate, differences of distinct share and
power ratio; about 0 for a device behaving as it usually does. Fitting needs clean windows only
(no labelled anomalies):

- each feature's *scale* is the largest absolute value it takes over clean training windows, so
  every feature speaks in "times its most extreme normal" whatever the shape of its tail (a
  bounded feature such as the drop of the distinct share, and a heavy-tailed level alike);
- a window's *deviation* is its largest scaled feature (missing features are skipped);
- the threshold is chosen on a validation split of devices so that clean windows alert at most
  ``max_false_alert_rate`` (with a margin), and
  ``score = min(1, MODEL_ALERT_THRESHOLD * deviation / threshold)``, so the alert threshold
  stored with the model is always ``MODEL_ALERT_THRESHOLD``.

The inputs carry no device type and no level in a unit: a device unlike any simulated one is
compared with itself only, and nothing learned from the simulator's scenarios can fire on it.
Pure Python (numpy, pandas); ``models.pyfunc`` wraps it for MLflow.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from infra import contract as c
from models.evaluation import CLEAN
from pipeline.profiles import RELATIVE_FEATURES

# The scenarios whose alert types include model_anomaly: what the detector is evaluated on.
MODEL_SCENARIOS = tuple(
    s for s, types in c.SCENARIO_ALERT_TYPES.items() if "model_anomaly" in types
)
# Safety margin above the highest clean validation window (see ``choose_threshold``): clean
# windows of devices the fit never saw go up to about twice the training extremes (measured in
# docs/PERFORMANCE.md), anomalies mostly far beyond.
MARGIN = 2.0
# Only a drop is suspicious: of the share of distinct readings (a sensor that sticks), of the
# power ratio (power reported below what voltage and current make). A rise is a recovery.
_ONE_SIDED = tuple(
    f for f in RELATIVE_FEATURES if f.endswith("_distinct") or f == "rel_power_ratio"
)


@dataclass
class Detector:
    """The fitted detector; ``score`` maps ``input_columns`` rows to [0, 1] (an alert at
    ``MODEL_ALERT_THRESHOLD`` or above)."""

    scales: dict[str, float] = field(default_factory=dict)
    threshold: float = float("inf")
    # The features it was fitted on, so a model keeps scoring after an upgrade adds features,
    # as long as the pipeline still computes these.
    features: tuple[str, ...] = RELATIVE_FEATURES

    @property
    def input_columns(self) -> tuple[str, ...]:
        return self.features

    def scaled(self, frame: pd.DataFrame) -> pd.DataFrame:
        """Each feature over its scale (drops only, for one-sided features); NaN when missing."""
        values = frame[list(self.features)].astype(float)
        one_sided = [f for f in self.features if f in _ONE_SIDED]
        values[one_sided] = (-values[one_sided]).clip(lower=0.0)
        return values.abs() / pd.Series(self.scales)[list(self.features)]

    def deviation(self, frame: pd.DataFrame) -> np.ndarray:
        """The largest scaled feature per row (0 when all are missing)."""
        largest = self.scaled(frame).max(axis=1, skipna=True).to_numpy(dtype=float)
        return np.asarray(np.nan_to_num(largest, nan=0.0), dtype=float)

    def score(self, frame: pd.DataFrame) -> np.ndarray:
        return np.minimum(1.0, c.MODEL_ALERT_THRESHOLD * self.deviation(frame) / self.threshold)

    def explain(self, frame: pd.DataFrame, top: int = 2) -> list[str]:
        """Per row, the features that deviate most, as text for an analyst."""
        scaled = self.scaled(frame)
        raw = frame[list(self.features)].astype(float)
        out = []
        for i in range(len(frame)):
            row = scaled.iloc[i].dropna().sort_values(ascending=False).head(top)
            out.append(", ".join(f"{name.removeprefix('rel_')} {raw.iloc[i][name]:+.2f}"
                                 for name in row.index))  # fmt: skip
        return out


def fit(frame: pd.DataFrame, labels: pd.Series) -> Detector:
    """Feature scales from the clean windows of ``frame``; threshold still open."""
    clean = frame.loc[(labels == CLEAN).to_numpy(), list(RELATIVE_FEATURES)].astype(float)
    one_sided = list(_ONE_SIDED)
    clean[one_sided] = (-clean[one_sided]).clip(lower=0.0)
    largest = clean.abs().max()
    # A feature constant on clean windows (or never seen) must not divide by ~0.
    scales = largest.fillna(1.0).clip(lower=1e-3)
    return Detector({str(k): float(v) for k, v in scales.items()})


def choose_threshold(
    detector: Detector, frame: pd.DataFrame, labels: pd.Series, max_false_alert_rate: float
) -> Detector:
    """Pick the threshold on validation windows: clean windows alert at most at the rate, then
    MARGIN above that (a validation split of a few thousand clean windows sees less than the
    1-in-10,000 tail it is meant to bound, and anomalies deviate far more)."""
    deviation = detector.deviation(frame)
    clean = np.sort(deviation[(labels == CLEAN).to_numpy()])[::-1]
    budget = int(np.floor(max_false_alert_rate * clean.size))
    # Above the (budget + 1)-th largest clean deviation: at most budget clean windows exceed it.
    edge = float(clean[budget]) if clean.size > budget else 1.0
    detector.threshold = max(edge * 1.001, 1.0) * MARGIN
    return detector
