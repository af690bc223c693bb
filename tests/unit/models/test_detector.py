"""The detector on synthetic windows: thresholds above every clean validation window with a
margin, a tracker's battery recharge not mistaken for an anomaly, a drift caught."""

from __future__ import annotations

import numpy as np
import pandas as pd

from models.detector import NUMERIC_FEATURES, Z_MARGIN, choose_thresholds, fit
from models.evaluation import CLEAN


def windows(n: int, rng: np.random.Generator, label: str = CLEAN) -> pd.DataFrame:
    frame = pd.DataFrame({name: rng.normal(10.0, 0.5, n) for name in NUMERIC_FEATURES})
    for stat in ("std", "slope"):
        frame[[c for c in NUMERIC_FEATURES if c.endswith(f"_{stat}")]] = rng.normal(
            0.2 if stat == "std" else 0.0, 0.02, (n, 7)
        )
    frame["battery_pct_max"] = frame["battery_pct_min"] + rng.uniform(0.0, 0.2, n)
    frame["device_type"] = "gps_tracker"
    frame["device_id"] = [f"dev-{i % 50}" for i in range(n)]
    if label == "drift":
        frame["temperature_c_slope"] = rng.uniform(0.8, 1.5, n)
    frame["label"] = label
    return frame


def test_thresholds_clear_clean_windows_and_recharges_and_catch_drift() -> None:
    rng = np.random.default_rng(3)
    train = pd.concat([windows(3000, rng), windows(200, rng, "drift")], ignore_index=True)
    validation = windows(2000, rng)
    validation.loc[:9, "battery_pct_max"] = validation.loc[:9, "battery_pct_min"] + 85.0
    detector = fit(train, train["label"], seed=1)
    choose_thresholds(detector, validation, validation["label"], max_false_alert_rate=1e-4)

    p, max_z = detector.parts(validation)
    assert detector.z_threshold >= Z_MARGIN * max_z.max()
    assert detector.p_threshold > p.max()
    assert detector.z_threshold < 20, "a battery recharge must not set the z threshold"
    assert (detector.score(validation) < 0.5).all()
    assert (detector.score(windows(100, rng, "drift")) >= 0.5).all()
