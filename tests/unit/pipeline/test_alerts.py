"""Which alerts a batch writes: new ones, changed ones, never one the table already holds."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from delta.tables import DeltaTable
from pandas.testing import assert_frame_equal

from infra import contract as c
from pipeline.alerts import (
    TABLE_COLUMNS,
    WrittenAlerts,
    after_merge,
    alert_frame,
    alert_id_of,
    as_written,
    merge_alerts,
    records,
    to_spark,
)
from pipeline.sinks import append, ensure_table

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


def alerts_of(alert_type: str, *rows: tuple[str, float, str]) -> pd.DataFrame:
    """``alerts`` of another type: another detector's."""
    frame = alerts(*rows).assign(alert_type=alert_type)
    frame["alert_id"] = [alert_id_of(d, alert_type, T0) for d in frame["device_id"]]
    return frame


def test_one_detectors_merge_is_never_failed_by_anothers_appends(
    spark: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Detection, firmware and silence write alerts from their queries' threads, each its own
    types. Delta fails a MERGE when a commit made meanwhile added files it should have read, and
    in the unpartitioned table of older versions any append did: the MERGE was done again, after
    Delta logged an ERROR (so the writers took turns, and detection's new alerts waited for a
    silence MERGE). Partitioned by type, a silence MERGE goes through at its first attempt while
    detection appends its alerts again and again."""
    path = str(tmp_path / "alerts")
    ensure_table(spark, path, c.ALERTS_COLUMNS, c.ALERTS_PARTITIONED_BY)
    silent = as_written(alerts_of("device_silent", ("d0", 0.9, "silent 300 s")), 1, NOW)
    merge_alerts(spark, silent, path)
    merging = threading.Event()
    appended: list[int] = []
    errors: list[BaseException] = []

    def detection() -> None:
        try:
            for i in range(8):  # one before the MERGE, the others while it runs
                if i and not merging.is_set():
                    return
                rows = as_written(alerts((f"d{i}", 0.5, "40 events")), 2 + i, NOW)
                append(to_spark(spark, rows), path, rows=1)
                appended.append(i)
        except BaseException as exc:  # raised below, in the test's thread
            errors.append(exc)

    ended = silent.assign(window_end=T0 + pd.Timedelta(minutes=20), score=1.0)
    writer = threading.Thread(target=detection)
    with caplog.at_level(logging.INFO, logger="pipeline.sinks"):
        merging.set()
        writer.start()
        while not appended and writer.is_alive():  # the MERGE starts after an append
            time.sleep(0.05)
        merge_alerts(spark, ended, path)
        merging.clear()
        writer.join(120)
    assert not errors, errors
    assert not [r.getMessage() for r in caplog.records if "conflicted" in r.getMessage()]
    history = spark.sql(f"DESCRIBE HISTORY delta.`{path}`").toPandas()
    merge = history[history["operation"] == "MERGE"].sort_values("version").iloc[-1]
    meanwhile = history[(history["operation"] == "WRITE")
                        & (history["version"] > merge["readVersion"])
                        & (history["version"] < merge["version"])]  # fmt: skip
    assert len(meanwhile) >= 1, "no append landed while the MERGE ran: the test proved nothing"
    table = spark.read.format("delta").load(path).toPandas()
    assert sorted(table["device_id"]) == sorted(["d0", *(f"d{i}" for i in appended)])
    row = table[table["alert_type"] == "device_silent"].iloc[0]
    assert row["window_end"] == T0 + pd.Timedelta(minutes=20) and row["score"] == 1.0


def test_an_unpartitioned_alerts_table_is_partitioned_once_with_the_same_rows(
    spark: Any, tmp_path: Path
) -> None:
    """A lake an older version made has ``alerts`` unpartitioned: rewritten at start, once."""
    path = str(tmp_path / "alerts")
    ensure_table(spark, path, c.ALERTS_COLUMNS)
    rows = pd.concat(
        [
            as_written(alerts(("d1", 0.5, "40 events")), 1, NOW),
            as_written(alerts_of("device_silent", ("d2", 0.9, "silent")), 2, NOW),
        ]
    )
    append(to_spark(spark, rows), path, rows=2)
    before = spark.read.format("delta").load(path).toPandas()

    def partitioning() -> list[str]:
        return list(DeltaTable.forPath(spark, path).detail().first()["partitionColumns"])

    def versions() -> int:
        return DeltaTable.forPath(spark, path).history().count()

    assert partitioning() == []
    ensure_table(spark, path, c.ALERTS_COLUMNS, c.ALERTS_PARTITIONED_BY)
    assert partitioning() == ["alert_type"]
    after = spark.read.format("delta").load(path).toPandas()
    assert list(after.columns) == list(before.columns)
    by_id = ["alert_id"]
    assert_frame_equal(after[TABLE_COLUMNS].sort_values(by_id).reset_index(drop=True),
                       before[TABLE_COLUMNS].sort_values(by_id).reset_index(drop=True))  # fmt: skip
    done = versions()
    ensure_table(spark, path, c.ALERTS_COLUMNS, c.ALERTS_PARTITIONED_BY)
    assert versions() == done
