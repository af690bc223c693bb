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


def groupby_profiles(
    windows: pd.DataFrame, history: pd.DataFrame, spec: ProfileSpec
) -> pd.DataFrame:
    """The profile's definition read literally, in pandas: every (window, history window) pair
    of a device, the pairs a profile reads kept, outlying levels left out, then medians and
    interquartile ranges per window. ``profiles`` computes the same in numpy."""
    from pipeline.profiles import _MAD_TO_SIGMA as MAD_TO_SIGMA
    from pipeline.profiles import OUTLIER_K, PROFILE_METRICS, observed_rate
    from pipeline.profiles import _floor as floor
    from pipeline.profiles import _typed as typed

    keys = windows[["device_id", "window_start"]].reset_index(drop=True).reset_index(names="_row")
    hist = typed(history).rename(columns={"window_start": "_h_start"})
    pairs = keys.merge(hist, on="device_id", how="inner")
    start = pairs["window_start"]
    keep = (pairs["window_end"] <= start) & (
        pairs["_h_start"] >= start - pd.Timedelta(seconds=spec.span_s)
    )
    pairs = pairs[keep].copy()
    for m in PROFILE_METRICS:
        pairs[f"{m}_range"] = pairs[f"{m}_max"] - pairs[f"{m}_min"]
    pairs["observed_rate"] = observed_rate(pairs)
    rows = pairs["_row"]
    for m in PROFILE_METRICS:
        mean = pairs[f"{m}_mean"]
        center = mean.groupby(rows).transform("median")
        distance = (mean - center).abs()
        mad = distance.groupby(rows).transform("median")
        within = pairs[f"{m}_std"].groupby(rows).transform("median")
        scale = pd.concat([mad * MAD_TO_SIGMA, within, floor(center)], axis=1).max(axis=1)
        inlier = distance <= OUTLIER_K * scale
        for stat in ("mean", "std", "range", "distinct_share"):
            pairs[f"{m}_{stat}"] = pairs[f"{m}_{stat}"].where(inlier)
    medians = [
        "event_count", "observed_rate", "power_ratio_mean",
        *(f"{m}_{s}" for m in PROFILE_METRICS for s in ("mean", "std", "range", "distinct_share")),
    ]  # fmt: skip
    grouped = pairs.groupby("_row")
    out = grouped[medians].median().add_prefix("h_").add_suffix("_med")
    means = [f"{m}_mean" for m in PROFILE_METRICS]
    iqr = grouped[means].quantile(0.75) - grouped[means].quantile(0.25)
    out = out.join(iqr.add_prefix("h_").add_suffix("_iqr"))
    out["profile_windows"] = grouped.size()
    out = out.reindex(range(len(windows)))
    out["profile_windows"] = out["profile_windows"].fillna(0).astype("int64")
    out.index = windows.index
    return out


def fleet_history(devices: int, rng: np.random.Generator) -> pd.DataFrame:
    """Three hours of 10-minute windows every 5 minutes for ``devices`` devices, with what real
    fleets have: windows missing, metrics missing (one device never reports humidity), outlying
    levels, even and odd counts of windows, a window whose events all share one time."""
    rows = []
    for d in range(devices):
        for k in range(36):
            if d != 1 and rng.random() < 0.2:  # d1 reports throughout
                continue
            row = closed_window(5 * k, 20.0 + rng.normal(0, 0.3))
            row["device_id"] = f"d{d}"
            row["event_count"] = int(rng.integers(5, 40))
            for name in HISTORY_COLUMNS[6:]:
                if name not in ("temperature_c_mean",):
                    row[name] = rng.normal(50.0, 5.0) if rng.random() > 0.05 else np.nan
            if rng.random() < 0.05:
                row["temperature_c_mean"] = 45.0  # a spike
            if d == 0:
                for name in HISTORY_COLUMNS:
                    if name.startswith("humidity_pct"):
                        row[name] = np.nan
            if rng.random() < 0.03:
                row["last_event_time"] = row["first_event_time"]
            rows.append(row)
    return pd.DataFrame(rows)


def test_profiles_are_the_definition_read_in_pandas() -> None:
    """Per window, the same medians and interquartile ranges as the pairs-and-groupby reading of
    the definition, to the last bit: windows at every 5 minutes of the span (so history windows
    end exactly at a window's start, and start exactly ``span_s`` before it), a device with no
    history, a shorter span."""
    rng = np.random.default_rng(7)
    history = fleet_history(12, rng)
    starts = [T0 + pd.Timedelta(minutes=m) for m in range(0, 200, 5)]
    windows = pd.DataFrame(
        [{"device_id": f"d{d}", "window_start": s} for d in range(13) for s in starts]
    )
    for spec in (SPEC, ProfileSpec(span_s=1800)):
        expected = groupby_profiles(windows, history, spec)
        got = profiles(windows, history, spec)
        pd.testing.assert_frame_equal(got, expected, check_exact=True)
        # d1's windows late enough read the whole span.
        assert got["profile_windows"].max() == (spec.span_s - spec.window_s) / 300 + 1
        assert (got.loc[windows["device_id"] == "d12", "profile_windows"] == 0).all()
        assert got.loc[windows["device_id"] == "d0", "h_humidity_pct_mean_med"].isna().all()
    # Indexed like the windows, whatever their index; no windows or no history: still shaped.
    shuffled = windows.sample(frac=1.0, random_state=1)
    shuffled.index = shuffled.index * 3 + 5
    pd.testing.assert_frame_equal(
        profiles(shuffled, history, SPEC),
        profiles(shuffled.reset_index(drop=True), history, SPEC).set_axis(shuffled.index),
    )
    none = profiles(windows, history.iloc[:0], SPEC)
    assert (none["profile_windows"] == 0).all() and none["h_event_count_med"].isna().all()
    assert list(profiles(windows.iloc[:0], history, SPEC).columns) == list(none.columns)
