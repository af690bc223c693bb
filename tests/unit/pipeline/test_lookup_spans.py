"""The event-time ranges ingest reads from ``telemetry`` to recognise copies of a batch's events."""

from __future__ import annotations

from datetime import datetime, timezone

from pipeline.ingest import lookup_spans

MINUTE = 60_000_000


def at(hh_mm: str) -> int:
    moment = datetime.strptime(f"2026-11-24 {hh_mm}", "%Y-%m-%d %H:%M").replace(tzinfo=timezone.utc)
    return int(moment.timestamp()) * 1_000_000


def test_adjacent_minutes_become_one_range_and_gaps_stay_out() -> None:
    minutes = [at("10:02"), at("10:00"), at("10:01"), at("10:07"), at("10:01")]
    assert lookup_spans(minutes) == [(at("10:00"), at("10:03")), (at("10:07"), at("10:08"))]


def test_a_live_batch_reads_its_minute_only() -> None:
    assert lookup_spans([at("23:59")]) == [(at("23:59"), at("23:59") + MINUTE)]


def test_a_backfill_with_scattered_minutes_is_one_range() -> None:
    minutes = [at("10:00") + 2 * i * MINUTE for i in range(40)]  # 40 separate minutes
    assert lookup_spans(minutes, max_spans=32) == [(minutes[0], minutes[-1] + MINUTE)]
    assert len(lookup_spans(minutes[:32], max_spans=32)) == 32
