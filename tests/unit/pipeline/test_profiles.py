"""A device's own normal (pure pandas): what a window is compared with after an anomaly."""

from __future__ import annotations

import numpy as np
import pandas as pd

from pipeline.profiles import HISTORY_COLUMNS, ProfileSpec, profiles, relative_features

T0 = pd.Timestamp("2026-11-25 08:00:00")
SPEC = ProfileSpec()


def closed_window(start_min: int, temperature: float) -> dict:
    """A thermostat's window: 20 events, temperature at ``temperature`` with sd 0.2."""
    start = T0 + pd.Timedelta(minutes=start_min)
    row: dict = {name: np.nan for name in HISTORY_COLUMNS}
    row.update({
        "device_id": "d1", "window_start": start, "window_end": start + pd.Timedelta(minutes=10),
        "event_count": 20, "first_event_time": start,
        "last_event_time": start + pd.Timedelta(minutes=9.5), "power_ratio_mean": 1.0,
        "temperature_c_mean": temperature, "temperature_c_std": 0.2,
        "temperature_c_min": temperature - 0.4, "temperature_c_max": temperature + 0.4,
        "temperature_c_distinct_share": 0.95,
    })  # fmt: skip
    return row


def window_now(temperature: float) -> pd.DataFrame:
    """The window being scored, starting when the last history window ends."""
    row = closed_window(60, temperature)
    row.update({"temperature_c_slope": 0.0, "humidity_pct_slope": 0.0})
    for m in ("humidity_pct", "voltage_v", "current_a", "power_w", "signal_dbm"):
        row[f"{m}_slope"] = np.nan
    return pd.DataFrame([row])


def relative_level(history: list[dict], temperature: float) -> float:
    window = window_now(temperature)
    prof = profiles(window, pd.DataFrame(history), SPEC)
    return float(relative_features(window, prof, SPEC)["rel_temperature_c_level"].iloc[0])


def test_an_anomaly_in_the_history_does_not_become_the_normal() -> None:
    """Five of the last eleven windows overlapped a +25 degree spike. A dip of 8 degrees right
    after still reads as 40 of the device's own sd, not as noise in a spread the spike
    inflated; its normal readings read as normal."""
    steady = [closed_window(m, 20.0 + 0.01 * (m % 3)) for m in range(0, 30, 5)]
    spiked = [closed_window(m, 45.0) for m in range(30, 55, 5)]
    history = steady + spiked
    assert relative_level(history, 12.0) < -30
    assert abs(relative_level(history, 20.05)) < 1


def test_a_device_that_changes_level_for_good_is_learned_again() -> None:
    """Once most of the span is at the new level, the new level is the normal."""
    history = [closed_window(m, 20.0) for m in range(0, 15, 5)]
    history += [closed_window(m, 30.0) for m in range(15, 55, 5)]
    assert abs(relative_level(history, 30.0)) < 1
