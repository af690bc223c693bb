"""The demo's progress line: row counts from the Delta log, alerts by type, before and after the
tables exist (real Delta tables written with deltalake)."""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from infra import lake
from iotfraud.demo import alert_latency, progress_line, row_count


def test_progress_counts_rows_of_every_commit_and_alerts_by_type(tmp_path: Path) -> None:
    root = str(tmp_path)
    assert progress_line(root) == "telemetry 0 | quarantine 0 | alerts 0"

    telemetry = lake.table_path(root, lake.TELEMETRY)
    for first in range(0, 2500, 1000):  # three commits: 1,000 + 1,000 + 500 rows
        ids = [f"e{i}" for i in range(first, min(first + 1000, 2500))]
        write_deltalake(telemetry, pa.table({"event_id": ids}), mode="append")
    write_deltalake(lake.table_path(root, lake.QUARANTINE), pa.table({"reason": ["bad_json"] * 7}))
    types = ["flood"] * 3 + ["rogue_device"]
    write_deltalake(lake.table_path(root, lake.ALERTS), pa.table({"alert_type": types}))

    assert row_count(root, lake.TELEMETRY) == 2500
    assert progress_line(root) == (
        "telemetry 2,500 | quarantine 7 | alerts 4 (flood 3, rogue_device 1)"
    )


def test_a_rows_first_commit_time_survives_the_rewrites_of_later_commits(tmp_path: Path) -> None:
    from deltalake import DeltaTable

    root = str(tmp_path)
    path = lake.table_path(root, lake.ALERTS)
    write_deltalake(path, pa.table({"alert_id": ["a", "b"], "score": [1.0, 2.0]}))
    write_deltalake(path, pa.table({"alert_id": ["c"], "score": [3.0]}), mode="append")
    # A MERGE rewrites the file holding "a" and adds "d": a new file holds "a", "b" and "d".
    (
        DeltaTable(path)
        .merge(pa.table({"alert_id": ["a", "d"], "score": [9.0, 4.0]}),
               "t.alert_id = s.alert_id", source_alias="s", target_alias="t")
        .when_matched_update_all().when_not_matched_insert_all().execute()
    )  # fmt: skip
    stamps = {e["version"]: e["timestamp"] for e in DeltaTable(path).history()}
    at = {v: datetime.fromtimestamp(ms / 1000, tz=timezone.utc) for v, ms in stamps.items()}
    assert stamps[0] < stamps[1] < stamps[2]
    assert lake.first_commit_times(root, lake.ALERTS, "alert_id") == {
        "a": at[0],
        "b": at[0],
        "c": at[1],
        "d": at[2],
    }
    assert lake.first_commit_times(root, lake.TELEMETRY, "event_id") == {}  # no such table


def test_alert_latency_counts_from_the_messages_in_the_batch_that_raised_the_alert_to_its_commit(
    tmp_path: Path,
) -> None:
    from deltalake import DeltaTable

    # Messages a minute old; the alert raised (detected_at) 17 s after the first of them, its
    # commit (the Delta write below) now: the latency runs to the commit, not to detected_at.
    root = str(tmp_path / "lake")
    t0 = datetime.now(timezone.utc).replace(microsecond=0) - timedelta(seconds=60)
    offsets = tmp_path / "cp" / "detection" / "offsets"
    offsets.mkdir(parents=True)
    # Batch 0 read offsets 0-9 of partition 0, batch 1 offsets 10-19; a Delta source beside.
    for batch, end in ((0, 10), (1, 20)):
        (offsets / str(batch)).write_text(
            'v1\n{"batchWatermarkMs":0}\n'
            f'{{"iot.telemetry":{{"0":{end}}}}}\n{{"sourceVersion":1,"reservoirVersion":3}}\n'
        )
    rows = [{"device_id": "d1", "kafka_topic": "iot.telemetry", "kafka_partition": 0,
             "kafka_offset": o, "kafka_timestamp": t0 + timedelta(seconds=o),
             "ingest_time": t0 + timedelta(seconds=o + 30)} for o in (3, 12, 15)]  # fmt: skip
    write_deltalake(lake.table_path(root, lake.TELEMETRY), pa.Table.from_pylist(rows))
    alert = {"alert_id": "x", "device_id": "d1", "detected_at": t0 + timedelta(seconds=17),
             "batch_id": 1, "alert_type": "flood"}  # fmt: skip
    path = lake.table_path(root, lake.ALERTS)
    write_deltalake(path, pa.Table.from_pylist([alert]))
    committed = DeltaTable(path).history()[0]["timestamp"] / 1000 - t0.timestamp()
    # Batch 1 holds the device's messages at offsets 12 and 15: from the newest, and the first.
    latency = alert_latency(root, str(tmp_path / "cp"))
    assert latency is not None and committed > 59
    assert (latency.p50, latency.p95) == pytest.approx((committed - 15, committed - 15))
    assert (latency.first_p50, latency.first_p95) == pytest.approx((committed - 12, committed - 12))
    # Without the checkpoint, the device's newest message telemetry held when the alert was
    # raised: ingest wrote all three 30 s late, after detected_at, so nothing to measure from.
    assert alert_latency(root) is None
    # Raised later, at 00:44: telemetry then held the messages at 3 and 12 (ingested at 00:33 and
    # 00:42); the newest, 12, counts.
    later = {**alert, "detected_at": t0 + timedelta(seconds=44)}
    write_deltalake(path, pa.Table.from_pylist([later]), mode="overwrite")
    by_telemetry = alert_latency(root)
    assert by_telemetry is not None and by_telemetry.first_p50 is None
    # The overwrite commits "x" again; its first commit counts.
    assert by_telemetry.p50 == pytest.approx(committed - 12)


def test_the_demo_reads_for_silences_at_the_simulated_clocks_pace(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from iotfraud.demo import pipeline_timing

    key = "IOT_PIPELINE_SILENCE_TRIGGER_INTERVAL"  # the variable a user sets
    monkeypatch.delenv(key, raising=False)
    # The default (1 minute) in simulated time: 4 s of wall clock at 15x, every second at most.
    assert pipeline_timing(15) == {key: "4 seconds"}
    assert pipeline_timing(600) == {key: "1 seconds"}
    assert pipeline_timing(0) == {key: "1 seconds"}  # as fast as it can
    assert pipeline_timing(1) == {}  # real time: the pipeline's own default
    monkeypatch.setenv(key, "30 seconds")  # what the user set stays
    assert pipeline_timing(15) == {}


def test_the_demo_waits_for_the_pipeline_and_says_why_it_stops(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import sys
    import threading

    from infra.processes import Children
    from iotfraud.demo import wait_until_ready

    ready = tmp_path / "pipeline.ready"
    children, stop = Children(), threading.Event()
    try:
        # A pipeline that starts: the wait ends when its file appears, and says after how long.
        starts = f"import time, pathlib; time.sleep(1.5); pathlib.Path({str(ready)!r}).touch()"
        children.start("pipeline", [sys.executable, "-c", starts])
        assert wait_until_ready(ready, children, stop, timeout_s=30)
        said = capsys.readouterr().out
        assert re.search(r"pipeline running after [1-9]\d* s; starting the simulator", said), said
        children.stop()

        # A pipeline that fails at start: the demo stops and names it, without waiting it out.
        ready.unlink()
        failing = Children()
        failing.start("pipeline", [sys.executable, "-c", "import sys; sys.exit(3)"])
        assert not wait_until_ready(ready, failing, stop, timeout_s=30)
        assert "demo stopped: pipeline exited with 3" in capsys.readouterr().err

        # One that never gets there: bounded.
        slow = Children()
        slow.start("pipeline", [sys.executable, "-c", "import time; time.sleep(30)"])
        try:
            assert not wait_until_ready(ready, slow, stop, timeout_s=2)
            assert "the pipeline did not start in 2 s" in capsys.readouterr().err
        finally:
            slow.stop(timeout_s=5)
    finally:
        children.stop(timeout_s=5)
