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
from iotfraud.demo import (
    alert_latency,
    batch_offsets,
    progress_line,
    row_count,
    unscored_injections,
)


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


def test_the_injections_left_out_of_the_detection_table_are_named(tmp_path: Path) -> None:
    """The simulator counts every injection; the table scores the fraud scenarios only. The
    demo names the others, so that the two counts add up."""
    root = str(tmp_path)
    assert unscored_injections(root) is None  # nothing injected yet
    truth = lake.table_path(root, lake.GROUND_TRUTH)
    write_deltalake(truth, pa.table({"scenario": ["spike", "replay"]}))
    assert unscored_injections(root) is None
    scenarios = ["malformed", "clock_skew", "malformed", "silence"]
    write_deltalake(truth, pa.table({"scenario": scenarios}), mode="append")
    assert unscored_injections(root) == (
        "not in the table (they test robustness, not detection): clock_skew 1, malformed 2; "
        "6 injections in all"
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
    # Batch 0 read offsets 0-9 of partition 0, batch 1 offsets 10-19 (as pipeline_metrics holds
    # them; another query's batch 1 beside, which read more).
    metrics = [{"query_name": q, "batch_id": b,
                "kafka_end_offsets": f'{{"iot.telemetry": {{"0": {e}}}}}'}
               for q, b, e in (("detection", 0, 10), ("detection", 1, 20),
                               ("ingest", 1, 30))]  # fmt: skip
    write_deltalake(lake.table_path(root, lake.PIPELINE_METRICS), pa.Table.from_pylist(metrics))
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
    latency = alert_latency(root)
    assert latency is not None and committed > 59
    assert (latency.p50, latency.p95) == pytest.approx((committed - 15, committed - 15))
    assert (latency.first_p50, latency.first_p95) == pytest.approx((committed - 12, committed - 12))
    # Not by batch: the device's newest message telemetry held when the alert was raised:
    # ingest wrote all three 30 s late, after detected_at, so nothing to measure from.
    assert alert_latency(root, by_batch=False) is None
    # Raised later, at 00:44: telemetry then held the messages at 3 and 12 (ingested at 00:33 and
    # 00:42); the newest, 12, counts.
    later = {**alert, "detected_at": t0 + timedelta(seconds=44)}
    write_deltalake(path, pa.Table.from_pylist([later]), mode="overwrite")
    by_telemetry = alert_latency(root, by_batch=False)
    assert by_telemetry is not None and by_telemetry.first_p50 is None
    # The overwrite commits "x" again; its first commit counts.
    assert by_telemetry.p50 == pytest.approx(committed - 12)


@pytest.mark.parametrize("other", ["late_burst", "device_silent", "firmware_tamper"])
def test_alert_latency_leaves_out_alerts_whose_batch_id_is_another_querys(
    tmp_path: Path, other: str
) -> None:
    # The silence and firmware queries number their own batches: their batch 1 is not
    # detection's batch 1, though the device sent in that one (offset 12).
    root = str(tmp_path / "lake")
    t0 = datetime.now(timezone.utc).replace(microsecond=0) - timedelta(seconds=60)
    metrics = [{"query_name": "detection", "batch_id": b,
                "kafka_end_offsets": f'{{"iot.telemetry": {{"0": {e}}}}}'}
               for b, e in ((0, 10), (1, 20))]  # fmt: skip
    write_deltalake(lake.table_path(root, lake.PIPELINE_METRICS), pa.Table.from_pylist(metrics))
    rows = [{"device_id": d, "kafka_topic": "iot.telemetry", "kafka_partition": 0,
             "kafka_offset": o, "kafka_timestamp": t0 + timedelta(seconds=o),
             "ingest_time": t0 + timedelta(seconds=o + 1)}
            for d, o in (("d1", 12), ("d2", 15))]  # fmt: skip
    write_deltalake(lake.table_path(root, lake.TELEMETRY), pa.Table.from_pylist(rows))
    alerts = [{"alert_id": i, "device_id": d, "detected_at": t0 + timedelta(seconds=16),
               "batch_id": 1, "alert_type": kind}
              for i, d, kind in (("x", "d2", "flood"), ("y", "d1", other))]  # fmt: skip
    write_deltalake(lake.table_path(root, lake.ALERTS), pa.Table.from_pylist(alerts))

    latency = alert_latency(root)

    # Only the flood alert is measured: from d2's message at offset 15.
    assert latency is not None
    assert latency.p50 == pytest.approx(latency.p95)
    assert latency.first_p50 == pytest.approx(latency.p50)
    committed = lake.first_commit_times(root, lake.ALERTS, "alert_id")["x"]
    assert latency.p50 == pytest.approx(committed.timestamp() - (t0.timestamp() + 15))


def test_the_demo_reads_for_silences_at_the_simulated_clocks_pace_not_more_often_than_20_s(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from iotfraud.demo import pipeline_timing

    key = "IOT_PIPELINE_SILENCE_TRIGGER_INTERVAL"  # the variable a user sets
    monkeypatch.delenv(key, raising=False)
    # The default (1 minute) in simulated time, but no more often than every 20 s of wall
    # clock: a simulated minute is 4 s at 15x, where the query ran back to back.
    assert pipeline_timing(15) == {key: "20 seconds"}
    assert pipeline_timing(2) == {key: "30 seconds"}
    assert pipeline_timing(600) == {key: "20 seconds"}
    assert pipeline_timing(0) == {key: "20 seconds"}  # as fast as it can
    assert pipeline_timing(0.5) == {key: "120 seconds"}  # slow motion: still a simulated minute
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


def test_a_batch_read_from_its_previous_batchs_end_and_one_without_a_previous_is_left_out(
    tmp_path: Path,
) -> None:
    """The checkpoint keeps the last 20 batches' offsets; the first of those read from its
    predecessor's end, not from offset 0 (which made a batch span the whole topic and the demo
    print a wait of 132 s from the first message)."""
    root = str(tmp_path)
    ends = {0: (5, 7), 1: (9, 8), 2: (12, 8), 4: (20, 10), 5: (25, 11)}  # batch 3's row lost
    metrics = [{"query_name": "detection", "batch_id": b,
                "kafka_end_offsets": f'{{"t": {{"0": {p0}, "1": {p1}}}}}'}
               for b, (p0, p1) in ends.items()]  # fmt: skip
    metrics.append(dict(metrics[2]))  # batch 2 replayed after a crash: the same offsets again
    metrics.append({"query_name": "fast_log", "batch_id": 3, "kafka_end_offsets": None})
    write_deltalake(lake.table_path(root, lake.PIPELINE_METRICS), pa.Table.from_pylist(metrics))
    got = batch_offsets(root).sort_values(["batch_id", "kafka_partition"])
    assert got.values.tolist() == [
        [0, "t", 0, 0, 5], [0, "t", 1, 0, 7],
        [1, "t", 0, 5, 9], [1, "t", 1, 7, 8],
        [2, "t", 0, 9, 12], [2, "t", 1, 8, 8],
        [5, "t", 0, 20, 25], [5, "t", 1, 10, 11],
    ]  # fmt: skip


def test_the_demos_drain_asks_the_pipeline_to_catch_up_and_is_bounded(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import subprocess
    import sys
    import time

    from iotfraud.demo import drain

    def pipeline(on_usr1: str) -> subprocess.Popen[bytes]:
        """A stand-in that says when it is ready, then does ``on_usr1`` on SIGUSR1."""
        code = ("import signal, sys, time\n"
                f"signal.signal(signal.SIGUSR1, lambda *_: {on_usr1})\n"
                "print('ready', flush=True)\n"
                "time.sleep(60)\n")  # fmt: skip
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
        return proc

    lake = str(tmp_path / "lake")
    # Caught up: it exits at once, and so does the wait.
    caught_up = pipeline("sys.exit(0)")
    started = time.monotonic()
    drain(caught_up, lake, timeout_s=30)
    assert caught_up.returncode == 0 and time.monotonic() - started < 10
    said = capsys.readouterr()
    assert "finishing what the simulator sent" in said.out and said.err == ""

    # Failing while it finishes: said, with where to look.
    failing = pipeline("sys.exit(3)")
    drain(failing, lake, timeout_s=30)
    assert "the pipeline exited with 3 while finishing" in capsys.readouterr().err

    # Never done: the wait ends at its bound and says so (the stop that follows ends it).
    stuck = pipeline("None")
    try:
        drain(stuck, lake, timeout_s=2)
        assert stuck.poll() is None
        assert "had not caught up after 2 s" in capsys.readouterr().err
    finally:
        stuck.kill()
        stuck.wait()
