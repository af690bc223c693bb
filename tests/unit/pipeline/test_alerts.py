"""Which alerts a batch writes: new ones, changed ones, never one the table already holds."""

from __future__ import annotations

import pandas as pd

from pipeline.alerts import WrittenAlerts, alert_frame

T0 = pd.Timestamp("2026-11-25 08:00:00")


def alerts(*rows: tuple[str, float, str]) -> pd.DataFrame:
    """One flood alert per (device, score, reason), all on the window starting at T0."""
    windows = pd.DataFrame([
        {"device_id": d, "window_start": T0, "window_end": T0 + pd.Timedelta(minutes=10),
         "first_event_time": T0, "last_event_time": T0 + pd.Timedelta(minutes=4)}
        for d, _, _ in rows
    ])  # fmt: skip
    return alert_frame(windows, "flood", "high", pd.Series([s for _, s, _ in rows]),
                       pd.Series([r for _, _, r in rows]))  # fmt: skip


def test_only_new_and_changed_alerts_are_written() -> None:
    written = WrittenAlerts()
    new, changed = written.split(alerts(("d1", 0.5, "40 events"), ("d2", 0.7, "50 events")))
    assert sorted(new["device_id"]) == ["d1", "d2"] and changed.empty
    written.remember(new)
    # The same windows decided again: d1 unchanged, d2's score and reason grew, d3 is new.
    batch = alerts(("d1", 0.5, "40 events"), ("d2", 0.8, "60 events"), ("d3", 0.6, "45 events"))
    new, changed = written.split(batch)
    assert list(new["device_id"]) == ["d3"]
    assert list(changed["device_id"]) == ["d2"]
    written.remember(pd.concat([new, changed]))
    assert written.split(batch)[0].empty and written.split(batch)[1].empty


def test_alerts_read_back_from_the_table_count_as_written() -> None:
    first = alerts(("d1", 0.5, "40 events"))
    # As toPandas gives them back: reasons an array, the score a float.
    back = first.copy()
    back["reasons"] = [pd.array(r).to_numpy() for r in back["reasons"]]
    written = WrittenAlerts()
    written.remember(back)
    new, changed = written.split(first)
    assert new.empty and changed.empty


def test_alerts_of_closed_windows_are_forgotten() -> None:
    written = WrittenAlerts()
    written.remember(alerts(("d1", 0.5, "40 events")))
    written.forget_until(T0 + pd.Timedelta(minutes=9))
    assert len(written.fields) == 1
    written.forget_until(T0 + pd.Timedelta(minutes=10))
    assert not written.fields


def test_an_alert_only_the_final_state_of_a_window_calls_for_is_written() -> None:
    """A device's profile grows while a window waits to close, so its final verdict can call for
    an alert no earlier state of the window raised."""
    written = WrittenAlerts()
    raised = alerts(("d1", 0.5, "40 events"), ("d2", 0.5, "40 events"))
    written.remember(raised[raised["device_id"] == "d1"])
    final = alerts(("d1", 0.6, "45 events"), ("d2", 0.7, "50 events"), ("d3", 0.9, "60 events"))
    new, changed = written.to_write(raised, final)
    # d2 raised in this batch and closed by it: written once, with its final values.
    assert sorted(zip(new["device_id"], new["score"], strict=True)) == [("d2", 0.7), ("d3", 0.9)]
    assert list(changed["device_id"]) == ["d1"]
