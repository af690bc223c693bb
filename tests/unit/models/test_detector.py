"""The detector on synthetic relative features: a threshold above every clean validation window
with a margin, deviations caught whatever their direction, only drops of one-sided features,
and a missing metric read as missing."""

from __future__ import annotations

import numpy as np
import pandas as pd

from models.detector import MARGIN, choose_threshold, fit
from models.evaluation import CLEAN
from pipeline.profiles import RELATIVE_FEATURES


def windows(n: int, rng: np.random.Generator) -> pd.DataFrame:
    frame = pd.DataFrame({name: rng.normal(0.0, 1.0, n) for name in RELATIVE_FEATURES})
    frame[[f for f in RELATIVE_FEATURES if f.endswith("_distinct")]] = rng.normal(0, 0.05, (n, 6))
    frame["rel_power_ratio"] = rng.normal(0.0, 0.01, n)
    frame["label"] = CLEAN
    return frame


def fitted(rng: np.random.Generator) -> tuple[object, pd.DataFrame]:
    train, validation = windows(5000, rng), windows(3000, rng)
    detector = fit(train, train["label"])
    choose_threshold(detector, validation, validation["label"], max_false_alert_rate=1e-4)
    return detector, validation


def test_threshold_clears_clean_windows_with_a_margin() -> None:
    detector, validation = fitted(np.random.default_rng(3))
    deviation = detector.deviation(validation)  # type: ignore[attr-defined]
    assert detector.threshold >= MARGIN * deviation.max()  # type: ignore[attr-defined]
    assert (detector.score(validation) < 0.5).all()  # type: ignore[attr-defined]


def test_deviations_alert_and_one_sided_features_only_on_a_drop() -> None:
    rng = np.random.default_rng(4)
    detector, _ = fitted(rng)
    rows = windows(6, rng)
    rows.loc[0, "rel_temperature_c_level"] = 40.0  # a spike in the device's own sd
    rows.loc[1, "rel_voltage_v_level"] = -40.0  # a dip
    rows.loc[2, "rel_power_ratio"] = -0.5  # power far below voltage x current: tampering
    rows.loc[3, "rel_power_ratio"] = +0.5  # back to normal after a tamper: no alert
    rows.loc[4, "rel_humidity_pct_distinct"] = -0.9  # readings stopped changing
    rows.loc[5, "rel_humidity_pct_distinct"] = +0.9  # more varied readings: no alert
    alerts = detector.score(rows) >= 0.5  # type: ignore[attr-defined]
    assert alerts.tolist() == [True, True, True, False, True, False]
    assert "temperature_c_level +40.00" in detector.explain(rows.iloc[[0]])[0]  # type: ignore[attr-defined]


def test_missing_features_are_skipped_not_read_as_zero_or_as_deviation() -> None:
    rng = np.random.default_rng(5)
    detector, _ = fitted(rng)
    rows = windows(2, rng)
    power = [f for f in RELATIVE_FEATURES if "power" in f or "current" in f or "voltage" in f]
    rows.loc[:, power] = np.nan  # a thermostat: no power sensors
    rows.loc[1, "rel_temperature_c_level"] = 40.0
    assert (detector.score(rows) >= 0.5).tolist() == [False, True]  # type: ignore[attr-defined]
    rows.loc[:, list(RELATIVE_FEATURES)] = np.nan  # nothing known: no score
    assert (detector.score(rows) == 0).all()  # type: ignore[attr-defined]
