"""The fast path as ``iotfraud pipeline run`` starts it: per-event alerts on the alerts topic, with
the ids the windowed path writes to the ``alerts`` table, recorded in ``fast_alerts``; events
sent while the pipeline is down are alerted once it is back."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from infra import contract as c
from infra import lake as lake_tables
from pipeline.publish import FAST, PATH, read_alert_message
from tests.pipeline_helpers import (
    device_series,
    encoded,
    latest_alerts,
    produce,
    table_alerts,
    topic_messages,
    write_registry,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def fast_messages(bootstrap: str, topic: str) -> list[tuple[dict[str, Any], datetime]]:
    """The fast path's messages on ``topic``: (message, its Kafka timestamp)."""
    found = []
    for message in topic_messages(bootstrap, topic):
        record = read_alert_message(message.value())
        if record[PATH] == FAST:
            assert message.key().decode() == record["device_id"]
            stamp = datetime.fromtimestamp(message.timestamp()[1] / 1000, timezone.utc)
            found.append((record, stamp))
    return found


def fast_table(lake: str) -> list[dict[str, Any]]:
    from deltalake import DeltaTable

    rows = DeltaTable(lake_tables.table_path(lake, lake_tables.FAST_ALERTS)).to_pyarrow_table()
    return rows.to_pylist()


def wait_for(check: Callable[[], bool], what: str, proc: subprocess.Popen[bytes], log: Path,
             timeout_s: float) -> None:  # fmt: skip
    deadline = time.monotonic() + timeout_s
    while not check():
        assert proc.poll() is None, f"pipeline exited: {log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"{what}; pipeline log: {log.read_text()[-3000:]}"
        time.sleep(1)


def slide_start(at: datetime, slide_s: int = 300) -> datetime:
    return datetime.fromtimestamp(int(at.timestamp()) // slide_s * slide_s, timezone.utc)


def test_per_event_alerts_reach_the_topic_with_the_windowed_ids(
    bootstrap: str, make_topic: Callable[..., str], tmp_path: Path
) -> None:
    topic, alerts_topic = make_topic(partitions=2), f"alerts.{uuid.uuid4().hex[:10]}"
    lake = str(tmp_path / "lake")
    write_registry(lake, ["good", "flashed"])  # both expect firmware 1.0.0
    env = {
        **os.environ,
        "KAFKA_BOOTSTRAP_SERVERS": bootstrap,
        "IOT_TOPIC": topic,
        "IOT_FIRMWARE_TOPIC": "",
        "IOT_LAKE_ROOT": lake,
        "IOT_PIPELINE_CHECKPOINT_ROOT": str(tmp_path / "cp"),
        "IOT_PIPELINE_ALERTS_TOPIC": alerts_topic,
        "IOT_PIPELINE_FAST_PATH_LOG_INTERVAL": "2 seconds",
        # No commit of the fast path's offsets within the test: a restart replays all it read.
        "IOT_PIPELINE_FAST_PATH_CHECKPOINT_INTERVAL": "30 minutes",
        "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'none.db'}",
        "IOT_SPARK_MASTER": "local[2]",  # the pipeline adds a slot per partition for the fast path
        "IOT_SPARK_DRIVER_MEMORY": "1g",
    }
    log = tmp_path / "pipeline.log"

    def start() -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [sys.executable, "-m", "pipeline", "run"], env=env, stdout=log.open("ab"),
            stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip

    def stop(proc: subprocess.Popen[bytes]) -> None:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=90)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)

    # All events in one slide, so both windows holding them hold all of them (6 >= 3, the
    # windowed rules' minimum): the windowed path raises each alert the fast path raises.
    base = slide_start(datetime.now(timezone.utc)) + timedelta(seconds=1)
    rogue = device_series("rogue", base, 6, every_s=1)
    flashed = device_series("flashed", base, 6, every_s=1, firmware="6.6.6")
    good = device_series("good", base, 9, every_s=1)
    good[1]["metrics"]["voltage_v"] = -5000.0  # impossible: quarantined, the device flagged
    for i, e in enumerate(good[6:]):  # a clock 2 hours ahead: counted when sent, 3 together
        e["event_time"] = (base + timedelta(hours=2, seconds=i)).isoformat().replace("+00:00", "Z")
    offending = {e["event_id"] for e in rogue + flashed + good[1:2] + good[6:]}

    proc = start()
    try:
        # The fast path is up once a first rogue event is alerted.
        produce(bootstrap, topic, encoded(rogue[:1]))
        wait_for(lambda: bool(fast_messages(bootstrap, alerts_topic)), "no fast alert",
                 proc, log, timeout_s=240)  # fmt: skip
        produce(bootstrap, topic, encoded(rogue[1:] + flashed + good))

        def every_event_alerted() -> bool:
            seen = {m["event_id"] for m, _ in fast_messages(bootstrap, alerts_topic)}
            return seen == offending

        wait_for(every_event_alerted, "fast alerts missing", proc, log, timeout_s=60)
        messages = fast_messages(bootstrap, alerts_topic)
        # One message per event and window holding it (2), nothing for the good device.
        assert len(messages) == 2 * len(offending)
        by_type = {(m["device_id"], m["alert_type"]) for m, _ in messages}
        assert by_type == {("rogue", "rogue_device"), ("flashed", "firmware_mismatch"),
                           ("good", "impossible_reading"), ("good", "clock_ahead")}  # fmt: skip
        for message, stamp in messages:
            assert message["kafka_timestamp"] <= stamp  # published after its event was sent
        fast_ids = {m["alert_id"] for m, _ in messages}
        assert len(fast_ids) == 8  # 4 alert types x 2 windows

        # The windowed path raises the same alerts, with the same ids, in the table; and its
        # messages stay the table's rows.
        def windowed_ids() -> set[str]:
            rows = table_alerts(lake).items()
            return {a for a, row in rows if row["alert_type"] in c.PER_EVENT_ALERT_TYPES}

        wait_for(lambda: windowed_ids() == fast_ids, "the table's per-event alerts differ",
                 proc, log, timeout_s=120)  # fmt: skip
        wait_for(lambda: latest_alerts(bootstrap, alerts_topic) == table_alerts(lake),
                 "the topic's windowed messages differ from the table", proc, log,
                 timeout_s=60)  # fmt: skip

        # fast_alerts holds each fast message once, as the topic has it.
        def logged() -> list[tuple[Any, ...]]:
            return sorted((r["alert_id"], r["event_id"], r["kafka_offset"],
                           r["window_start"].replace(tzinfo=timezone.utc))
                          for r in fast_table(lake))  # fmt: skip

        expected = sorted((m["alert_id"], m["event_id"], m["kafka_offset"], m["window_start"])
                          for m, _ in messages)  # fmt: skip
        wait_for(lambda: logged() == expected, "fast_alerts differs from the topic", proc, log,
                 timeout_s=60)  # fmt: skip
        # Killed (SIGKILL, no clean stop); events sent while it is down are alerted once it
        # is back, and what the fast path read since its last commit (none: the interval is
        # 30 minutes) is read and published again: at least once, exactly as documented.
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        late = device_series("rogue", base + timedelta(seconds=10), 3, every_s=1)
        produce(bootstrap, topic, encoded(late))
        proc = start()
        wanted = offending | {e["event_id"] for e in late}

        def copies() -> dict[tuple[str, datetime], int]:
            found: dict[tuple[str, datetime], int] = {}
            for m, _ in fast_messages(bootstrap, alerts_topic):
                key = (m["event_id"], m["window_start"])
                found[key] = found.get(key, 0) + 1
            return found

        wait_for(lambda: wanted <= {event for event, _ in copies()},
                 "events sent while the pipeline was down were not alerted", proc, log,
                 timeout_s=240)  # fmt: skip
        time.sleep(5)  # let any replayed copies arrive
        after_kill = copies()
        expected_copies = {k: 2 if k[0] in offending else 1 for k in after_kill}
        assert after_kill == expected_copies
        assert len(after_kill) == 2 * len(wanted)
        # A clean stop ends the run (a restart after one replays the same way: the README).
        stop(proc)
        assert proc.returncode == 0, log.read_text()[-3000:]
    finally:
        stop(proc)
