"""Deterministic detection rules over window features (pure pandas; the stream and training).

Each rule is a named condition on one features row, with a severity, a score and a reason text.
``rule_alerts`` turns features into one row per (device, window, alert type) that fired.

Rules read missing data as missing: no location is no distance, a sensor a device lacks is
never "stuck". Where a device's own normal is known (``pipeline.profiles.learned``), rules
compare with it: a flood is a multiple of the device's own reporting rate, a stuck sensor is one
that normally varies, tampering is a power ratio far below the device's usual one. Until then
(cold start) they use the thresholds of the device's type (``RuleThresholds``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

import numpy as np
import pandas as pd

from infra import contract as c
from pipeline import columns as col
from pipeline.alerts import alert_frame, empty_alerts
from pipeline.profiles import (
    LEARNED_POWER_RATIO,
    LEARNED_RATE,
    learned_distinct,
    learned_varies,
)


@dataclass(frozen=True)
class Thresholds:
    """Rule thresholds of one device type; the defaults suit devices that report every 10-30 s."""

    max_speed_kmh: float = 900.0  # faster than an airliner
    min_travel_km: float = 50.0
    clone_min_excess: int = 2  # readings beyond the sequence range
    flood_events_per_min: float = 30.0  # before the device's own rate is learned
    flood_factor: float = 5.0  # once learned: this many times the device's own rate
    stuck_min_events: int = 8
    # Once learned: a share of distinct readings at most stuck_max_share, and at most the
    # device's usual share over stuck_share_drop, is a sensor stuck for much of the window
    # (a coarse sensor repeats readings normally; its share still falls further when stuck).
    stuck_max_share: float = 0.3
    stuck_share_drop: float = 3.0
    tamper_power_ratio: float = 0.5  # real power over voltage x current (x the learned ratio)
    min_events: int = 3


@dataclass(frozen=True)
class RuleThresholds:
    """Thresholds per device type: ``default`` for every type not in ``by_type``."""

    default: Thresholds = field(default_factory=Thresholds)
    by_type: dict[str, Thresholds] = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str) -> RuleThresholds:
        """From JSON such as ``{"*": {"flood_factor": 4}, "gps_tracker": {"max_speed_kmh": 300}}``
        (``*`` changes the default; a type's values start from it). ValueError says what is
        wrong."""
        if not text.strip():
            return cls()
        try:
            spec = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"rule thresholds are not JSON: {exc}") from None
        if not isinstance(spec, dict) or not all(isinstance(v, dict) for v in spec.values()):
            raise ValueError('rule thresholds must map a device type (or "*") to an object')
        known = {f.name: f.type for f in fields(Thresholds)}

        def apply(base: Thresholds, values: dict[str, Any], where: str) -> Thresholds:
            unknown = sorted(set(values) - set(known))
            if unknown:
                raise ValueError(
                    f"rule thresholds for {where}: unknown {unknown}; known: {sorted(known)}"
                )
            bad = [k for k, v in values.items()
                   if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0]  # fmt: skip
            if bad:
                raise ValueError(f"rule thresholds for {where}: {bad} must be numbers >= 0")
            return replace(base, **values)

        default = apply(Thresholds(), spec.get("*", {}), '"*"')
        by_type = {t: apply(default, v, repr(t)) for t, v in spec.items() if t != "*"}
        return cls(default, by_type)

    def per_row(self, device_types: pd.Series) -> pd.DataFrame:
        """The thresholds of each row's device type, one column per threshold."""
        base = asdict(self.default)
        out = pd.DataFrame({k: np.full(len(device_types), v, dtype=float)
                            for k, v in base.items()}, index=device_types.index)  # fmt: skip
        for device_type, t in self.by_type.items():
            rows = (device_types == device_type).to_numpy()
            if rows.any():
                for k, v in asdict(t).items():
                    out.loc[rows, k] = float(v)
        return out


@dataclass(frozen=True)
class Rule:
    alert_type: str
    severity: str
    fires: Callable[[pd.DataFrame, pd.DataFrame], pd.Series]
    score: Callable[[pd.DataFrame, pd.DataFrame], pd.Series]
    reason: Callable[[pd.DataFrame, pd.DataFrame], pd.Series]


def _fmt(template: str, *columns: pd.Series) -> pd.Series:
    index = columns[0].index
    return pd.Series(
        [template % values for values in zip(*columns, strict=True)], index=index, dtype="object"
    )


def _flood_limit(w: pd.DataFrame, t: pd.DataFrame) -> pd.Series:
    return (t["flood_factor"] * w[LEARNED_RATE]).fillna(t["flood_events_per_min"])


def _tamper_limit(w: pd.DataFrame, t: pd.DataFrame) -> pd.Series:
    return t["tamper_power_ratio"] * w[LEARNED_POWER_RATIO].fillna(1.0)


def _stuck(w: pd.DataFrame, t: pd.DataFrame) -> pd.Series:
    """Comma-separated metrics stuck in the window ('' when none): constant readings of a
    metric that normally varies, or, once the device's usual share of distinct readings is
    learned, a share that fell to ``stuck_max_share`` and to a ``stuck_share_drop``-th of the usual
    (stuck for much of the window)."""
    names = pd.Series("", index=w.index, dtype="object")
    for m in c.REPEAT_METRICS:
        varies = w.get(learned_varies(m))
        normally_varies = True if varies is None else varies.map(lambda v: v is not False)
        usual = w.get(learned_distinct(m))
        hit = (w[f"{m}_std"] == 0) & w[f"{m}_mean"].notna()
        if usual is not None:
            share = w[f"{m}_distinct_share"]
            hit |= (share <= t["stuck_max_share"]) & (share * t["stuck_share_drop"] <= usual)
        hit &= (w[col.EVENT_COUNT] >= t["stuck_min_events"]) & normally_varies
        names = names.where(~hit, names + np.where(names == "", "", ",") + m)
    return names


# The rules a single event decides (c.PER_EVENT_ALERT_TYPES); the fast path (pipeline.fastpath)
# raises them per event with these texts.
ROGUE_REASON = "device_id is not in the device registry"
FIRMWARE_REASON = "firmware %s, registry expects %s"
# A window counts the readings of another firmware; which one is in the fast path's message, the
# firmware check's (firmware_tamper) and the telemetry (see pipeline.features._window_aggregates).
WINDOW_FIRMWARE_REASON = "%d readings of a firmware other than the registry's %s"
IMPOSSIBLE_REASON = "a reading outside its physical range (quarantined: out_of_range)"
CLOCK_AHEAD_REASON = "event_time ahead of the time its message was sent (quarantined: clock_ahead)"


def _flagged(alert_type: str) -> Rule:
    """A registered device whose window holds readings quarantined for the reason behind
    ``alert_type`` (``pipeline.columns.FLAG_COUNTS``)."""
    count = col.FLAG_COUNTS[alert_type]
    text = {"impossible_reading": IMPOSSIBLE_REASON, "clock_ahead": CLOCK_AHEAD_REASON}
    return Rule(alert_type, "medium",
                lambda w, t: w["registered"].astype(bool) & (w[count] > 0),
                lambda w, t: pd.Series(1.0, index=w.index),
                lambda w, t: pd.Series(text[alert_type], index=w.index))  # fmt: skip


def rules() -> list[Rule]:
    return [
        Rule("rogue_device", "critical", lambda w, t: ~w["registered"].astype(bool),
             lambda w, t: pd.Series(1.0, index=w.index),
             lambda w, t: pd.Series(ROGUE_REASON, index=w.index)),
        Rule("impossible_travel", "high",
             lambda w, t: (w["implied_speed_kmh"] > t["max_speed_kmh"])
             & (w["spread_km"] > t["min_travel_km"]),
             lambda w, t: w["implied_speed_kmh"] / (4 * t["max_speed_kmh"]),
             lambda w, t: _fmt("moved %.0f km at %.0f km/h", w["spread_km"],
                               w["implied_speed_kmh"])),
        Rule("cloned_device", "high", lambda w, t: w["seq_excess_count"] >= t["clone_min_excess"],
             lambda w, t: w["seq_excess_count"] / w[col.EVENT_COUNT],
             lambda w, t: _fmt("%d readings beyond the sequence range, spread %.1f km",
                               w["seq_excess_count"], w["spread_km"].fillna(0.0))),
        Rule("replay", "high", lambda w, t: w[col.DUPLICATE_COUNT] > 0,
             lambda w, t: w[col.DUPLICATE_COUNT] / w[col.EVENT_COUNT].clip(lower=1),
             lambda w, t: _fmt("%d messages re-sent with an event_id already seen",
                               w[col.DUPLICATE_COUNT])),
        Rule("firmware_mismatch", "medium", lambda w, t: w["firmware_mismatch_count"] > 0,
             lambda w, t: w["firmware_mismatch_count"] / w[col.EVENT_COUNT].clip(lower=1),
             lambda w, t: _fmt(WINDOW_FIRMWARE_REASON, w["firmware_mismatch_count"],
                               w["expected_firmware"])),
        Rule("flood", "medium", lambda w, t: w["events_per_min"] > _flood_limit(w, t),
             lambda w, t: w["events_per_min"] / (10 * _flood_limit(w, t)),
             lambda w, t: _fmt("%.1f messages/min (limit %.1f)", w["events_per_min"],
                               _flood_limit(w, t))),
        Rule("stuck_sensor", "medium", lambda w, t: _stuck(w, t) != "",
             lambda w, t: pd.Series(0.8, index=w.index),
             lambda w, t: "constant readings: " + _stuck(w, t)),
        Rule("tampering", "high", lambda w, t: w["power_ratio_mean"] < _tamper_limit(w, t),
             lambda w, t: 1.0 - w["power_ratio_mean"],
             lambda w, t: _fmt("power is %.0f%% of voltage x current",
                               w["power_ratio_mean"] * 100)),
        *(_flagged(alert_type) for alert_type in col.FLAG_COUNTS),
    ]  # fmt: skip


RULE_TYPES = tuple(rule.alert_type for rule in rules())
SEVERITY = {rule.alert_type: rule.severity for rule in rules()}


def rule_alerts(windows: pd.DataFrame, thresholds: RuleThresholds | None = None) -> pd.DataFrame:
    """One alert row (``pipeline.alerts.DETECTOR_COLUMNS``) per window and rule that fired.

    Input: ``window_features`` rows as pandas, optionally with the columns of
    ``pipeline.profiles.learned`` (the device's own normal; absent or NaN means not learned).
    """
    if windows.empty:
        return empty_alerts()
    windows = windows.reset_index(drop=True)
    for name in (LEARNED_RATE, LEARNED_POWER_RATIO):
        if name not in windows:
            windows[name] = np.nan
    for name in col.FLAG_COUNTS.values():
        # Windows written before these counts existed held no such reading.
        windows[name] = windows[name].fillna(0) if name in windows else 0
    t = (thresholds or RuleThresholds()).per_row(windows["device_type"])
    counts = (col.EVENT_COUNT, col.DUPLICATE_COUNT, *col.FLAG_COUNTS.values())
    counted = sum(windows[name].fillna(0) for name in counts)
    eligible = counted >= t["min_events"]
    w, t = windows[eligible], t[eligible]
    found = []
    for rule in rules():
        fired = rule.fires(w, t).fillna(False).astype(bool)
        if fired.any():
            hit, ht = w[fired], t[fired]
            found.append(alert_frame(hit, rule.alert_type, rule.severity,
                                     rule.score(hit, ht), rule.reason(hit, ht)))  # fmt: skip
    return pd.concat(found, ignore_index=True) if found else empty_alerts()
