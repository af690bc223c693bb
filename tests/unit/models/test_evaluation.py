"""``iotfraud eval``'s numbers on a hand-built alerts / ground-truth pair, and window labels."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import pandas as pd
import pytest

from models.evaluation import (
    AMBIGUOUS,
    CLEAN,
    evaluate,
    false_alerts,
    false_alerts_per_10k,
    missed,
    other_scenario_alerts,
    window_labels,
)
from models.live_eval import LakeEvaluation

T0 = datetime(2026, 1, 5, 10, 0, tzinfo=timezone.utc)


def at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


def injection(device: str, scenario: str, start: float, end: float) -> dict[str, Any]:
    return {"device_id": device, "scenario": scenario, "start_time": at(start), "end_time": at(end)}


def alert(alert_id: str, device: str, alert_type: str, start: float, last: float) -> dict[str, Any]:
    window = {"window_start": at(start), "window_end": at(start + 10), "last_event_time": at(last)}
    return {"alert_id": alert_id, "device_id": device, "alert_type": alert_type, **window}


TRUTH = pd.DataFrame([
    injection("m1", "tampering", 0, 15),   # caught twice: by its rule (at 3 min) and the model
    injection("m2", "tampering", 0, 15),   # missed
    injection("t1", "flood", 30, 45),      # caught by flood (at 37 min)
    injection("t2", "impossible_travel", 0, 15),  # caught by cloned_device, an accepted type
    injection("x1", "clock_skew", 0, 15),  # not a fraud scenario: ignored
])  # fmt: skip
ALERTS = pd.DataFrame([
    alert("a1", "m1", "tampering", -5, 3),
    alert("a2", "m1", "model_anomaly", 0, 9),
    alert("a3", "t1", "flood", 28, 37),
    alert("a4", "t2", "cloned_device", 5, 14),
    alert("a5", "c1", "tampering", 0, 9),      # clean device: a false tampering alert
    alert("a6", "m1", "flood", 2, 9),          # flood type on a tampering injection: neither
    alert("a7", "c2", "model_anomaly", 0, 9),  # clean device: a false model alert
])  # fmt: skip


def by_scenario(result: pd.DataFrame) -> dict[str, dict[str, Any]]:
    return {row["scenario"]: row for row in result.to_dict("records")}


def test_recall_precision_and_time_to_detect_per_scenario() -> None:
    rows = by_scenario(evaluate(ALERTS, TRUTH))
    tampering = rows["tampering"]
    assert (tampering["injected"], tampering["detected"]) == (2, 1)
    assert tampering["recall"] == 0.5
    # a1, a2 true; a5 and a7 false (tampering and model_anomaly are its types)
    assert (tampering["true_positive_alerts"], tampering["alerts"]) == (2, 4)
    assert tampering["precision"] == 0.5
    assert tampering["f1"] == pytest.approx(0.5)
    assert tampering["median_time_to_detect_s"] == 180.0  # the earliest alert: 3 min in
    assert rows["flood"]["recall"] == 1.0 and rows["flood"]["precision"] == 1.0
    assert rows["flood"]["median_time_to_detect_s"] == 420.0
    assert rows["impossible_travel"]["recall"] == 1.0
    assert "clock_skew" not in rows and "replay" not in rows


def test_the_all_row_counts_every_alert_once() -> None:
    total = by_scenario(evaluate(ALERTS, TRUTH))["all"]
    assert (total["injected"], total["detected"]) == (4, 3)
    # true: a1 a2 a3 a4; false: a5 a7; a6 overlaps an injection of another kind: neither
    assert (total["true_positive_alerts"], total["alerts"]) == (4, 6)
    assert total["precision"] == pytest.approx(4 / 6)


def test_the_alerts_the_all_row_leaves_out_are_those_during_another_scenarios_injection() -> None:
    other = other_scenario_alerts(ALERTS, TRUTH)
    assert other[["alert_id", "alert_type", "during"]].to_dict("records") == [
        {"alert_id": "a6", "alert_type": "flood", "during": "tampering"}
    ]
    assert LakeEvaluation(pd.DataFrame(), other).left_out_line() == (
        "1 alert not in the table, neither true nor false: each came on a device during an "
        "injection of a scenario that does not raise its type (during tampering: flood 1)"
    )
    # Every alert is in the all row or here: the demo's total is their sum.
    assert by_scenario(evaluate(ALERTS, TRUTH))["all"]["alerts"] + len(other) == len(ALERTS)
    # An analyst's verdict makes it true or false, in the all row either way.
    for verdict in ("true_positive", "false_positive"):
        feedback = pd.DataFrame([{"alert_id": "a6", "verdict": verdict, "created_at": at(60)}])
        assert other_scenario_alerts(ALERTS, TRUTH, feedback).empty
        assert by_scenario(evaluate(ALERTS, TRUTH, feedback))["all"]["alerts"] == len(ALERTS)
    # An alert that also matches an injection of its own type is true, not listed.
    both = pd.concat([TRUTH, pd.DataFrame([injection("m1", "flood", 0, 15)])])
    assert other_scenario_alerts(ALERTS, both).empty


def test_analyst_verdicts_override_the_ground_truth() -> None:
    feedback = pd.DataFrame([
        {"alert_id": "a1", "verdict": "false_positive", "created_at": at(60)},
        {"alert_id": "a5", "verdict": "false_positive", "created_at": at(60)},
        {"alert_id": "a5", "verdict": "true_positive", "created_at": at(61)},  # latest wins
    ])  # fmt: skip
    rows = by_scenario(evaluate(ALERTS, TRUTH, feedback))
    tampering = rows["tampering"]
    assert tampering["detected"] == 1  # a2 still catches m1
    assert tampering["median_time_to_detect_s"] == 540.0  # a2's window ends its evidence at 9 min
    # a1 rejected -> false; a2 true; a5 confirmed -> neither here; a7 false
    assert (tampering["true_positive_alerts"], tampering["alerts"]) == (1, 3)
    assert by_scenario(evaluate(ALERTS, TRUTH, feedback))["all"]["true_positive_alerts"] == 4


def test_no_alerts_gives_zero_recall_and_no_precision() -> None:
    rows = by_scenario(evaluate(ALERTS.iloc[0:0], TRUTH))
    assert rows["tampering"]["recall"] == 0.0
    assert rows["tampering"]["precision"] is None and rows["tampering"]["f1"] is None


def test_window_labels_need_enough_overlap() -> None:
    windows = pd.DataFrame([
        {"device_id": "m1", "window_start": at(0), "window_end": at(10)},    # 10 min inside
        {"device_id": "m1", "window_start": at(12), "window_end": at(22)},   # 3 min inside
        {"device_id": "m1", "window_start": at(20), "window_end": at(30)},   # after it
        {"device_id": "c1", "window_start": at(0), "window_end": at(10)},    # no injection
    ])  # fmt: skip
    labels = window_labels(windows, TRUTH, min_overlap_s=300)
    assert labels.tolist() == ["tampering", AMBIGUOUS, CLEAN, CLEAN]
    alerts = pd.DataFrame({"window_label": ["tampering", CLEAN]})
    assert false_alerts_per_10k(alerts, labels) == (1, 2, 5000.0)


def test_missed_lists_the_fraud_injections_no_alert_of_their_types_caught() -> None:
    missed_ = missed(ALERTS, TRUTH)
    assert list(zip(missed_["device_id"], missed_["scenario"], strict=True)) == [
        ("m2", "tampering")
    ]


def test_robustness_injections_explain_only_the_alerts_of_their_types() -> None:
    truth = pd.DataFrame([
        injection("k1", "clock_skew", 0, 15),
        injection("k2", "malformed", 0, 15),
        injection("k3", "malformed", 0, 15),
    ])  # fmt: skip
    alerts = pd.DataFrame([
        # The clock's alert is counted at the wall-clock time of its messages, which an
        # accelerated run does not map to the injection's simulated time: true all the same.
        alert("b1", "k1", "clock_ahead", 300, 305),
        alert("b2", "k2", "impossible_reading", 0, 9),  # true: malformed's out-of-range readings
        alert("b3", "k3", "spike", 0, 9),  # malformed messages explain no spike: false
        alert("b4", "c1", "clock_ahead", 0, 9),  # a clock ahead on a clean device: false
    ])  # fmt: skip
    rows = by_scenario(evaluate(alerts, truth))
    assert set(rows) == {"spike", "all"}  # robustness scenarios are not scored: no row
    assert (rows["spike"]["true_positive_alerts"], rows["spike"]["alerts"]) == (0, 1)
    total = rows["all"]
    assert (total["injected"], total["detected"]) == (0, 0)
    assert (total["true_positive_alerts"], total["alerts"]) == (2, 4)
    assert missed(alerts, truth).empty
    assert sorted(false_alerts(alerts, truth)["alert_id"]) == ["b3", "b4"]
