"""The simulator on the real Kafka broker: delivery, partitions, rate, SIGTERM, replay."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from confluent_kafka import Consumer
from deltalake import DeltaTable

from infra import lake as lk
from simulator.cli import main
from simulator.producer import run_simulation
from simulator.registry import build_registry, read_registry
from simulator.settings import SimulatorSettings
from simulator.telemetry import Simulation

pytestmark = pytest.mark.integration

START = datetime(2026, 1, 5, 8, 0, tzinfo=timezone.utc)


def consume(
    bootstrap: str, topic: str, expected: int, timeout_s: float = 60
) -> list[tuple[bytes, bytes, int, int]]:
    """(key, value, partition, timestamp ms) of every message, until ``expected`` and idle."""
    consumer = Consumer({
        "bootstrap.servers": bootstrap,
        "group.id": f"check-{uuid.uuid4().hex[:8]}",
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
    })  # fmt: skip
    consumer.subscribe([topic])
    out: list[tuple[bytes, bytes, int, int]] = []
    deadline = time.monotonic() + timeout_s
    idle_since = time.monotonic()
    try:
        while time.monotonic() < deadline:
            batch = consumer.consume(num_messages=5000, timeout=0.5)
            if not batch:
                if len(out) >= expected and time.monotonic() - idle_since > 2:
                    break
                continue
            idle_since = time.monotonic()
            for msg in batch:
                assert msg.error() is None, msg.error()
                key, value, partition = msg.key(), msg.value(), msg.partition()
                assert key is not None and value is not None and partition is not None
                out.append((key, value, partition, msg.timestamp()[1]))
    finally:
        consumer.close()
    return out


def settings_for(bootstrap: str, topic: str, lake: str, **extra: object) -> SimulatorSettings:
    return SimulatorSettings(
        bootstrap_servers=bootstrap,
        topic=topic,
        lake_root=lake,
        devices=300,
        seed=21,
        start_time=START,
        run_id="it-run",
        progress_interval_s=0.5,
        **extra,  # type: ignore[arg-type]
    )


def test_all_produced_events_arrive_keyed_and_partitioned(
    bootstrap: str, make_topic: Callable[..., str], lake: str
) -> None:
    topic = make_topic(partitions=3)
    settings = settings_for(bootstrap, topic, lake, accelerate=0, count=6000, scenario_rate=400)
    registry = build_registry(300, seed=21)
    stats = run_simulation(settings, Simulation(settings, registry))
    assert (stats.sent, stats.failures, stats.delivered) == (6000, 0, 6000)

    messages = consume(bootstrap, topic, 6000)
    assert len(messages) == 6000
    expected = Simulation(settings, registry)
    sent: list[tuple[bytes, bytes]] = []
    for batch in expected.batches(count=6000, slice_s=expected.default_slice_s()):
        sent.extend(zip(batch.keys, batch.values, strict=True))
    assert sorted((k, v) for k, v, _p, _t in messages) == sorted(sent)
    partitions_of_key: dict[bytes, set[int]] = defaultdict(set)
    for key, _value, partition, _ts in messages:
        partitions_of_key[key].add(partition)
    assert all(len(p) == 1 for p in partitions_of_key.values())
    assert {p for ps in partitions_of_key.values() for p in ps} == {0, 1, 2}

    truth = DeltaTable(lk.table_path(lake, lk.GROUND_TRUTH)).to_pyarrow_table().to_pylist()
    assert len(truth) == stats.injections > 0
    assert {r["run_id"] for r in truth} == {"it-run"}
    keys = {k.decode() for k in partitions_of_key}
    assert expected.cut_at is not None
    cut = START + timedelta(seconds=expected.cut_at)
    # A device reports within 30 s, so an injection that began earlier has sent something.
    settled = [r for r in truth if r["start_time"] < cut - timedelta(seconds=30)]
    assert settled and all(r["device_id"] in keys for r in settled)
    assert sorted(truth, key=lambda r: r["scenario_id"]) == sorted(
        (r.as_dict() for r in expected.finish(expected.cut_at)), key=lambda r: r["scenario_id"]
    )


def test_rate_control_holds_the_target(
    bootstrap: str, make_topic: Callable[..., str], lake: str
) -> None:
    topic = make_topic(partitions=3)
    settings = settings_for(bootstrap, topic, lake, rate=2000, duration=4.0, scenarios=[])
    stats = run_simulation(settings, Simulation(settings, build_registry(300, seed=21)))
    assert stats.failures == 0 and stats.stopped_by == "duration"
    assert stats.rate == pytest.approx(2000, rel=0.05)
    messages = consume(bootstrap, topic, stats.sent)
    assert len(messages) == stats.sent
    stamps = sorted(ts for _k, _v, _p, ts in messages)
    observed = (len(stamps) - 1) / ((stamps[-1] - stamps[0]) / 1000)
    assert observed == pytest.approx(2000, rel=0.05)


def test_sigterm_flushes_and_exits_zero(
    bootstrap: str, make_topic: Callable[..., str], lake: str, tmp_path: Path
) -> None:
    topic = make_topic(partitions=3)
    env = {
        **os.environ,
        "KAFKA_BOOTSTRAP_SERVERS": bootstrap,
        "IOT_TOPIC": topic,
        "IOT_LAKE_ROOT": lake,
        "IOT_SIM_DEVICES": "200",
        "IOT_SIM_PROGRESS_INTERVAL_S": "0.3",
    }
    err = (tmp_path / "stderr.txt").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "simulator", "simulate", "--rate", "3000", "--scenario-rate", "100"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=err,
    )
    try:
        deadline = time.monotonic() + 60
        while b"msg/s" not in (tmp_path / "stderr.txt").read_bytes():
            assert proc.poll() is None, (tmp_path / "stderr.txt").read_text()
            assert time.monotonic() < deadline, "no progress line"
            time.sleep(0.2)
        time.sleep(1.0)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        err.close()
    assert proc.returncode == 0, (tmp_path / "stderr.txt").read_text()
    final = out.decode().strip().splitlines()[-1]
    assert "stopped by signal" in final and "failures 0" in final
    sent = int(final.split("|")[0].split()[1].replace(",", ""))
    assert sent > 1000
    assert f"delivered {sent:,}" in final
    assert len(consume(bootstrap, topic, sent)) == sent
    assert read_registry(lake) is not None  # created on first use
    assert DeltaTable(lk.table_path(lake, lk.GROUND_TRUTH)).to_pyarrow_table().num_rows > 0


def test_replay_json_lines_and_csv(
    bootstrap: str,
    make_topic: Callable[..., str],
    lake: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    topic = make_topic(partitions=2)
    jsonl = tmp_path / "recorded.jsonl"
    rows = [
        {"device_id": "home-1", "event_time": f"2026-01-05T10:00:{s:02d}Z", "seq": s,
         "firmware": "fw-1", "lat": 48.1, "lon": 11.5,
         "metrics": {"temperature_c": 20 + s / 10, "humidity_pct": 40}}
        for s in range(0, 50, 10)
    ]  # fmt: skip
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows))
    common = ["--topic", topic, "--bootstrap-servers", bootstrap, "--lake-root", lake]
    assert main(["replay", str(jsonl), *common, "--register"]) == 0
    assert "replayed 5 events" in capsys.readouterr().out

    csv_file = tmp_path / "recorded.csv"
    csv_file.write_text(
        "meter,ts,v,a,w\n"
        "mx-9,2026-01-05T10:00:00Z,230,5,1100\n"
        "mx-9,2026-01-05T10:00:15Z,231,5.1,1120\n"
        "mx-9,yesterday,231,5.1,1120\n"
    )
    mapping = "device_id=meter,event_time=ts,voltage_v=v,current_a=a,power_w=w"
    started = time.monotonic()
    code = main(["replay", str(csv_file), *common, "--map", mapping, "--speed", "10"])
    assert time.monotonic() - started >= 1.4  # 15 s of event time at 10x
    captured = capsys.readouterr()
    assert code == 1  # a row could not be mapped: reported, not dropped silently
    assert "replayed 2 events" in captured.out and "rejected 1 rows" in captured.out
    assert "line 4" in captured.err and "yesterday" in captured.err

    messages = consume(bootstrap, topic, 7)
    assert len(messages) == 7
    events = [json.loads(v) for _k, v, _p, _t in messages]
    assert all(k.decode() == e["device_id"] for (k, _v, _p, _t), e in zip(messages, events,
                                                                         strict=True))  # fmt: skip
    home = sorted((e for e in events if e["device_id"] == "home-1"), key=lambda e: e["seq"])
    assert [e["metrics"]["temperature_c"] for e in home] == [20.0, 21.0, 22.0, 23.0, 24.0]
    meter = [e for e in events if e["device_id"] == "mx-9"]
    assert [e["metrics"]["power_w"] for e in meter] == [1100.0, 1120.0]
    assert [e["seq"] for e in meter] == [1, 2]
    registered = read_registry(lake)
    assert registered is not None
    assert registered.column("device_id").to_pylist() == ["home-1"]
    assert registered.column("device_type").to_pylist() == ["thermostat"]


def test_stop_event_ends_a_run_cleanly(
    bootstrap: str, make_topic: Callable[..., str], lake: str
) -> None:
    topic = make_topic(partitions=1)
    settings = settings_for(bootstrap, topic, lake, accelerate=60.0)
    stop = threading.Event()
    threading.Timer(1.5, stop.set).start()
    stats = run_simulation(settings, Simulation(settings, build_registry(300, seed=21)), stop=stop)
    assert stats.stopped_by == "signal" and stats.failures == 0
    # 60x real time: about 90 simulated seconds of a fleet reporting every 10-30 s.
    assert 300 < stats.sent < 3000
    assert len(consume(bootstrap, topic, stats.sent)) == stats.sent
