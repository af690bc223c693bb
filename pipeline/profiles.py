"""Each device's own normal, and a window described relative to it (pure pandas, no Spark).

A device's *profile* at a window is made of the device's own closed windows that ended at or
before that window began (so it never overlaps what it is compared with) and started within
``span_s`` before that: per metric the median level and its spread, the median within-window
spread and range, the median share of distinct readings, power ratio and reporting rate. A
history window whose level of a metric lies far from the others (``OUTLIER_K`` robust standard
deviations) is left out of that metric's profile: an anomaly a few windows long must not become
the normal the windows after it are compared with.

``relative_features`` turns a window and its profile into unit-free numbers that are about 0 for
a device behaving as it usually does, whatever its levels, rate or sensors (a 1 Hz pump rig or
a thermostat reporting twice a minute alike): level and trend in the device's own standard
deviations, log ratios of spread, range and rate, differences of shares. A metric the device
does not report stays missing (NaN), never a number.

The same function serves the stream (``pipeline.detection``, on the windows the watermark has
closed, with the device's closed windows kept on the driver) and training (``models.dataset``,
on every window of a simulated history): one definition, so the model scores exactly the rows it
was trained on.

Cold start: a window whose profile holds fewer than ``min_windows`` windows, or that holds less
than half the device's usual number of events (``fill``), is not scored by the model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import pandas as pd

from infra import contract as c
from pipeline import columns as col

# Metrics the profile follows. Not the battery: a recharge is a legitimate jump of most of its
# range, and a slow drain is no anomaly.
PROFILE_METRICS = c.REPEAT_METRICS
# Window columns a profile reads (what the driver keeps of a closed window).
HISTORY_COLUMNS = (
    "device_id", col.WINDOW_START, col.WINDOW_END, col.EVENT_COUNT, "first_event_time",
    "last_event_time", "power_ratio_mean",
    *(f"{m}_{s}" for m in PROFILE_METRICS for s in ("mean", "std", "min", "max", "distinct_share")),
)  # fmt: skip
# Metrics that are never negative (the contract's ranges): a change is also a ratio.
POSITIVE_METRICS = tuple(
    m for m in PROFILE_METRICS if m in c.VALID_RANGES and c.VALID_RANGES[m][0] >= 0
)
# Relative features: the model's inputs, in order.
RELATIVE_FEATURES = (
    *(
        f"rel_{m}_{kind}"
        for m in PROFILE_METRICS
        for kind in ("level", "trend", "spread", "range", "distinct")
    ),
    *(f"rel_{m}_ratio" for m in POSITIVE_METRICS),
    "rel_power_ratio",
    "rel_rate",
)
# Of those, the ones in the device's own standard deviations (the unsupervised part's z-scores).
Z_FEATURES = tuple(f"rel_{m}_{kind}" for m in PROFILE_METRICS for kind in ("level", "trend"))
PROFILE_WINDOWS = "profile_windows"
FILL = "fill"
# Profile columns rules read (learned rate and whether a metric normally varies).
LEARNED_RATE = "learned_events_per_min"
LEARNED_POWER_RATIO = "learned_power_ratio"
_CLIP = 50.0
_IQR_TO_SIGMA = 1.349
_MAD_TO_SIGMA = 1.4826
OUTLIER_K = 3.0
Level = TypeVar("Level", pd.Series, np.ndarray)


def learned_varies(metric: str) -> str:
    return f"learned_{metric}_varies"


def learned_distinct(metric: str) -> str:
    return f"learned_{metric}_distinct_share"


@dataclass(frozen=True)
class ProfileSpec:
    """How a profile is learned and when a window is scored against it."""

    window_s: float = 600.0  # the sliding window's length
    slide_s: float = 300.0  # the sliding window's step
    span_s: float = 7200.0  # how far back a profile reaches
    min_windows: int = 3  # fewer closed windows than this: cold start, no model score
    min_fill: float = 0.5  # a window with fewer events than this share of the usual: not scored

    @property
    def cold_start_s(self) -> float:
        """Event time from a device's first event until the windows starting then are scored:
        ``min_windows`` closed windows before them, and the partial one at the start."""
        return (self.min_windows + 1) * self.slide_s


def observed_rate(windows: pd.DataFrame) -> pd.Series:
    """Events per minute over the time a window's events span (NaN under two events). Unlike
    ``events_per_min`` (per window length) it does not read a device's first, partly covered
    window as a slow device."""
    span_s = (windows["last_event_time"] - windows["first_event_time"]).dt.total_seconds()
    rate = (windows[col.EVENT_COUNT] - 1) * 60.0 / span_s
    return rate.where(span_s > 0).astype("float64")


def _floor(level: Level) -> Level:
    """The smallest spread a level is measured against: a constant reading (a spread of 0)
    must not turn every change into an infinite z-score."""
    return 1e-3 * abs(level) + 1e-3


# Per history window, the columns whose medians make a profile (``profiles``).
_MEDIANS = (
    col.EVENT_COUNT, "observed_rate", "power_ratio_mean",
    *(f"{m}_{s}" for m in PROFILE_METRICS for s in ("mean", "std", "range", "distinct_share")),
)  # fmt: skip
_STATS = ("mean", "std", "range", "distinct_share")  # what an outlying level takes out


def _quantiles(values: np.ndarray, qs: tuple[float, ...]) -> list[np.ndarray]:
    """Per row of ``values`` (NaN: no value), its quantiles ``qs``, interpolated linearly
    between the two nearest values as pandas' groupby quantile does; a median of an even count
    is the mean of the middle two, as pandas' groupby median gives it. NaN where a row has no
    value."""
    if values.shape[1] == 0:
        return [np.full(len(values), np.nan) for _ in qs]
    ordered = np.sort(values, axis=1)  # NaN last
    count = np.count_nonzero(~np.isnan(values), axis=1)
    last = np.maximum(count - 1, 0)
    out = []
    for q in qs:
        position = q * last
        low = np.floor(position).astype(np.int64)
        high = np.minimum(low + 1, last)
        below = np.take_along_axis(ordered, low[:, None], axis=1)[:, 0]
        above = np.take_along_axis(ordered, high[:, None], axis=1)[:, 0]
        if q == 0.5:
            result = (below + np.where(count % 2 == 0, above, below)) / 2
        else:
            result = below + (above - below) * (position - low)
        out.append(np.where(count > 0, result, np.nan))
    return out


def _median(values: np.ndarray) -> np.ndarray:
    return _quantiles(values, (0.5,))[0]


def _pairs(windows: pd.DataFrame, hist: pd.DataFrame, spec: ProfileSpec) -> np.ndarray:
    """Per row of ``windows``, the rows of ``hist`` its profile reads (its device's windows that
    ended by its start and started within ``span_s`` before it): an array of ``hist`` row
    numbers, one row per window and as many columns as the most any window reads, -1 where a
    window reads fewer."""
    codes, devices = pd.factorize(hist["device_id"])
    own = pd.Index(devices).get_indexer(windows["device_id"])
    starts = hist[col.WINDOW_START].to_numpy("datetime64[ns]")
    # History rows in (device, start) order; each (device, start) a single sortable number.
    times = np.unique(starts)
    order = np.lexsort((starts, codes))
    stride = len(times) + 1
    keys = codes[order] * stride + np.searchsorted(times, starts[order])
    at = windows[col.WINDOW_START].to_numpy("datetime64[ns]")
    span = np.timedelta64(int(spec.span_s * 1e9), "ns")
    first = np.searchsorted(keys, own * stride + np.searchsorted(times, at - span), "left")
    # A window that ended by ``at`` started before it.
    stop = np.searchsorted(keys, own * stride + np.searchsorted(times, at), "left")
    reads = np.where(own >= 0, stop - first, 0)
    width = int(reads.max()) if len(reads) else 0
    step = np.arange(width)
    rows = order[np.minimum(first[:, None] + step, len(order) - 1)] if len(order) else (
        np.zeros((len(windows), 0), dtype=np.int64))  # fmt: skip
    ends = hist[col.WINDOW_END].to_numpy("datetime64[ns]")
    inside = (step < reads[:, None]) & (ends[rows] <= at[:, None])
    return np.where(inside, rows, -1)


def profiles(windows: pd.DataFrame, history: pd.DataFrame, spec: ProfileSpec) -> pd.DataFrame:
    """Per row of ``windows`` (device_id, window_start), the profile of its device from
    ``history`` (HISTORY_COLUMNS rows of closed windows): the history windows of the device that
    ended at or before the window's start and started at most ``span_s`` before it.

    Output: indexed like ``windows``; ``profile_windows`` (0 when the device has none) and the
    medians and spreads named ``h_<column>_<stat>``, NaN where there is no history.

    In numpy, one row per window and a column per history window it reads: a batch that closes
    windows asks for the profiles of every device's next two windows, each reading up to two
    hours of history, and pandas' groupby took seconds of the batch (docs/PERFORMANCE.md,
    session 71).
    """
    hist = _typed(history).reset_index(drop=True)
    for m in PROFILE_METRICS:
        hist[f"{m}_range"] = hist[f"{m}_max"] - hist[f"{m}_min"]
    hist["observed_rate"] = observed_rate(hist)
    rows = _pairs(windows, hist, spec)
    missing = rows < 0

    def read(name: str) -> np.ndarray:
        values = hist[name].to_numpy("float64")[np.maximum(rows, 0)] if len(hist) else (
            np.full(rows.shape, np.nan))  # fmt: skip
        values[missing] = np.nan
        return values

    columns = {name: read(name) for name in _MEDIANS}
    for m in PROFILE_METRICS:
        # A history window whose level lies more than OUTLIER_K robust standard deviations
        # from the others' leaves this metric's profile: a spike or dip that lasted a few
        # windows must not become the normal the next windows are compared with.
        level = columns[f"{m}_mean"]
        center = _median(level)
        distance = np.abs(level - center[:, None])
        within = _median(columns[f"{m}_std"])
        scale = np.fmax(np.fmax(_median(distance) * _MAD_TO_SIGMA, within), _floor(center))
        with np.errstate(invalid="ignore"):
            outlying = ~(distance <= OUTLIER_K * scale[:, None])
        for stat in _STATS:
            columns[f"{m}_{stat}"] = np.where(outlying, np.nan, columns[f"{m}_{stat}"])
    out = pd.DataFrame(
        {f"h_{name}_med": _median(columns[name]) for name in _MEDIANS}, index=windows.index
    )
    for m in PROFILE_METRICS:
        low, high = _quantiles(columns[f"{m}_mean"], (0.25, 0.75))
        out[f"h_{m}_mean_iqr"] = high - low
    out[PROFILE_WINDOWS] = (~missing).sum(axis=1).astype("int64")
    return out


def relative_features(windows: pd.DataFrame, prof: pd.DataFrame, spec: ProfileSpec) -> pd.DataFrame:
    """``windows`` (window features) described relative to their profiles (``profiles``).

    Output: indexed like ``windows``; RELATIVE_FEATURES, ``profile_windows`` and ``fill``
    (events over the device's usual number). Missing where a metric or the history is missing.
    """
    out = pd.DataFrame(index=windows.index)
    minutes = spec.window_s / 60.0
    for m in PROFILE_METRICS:
        level = prof[f"h_{m}_mean_med"]
        floor = _floor(level)
        scale = pd.concat(
            [prof[f"h_{m}_mean_iqr"] / _IQR_TO_SIGMA, prof[f"h_{m}_std_med"], floor], axis=1
        ).max(axis=1, skipna=False)
        out[f"rel_{m}_level"] = (windows[f"{m}_mean"] - level) / scale
        out[f"rel_{m}_trend"] = windows[f"{m}_slope"] * minutes / scale
        out[f"rel_{m}_spread"] = np.log2(
            (windows[f"{m}_std"] + floor) / (prof[f"h_{m}_std_med"] + floor)
        )
        width = windows[f"{m}_max"] - windows[f"{m}_min"]
        out[f"rel_{m}_range"] = np.log2((width + floor) / (prof[f"h_{m}_range_med"] + floor))
        out[f"rel_{m}_distinct"] = (
            windows[f"{m}_distinct_share"] - prof[f"h_{m}_distinct_share_med"]
        )
        if m in POSITIVE_METRICS:
            out[f"rel_{m}_ratio"] = np.log2((windows[f"{m}_mean"] + floor) / (level + floor))
    out["rel_power_ratio"] = windows["power_ratio_mean"] - prof["h_power_ratio_mean_med"]
    out["rel_rate"] = np.log2(observed_rate(windows) / prof["h_observed_rate_med"])
    out = out.astype("float64").clip(-_CLIP, _CLIP)
    out[PROFILE_WINDOWS] = prof[PROFILE_WINDOWS]
    out[FILL] = (windows[col.EVENT_COUNT] / prof[f"h_{col.EVENT_COUNT}_med"]).astype("float64")
    return out[[*RELATIVE_FEATURES, PROFILE_WINDOWS, FILL]]


def scorable(relative: pd.DataFrame, spec: ProfileSpec) -> pd.Series:
    """Windows past their device's cold start, holding enough of its usual events."""
    return (relative[PROFILE_WINDOWS] >= spec.min_windows) & (relative[FILL] >= spec.min_fill)


def learned(prof: pd.DataFrame, spec: ProfileSpec) -> pd.DataFrame:
    """What rules read of a profile: the learned reporting rate and power ratio, and per metric
    whether it normally varies and its usual share of distinct readings; NaN/None before the
    device's cold start is over (``min_windows``)."""
    prof = prof.where(prof[PROFILE_WINDOWS] >= spec.min_windows)
    out = pd.DataFrame(index=prof.index)
    out[LEARNED_RATE] = prof["h_observed_rate_med"]
    out[LEARNED_POWER_RATIO] = prof["h_power_ratio_mean_med"]
    for m in PROFILE_METRICS:
        std = prof[f"h_{m}_std_med"]
        out[learned_varies(m)] = (std > 0).astype("object").where(std.notna(), None)
        out[learned_distinct(m)] = prof[f"h_{m}_distinct_share_med"]
    return out


def history_rows(windows: pd.DataFrame, min_events: int) -> pd.DataFrame:
    """The closed windows a profile may learn from: HISTORY_COLUMNS of those with at least
    ``min_events`` events (a device's first, nearly empty window says little of its normal)."""
    return _typed(windows.loc[windows[col.EVENT_COUNT] >= min_events])


_TIMES = (col.WINDOW_START, col.WINDOW_END, "first_event_time", "last_event_time")


def _typed(history: pd.DataFrame) -> pd.DataFrame:
    """HISTORY_COLUMNS with their types, also when empty or when a metric is missing throughout
    (no dtype to infer from None)."""
    hist = history[list(HISTORY_COLUMNS)].astype(
        {name: "float64" for name in HISTORY_COLUMNS if name not in ("device_id", *_TIMES)}
    )
    for name in _TIMES:
        hist[name] = pd.to_datetime(hist[name])
    return hist
