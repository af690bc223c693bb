"""Which alerts a batch writes: new ones, changed ones, never one the table already holds."""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from pandas.testing import assert_frame_equal

from infra import contract as c
from pipeline.alerts import (
    TABLE_COLUMNS,
    WrittenAlerts,
    after_merge,
    alert_frame,
    as_written,
    merge_alerts,
    records,
)
from pipeline.sinks import ensure_table

T0 = pd.Timestamp("2026-11-25 08:00:00")
NOW = pd.Timestamp("2026-11-25 08:04:30.123456")


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
    assert len(written.rows) == 1
    written.forget_until(T0 + pd.Timedelta(minutes=10))
    assert not written.rows


def test_an_alert_with_no_end_stays_known_and_a_forgotten_one_goes_through_the_merge() -> None:
    """Silence's alerts, known by their start: an open silence (no end) is never forgotten; once
    an ended one is, a new alert that may be it (it starts by the time forgotten) is MERGEd."""
    written = WrittenAlerts(unknown_by="window_start")
    ended = alerts(("ended", 1.0, "silent"), ("open", 1.0, "silent"), ("fresh", 1.0, "silent"))
    ended["window_end"] = [T0 + pd.Timedelta(minutes=10), None, None]
    ended.loc[2, "window_start"] = T0 + pd.Timedelta(hours=2)
    written.remember(ended)
    written.forget_until(T0 + pd.Timedelta(hours=1))
    assert sorted(row["device_id"] for row in written.rows.values()) == ["fresh", "open"]
    # "ended" raised again with its start, and one that started later: only the first may be
    # in the table.
    again = ended.iloc[[0]].assign(window_end=None)
    later = again.assign(window_start=T0 + pd.Timedelta(hours=1, seconds=1))
    assert list(written.maybe_written(pd.concat([again, later], ignore_index=True))) == [
        True,
        False,
    ]


def test_nothing_forgotten_leaves_every_alert_known() -> None:
    written = WrittenAlerts()
    written.remember(alerts(("d1", 0.5, "40 events")))
    written.forget_until(T0)
    assert written.unknown_until is None
    assert not written.maybe_written(alerts(("d2", 0.5, "40 events"))).any()


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


def test_a_withdrawn_alert_is_its_row_as_written_marked_withdrawn_once() -> None:
    written = WrittenAlerts()
    raised = as_written(alerts(("d1", 0.5, "40 events"), ("d2", 0.5, "40 events")), 3, NOW)
    written.remember(raised)
    closing = raised[["device_id", "window_start", "window_end"]]
    final = raised[raised["device_id"] == "d2"]  # the finished windows call for d2's only
    stale = written.stale(closing, final, ["flood"])
    expected = raised[raised["device_id"] == "d1"].assign(status="withdrawn")
    assert_frame_equal(
        stale.reset_index(drop=True), expected.reset_index(drop=True), check_dtype=False
    )
    written.remember(stale)
    assert written.stale(closing, final, ["flood"]).empty  # withdrawn already: not again


def test_changed_values_keep_the_first_detection_and_after_merge_says_what_changes() -> None:
    written = WrittenAlerts()
    raised = as_written(alerts(("d1", 0.5, "40 events")), 3, NOW)
    written.remember(raised)
    _, changed = written.split(alerts(("d1", 0.8, "60 events")))
    updated = written.updated(changed)
    assert list(updated.columns) == TABLE_COLUMNS
    assert updated.loc[0, "score"] == 0.8 and updated.loc[0, "reasons"] == ["60 events"]
    assert updated.loc[0, "detected_at"] == NOW and updated.loc[0, "batch_id"] == 3
    # The MERGE of those values into a table holding the raised row changes it; of the raised
    # row itself, nothing; a row the table lacks is inserted as it is.
    later = as_written(alerts(("d1", 0.8, "60 events"), ("d9", 0.6, "45 events")), 7, NOW)
    held = {row["alert_id"]: row for row in records(raised)}
    after, changes = after_merge(later, held)
    assert list(changes) == [True, True]
    assert after.loc[0, "detected_at"] == NOW and after.loc[0, "batch_id"] == 3
    assert after.loc[1, "batch_id"] == 7
    assert list(after_merge(raised, held)[1]) == [False]


def test_the_pipelines_alert_writers_take_turns_instead_of_conflicting(
    spark: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Detection, firmware and silence MERGE alerts from their queries' threads. Two MERGEs at
    once into the unpartitioned table conflict: one is done again, after Delta logged an ERROR."""
    path = str(tmp_path / "alerts")
    ensure_table(spark, path, c.ALERTS_COLUMNS)
    frames = [as_written(alerts((f"d{i}", 0.5, "40 events")), i, NOW) for i in range(3)]
    errors: list[BaseException] = []
    together = threading.Barrier(len(frames))

    def write(frame: Any) -> None:
        together.wait()
        try:
            merge_alerts(spark, frame, path)
        except BaseException as exc:  # raised below, in the test's thread
            errors.append(exc)

    with caplog.at_level(logging.INFO, logger="pipeline.sinks"):
        threads = [threading.Thread(target=write, args=(f,)) for f in frames]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
    assert not errors, errors
    assert not [r.getMessage() for r in caplog.records if "conflicted" in r.getMessage()]
    rows = spark.read.format("delta").load(path).select("device_id").collect()
    assert sorted(r.device_id for r in rows) == ["d0", "d1", "d2"]
