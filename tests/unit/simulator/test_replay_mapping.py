"""Replay: mapping JSON lines and CSV rows to the contract; unmappable rows are reported."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from infra import contract as c
from simulator.replay import parse_mapping, replay


def test_csv_with_a_column_mapping(tmp_path: Path) -> None:
    path = tmp_path / "rec.csv"
    path.write_text(
        "dev,ts,temp,volts,amps\n"
        "m1,2026-01-05T10:00:00Z,21.5,230.1,4.2\n"
        "m1,1767607210,21.6,229.9,4.1\n"
        "m2,2026-01-05 10:00:20,,231,5\n"
        ",2026-01-05T10:00:30Z,1,1,1\n"
        "m3,not a time,1,1,1\n"
        "m1,2026-01-05T10:00:40Z,hot,1,1\n"
    )
    sent: list[tuple[bytes, bytes]] = []
    mapping = parse_mapping(["device_id=dev,event_time=ts", "temperature_c=temp,voltage_v=volts",
                             "current_a=amps"])  # fmt: skip
    report = replay(path, lambda k, v: sent.append((k, v)), mapping=mapping)
    assert report.sent == 3 and report.rejected == 3
    assert [e.line for e in report.examples] == [5, 6, 7]
    assert "device_id" in report.examples[0].reason
    assert "event_time" in report.examples[1].reason
    assert "temperature_c" in report.examples[2].reason
    events = [json.loads(v) for _k, v in sent]
    assert [k.decode() for k, _v in sent] == ["m1", "m1", "m2"]
    assert [e["seq"] for e in events] == [1, 2, 1]
    assert [e["event_time"] for e in events] == [
        "2026-01-05T10:00:00.000Z", "2026-01-05T10:00:10.000Z", "2026-01-05T10:00:20.000Z",
    ]  # fmt: skip
    assert events[0]["metrics"]["voltage_v"] == 230.1
    assert events[2]["metrics"]["temperature_c"] is None
    assert set(events[0]) == {n for n, _ in c.EVENT_FIELDS}


def test_json_lines_flat_or_nested_keep_ids(tmp_path: Path) -> None:
    path = tmp_path / "rec.jsonl"
    lines = [
        {"event_id": "e1", "device_id": "t1", "event_time": "2026-01-05T10:00:00+00:00",
         "seq": 7, "metrics": {"battery_pct": 80}},
        {"device_id": "t1", "event_time": 1767607205000, "battery_pct": 79.5, "lat": 1, "lon": 2},
    ]  # fmt: skip
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\nnot json\n[1, 2]\n")
    sent: list[bytes] = []
    report = replay(path, lambda _k, v: sent.append(v))
    assert report.sent == 2 and report.rejected == 2
    first, second = (json.loads(v) for v in sent)
    assert first["event_id"] == "e1" and first["seq"] == 7
    assert first["metrics"]["battery_pct"] == 80
    assert second["seq"] == 8 and second["metrics"]["battery_pct"] == 79.5
    assert second["event_time"] == "2026-01-05T10:00:05.000Z"
    again: list[bytes] = []
    replay(path, lambda _k, v: again.append(v))
    assert json.loads(again[1])["event_id"] == second["event_id"]  # deterministic ids


def test_speed_factor_sleeps_the_event_time_gaps(tmp_path: Path) -> None:
    path = tmp_path / "rec.jsonl"
    path.write_text("".join(
        json.dumps({"device_id": "a", "event_time": f"2026-01-05T10:00:{s:02d}Z"}) + "\n"
        for s in (0, 10, 30)
    ))  # fmt: skip
    now = [0.0]
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += seconds

    replay(path, lambda _k, _v: None, speed=10.0, sleep=sleep, clock=lambda: now[0])
    assert slept == pytest.approx([1.0, 2.0])


def test_bad_mapping_is_refused() -> None:
    with pytest.raises(ValueError, match="not a contract field"):
        parse_mapping(["colour=c"])
    with pytest.raises(ValueError, match="field=column"):
        parse_mapping(["device_id"])
