"""Detection quality against ground truth: one definition for training reports and live alerts.

Pure functions on pandas frames (no Spark, no I/O). The rules of the game:

- An alert *matches* an injection when it is on the same device, its window overlaps the
  injection's ``[start_time, end_time)``, and its type is one of the scenario's alert types
  (``infra.contract.SCENARIO_ALERT_TYPES``).
- Recall of a scenario: injections matched by at least one alert, over injections.
- Precision of a scenario: among alerts of the scenario's types, those matching an injection of
  the scenario, over those plus the *false* ones. A false alert overlaps no injection at all on its
  device; an alert that overlaps another scenario's injection is neither (it caught real fraud).
  An analyst verdict overrides: ``false_positive`` makes any alert false, ``true_positive`` makes
  an alert that matches no injection count as true in the ``all`` row.
- Time to detect: per matched injection, event time from its start to the last event of the
  earliest matching alert window (pipeline latency is measured separately, in bench/).
- Injections of the scenarios not scored (``clock_skew`` and ``malformed`` test robustness)
  explain only the alerts of their own types (``clock_ahead``, ``impossible_reading``), which are
  true; they add no row. A ``clock_ahead`` alert is counted at the time its message was sent,
  which a simulation faster than real time does not map to its injection's (simulated) time: it
  matches a ``clock_skew`` injection on its device whatever the times.
- A ``device_silent`` alert still open (no ``window_end``: the device has not reported since)
  overlaps every injection on its device that ends after it starts. Its ``last_event_time`` is
  when the silence was detected, so its time to detect is that of the silence too.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from infra import contract as c

ALL = "all"
CLEAN = "clean"
AMBIGUOUS = "ambiguous"
# Columns of the evaluation table except evaluated_at, in order.
RESULT_COLUMNS = [name for name in c.column_names(c.EVALUATION_COLUMNS) if name != "evaluated_at"]


def _utc(series: pd.Series) -> pd.Series:
    return pd.to_datetime(series, utc=True)


# Scenarios whose alerts match on the device alone (see the module docstring).
UNTIMED_SCENARIOS = ("clock_skew",)


def _pairs(alerts: pd.DataFrame, truth: pd.DataFrame) -> pd.DataFrame:
    """Every (alert, injection) on the same device whose times overlap (any times for
    UNTIMED_SCENARIOS)."""
    left = alerts.reset_index(names="alert_row")
    right = truth.reset_index(names="injection_row")[
        ["injection_row", "device_id", "scenario", "start_time", "end_time"]
    ]
    pairs = left.merge(right, on="device_id", how="inner")
    # No window_end: a silence still going on (``device_silent``), open to the future.
    overlap = (pairs["window_start"] < pairs["end_time"]) & (
        pairs["window_end"].isna() | (pairs["window_end"] > pairs["start_time"])
    )
    return pairs[overlap | pairs["scenario"].isin(UNTIMED_SCENARIOS)]


def _verdicts(alerts: pd.DataFrame, feedback: pd.DataFrame | None) -> pd.Series:
    """Each alert's latest analyst verdict (None where it has none), indexed like ``alerts``."""
    if feedback is None or feedback.empty or "alert_id" not in alerts:
        return pd.Series(None, index=alerts.index, dtype="object")
    latest = feedback.sort_values("created_at").groupby("alert_id")["verdict"].last()
    return alerts["alert_id"].map(latest)


def _ratio(num: float, den: float) -> float | None:
    return float(num / den) if den else None


def _f1(precision: float | None, recall: float | None) -> float | None:
    if precision is None or recall is None or precision + recall == 0:
        return None if precision is None or recall is None else 0.0
    return 2 * precision * recall / (precision + recall)


def evaluate(
    alerts: pd.DataFrame,
    truth: pd.DataFrame,
    feedback: pd.DataFrame | None = None,
    scenarios: Sequence[str] = c.FRAUD_SCENARIOS,
) -> pd.DataFrame:
    """Per scenario (and ``all``): injected, detected, alerts, true positives, precision, recall,
    F1 and median time to detect. Scenarios with no injection and no alert are left out.

    ``alerts``: alert_id (when feedback is given), device_id, alert_type, window_start,
    window_end, last_event_time. ``truth``: device_id, scenario, start_time, end_time.
    ``feedback``: alert_id, verdict (the latest per alert is used).
    """
    alerts, truth, pairs, wanted = _overlaps(alerts, truth, scenarios)
    verdict = _verdicts(alerts, feedback)
    rejected = set(alerts.index[verdict == "false_positive"])
    confirmed = set(alerts.index[verdict == "true_positive"])
    matches = pairs[wanted & ~pairs["alert_row"].isin(rejected)]
    false_rows = (set(alerts.index) - set(pairs["alert_row"]) - confirmed) | rejected

    rows = []
    for scenario in [*scenarios, ALL]:
        if scenario == ALL:
            injections = truth[truth["scenario"].isin(scenarios)]
            found = matches[matches["scenario"].isin(scenarios)]
            of_type = set(alerts.index)
            true_rows = set(matches["alert_row"]) | (confirmed - rejected)
        else:
            injections = truth[truth["scenario"] == scenario]
            found = matches[matches["scenario"] == scenario]
            types = c.SCENARIO_ALERT_TYPES.get(scenario, ())
            of_type = set(alerts.index[alerts["alert_type"].isin(types)])
            true_rows = set(found["alert_row"])
        false = (of_type & false_rows) - true_rows
        if injections.empty and not (true_rows or false):
            continue
        first_alert = found.groupby("injection_row")["last_event_time"].min()
        delays = (first_alert - truth.loc[first_alert.index, "start_time"]).dt.total_seconds()
        precision = _ratio(len(true_rows), len(true_rows) + len(false))
        recall = _ratio(len(first_alert), len(injections))
        delay = float(delays.clip(lower=0).median()) if len(delays) else None
        rows.append({
            "scenario": scenario,
            "injected": len(injections),
            "detected": len(first_alert),
            "alerts": len(true_rows) + len(false),
            "true_positive_alerts": len(true_rows),
            "precision": precision,
            "recall": recall,
            "f1": _f1(precision, recall),
            "median_time_to_detect_s": delay,
        })  # fmt: skip
    return pd.DataFrame(rows, columns=RESULT_COLUMNS)


def false_alerts(
    alerts: pd.DataFrame, truth: pd.DataFrame, scenarios: Sequence[str] = c.FRAUD_SCENARIOS
) -> pd.DataFrame:
    """The alerts ``evaluate`` counts as false (no analyst verdict): those that no injection
    explains (module docstring), as rows of ``alerts``."""
    alerts = alerts.reset_index(drop=True)
    _, _, pairs, _ = _overlaps(alerts, truth, scenarios)
    return alerts[~alerts.index.isin(set(pairs["alert_row"]))]


def other_scenario_alerts(
    alerts: pd.DataFrame,
    truth: pd.DataFrame,
    feedback: pd.DataFrame | None = None,
    scenarios: Sequence[str] = c.FRAUD_SCENARIOS,
) -> pd.DataFrame:
    """The alerts ``evaluate`` counts neither true nor false, so its ``all`` row leaves them
    out: on a device during an injection of a scenario that does not raise their type, matching
    no other, with no analyst verdict (a verdict makes an alert true or false). Rows of
    ``alerts`` with ``during``: the scenarios of the injections each overlaps, comma-separated."""
    alerts = alerts.reset_index(drop=True)
    _, _, pairs, wanted = _overlaps(alerts, truth, scenarios)
    judged = set(alerts.index[_verdicts(alerts, feedback).notna()])
    explained = set(pairs.loc[wanted, "alert_row"]) | judged
    other = pairs[~pairs["alert_row"].isin(explained)]
    during = other.groupby("alert_row")["scenario"].agg(lambda s: ", ".join(sorted(set(s))))
    return alerts.loc[during.index].assign(during=during)


def missed(
    alerts: pd.DataFrame, truth: pd.DataFrame, scenarios: Sequence[str] = c.FRAUD_SCENARIOS
) -> pd.DataFrame:
    """The injections of ``scenarios`` that no alert of their scenario's types overlaps (the
    recall misses of ``evaluate``), as rows of ``truth``."""
    _, truth, pairs, wanted = _overlaps(alerts, truth, scenarios)
    found = set(pairs.loc[wanted, "injection_row"])
    return truth[~truth.index.isin(found) & truth["scenario"].isin(scenarios)]


def _overlaps(
    alerts: pd.DataFrame, truth: pd.DataFrame, scenarios: Sequence[str]
) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, np.ndarray]:
    """``alerts`` and the injections renumbered from 0 with UTC times, the pairs of them that
    overlap on a device (``_pairs``), and which pairs have an alert type of the injection's
    scenario. Injections of a scenario not in ``scenarios`` pair only with alerts of its types,
    when it has some (``c.SCENARIO_ALERT_TYPES``)."""
    alerts = alerts.reset_index(drop=True).copy()
    explains = truth["scenario"].isin(scenarios) | truth["scenario"].isin(c.SCENARIO_ALERT_TYPES)
    truth = truth[explains].reset_index(drop=True).copy()
    for frame, columns in ((alerts, ("window_start", "window_end", "last_event_time")),
                           (truth, ("start_time", "end_time"))):  # fmt: skip
        for name in columns:
            if name in frame:
                frame[name] = _utc(frame[name])
    pairs = _pairs(alerts, truth)
    wanted = np.asarray(
        [
            alert_type in c.SCENARIO_ALERT_TYPES.get(scenario, ())
            for alert_type, scenario in zip(pairs["alert_type"], pairs["scenario"], strict=True)
        ],
        dtype=bool,
    )
    scored = pairs["scenario"].isin(scenarios).to_numpy()
    keep = scored | wanted
    return alerts, truth, pairs[keep], wanted[keep]


def window_labels(windows: pd.DataFrame, truth: pd.DataFrame, min_overlap_s: float) -> pd.Series:
    """Per window (device_id, window_start, window_end): ``clean`` when it overlaps no injection
    on its device; else the scenario it overlaps longest when that overlap is at least
    ``min_overlap_s`` seconds; else ``ambiguous`` (too little of the scenario to learn from).
    """
    frame = windows[["device_id", "window_start", "window_end"]].reset_index(names="row")
    frame["window_start"] = _utc(frame["window_start"])
    frame["window_end"] = _utc(frame["window_end"])
    spans = truth[["device_id", "scenario", "start_time", "end_time"]].copy()
    spans["start_time"] = _utc(spans["start_time"])
    spans["end_time"] = _utc(spans["end_time"])
    pairs = frame.merge(spans, on="device_id")
    overlap_s = (
        pairs[["window_end", "end_time"]].min(axis=1)
        - pairs[["window_start", "start_time"]].max(axis=1)
    ).dt.total_seconds()
    pairs = pairs.assign(overlap_s=overlap_s)[overlap_s > 0]
    labels = pd.Series(CLEAN, index=windows.index, dtype="object")
    if pairs.empty:
        return labels
    best = pairs.sort_values("overlap_s").groupby("row").last()
    chosen = best["scenario"].where(best["overlap_s"] >= min_overlap_s, AMBIGUOUS)
    labels.loc[windows.index[best.index]] = chosen.to_numpy()
    return labels


def false_alerts_per_10k(alerts: pd.DataFrame, labels: pd.Series) -> tuple[int, int, float]:
    """(false alerts, clean windows, false alerts per 10,000 clean device-windows).

    ``alerts`` must carry ``window_label``: the label of the window each alert was raised on.
    """
    false = int((alerts["window_label"] == CLEAN).sum())
    clean = int((labels == CLEAN).sum())
    return false, clean, (10_000 * false / clean) if clean else 0.0
