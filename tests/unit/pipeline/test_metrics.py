"""A query's progress as a ``pipeline_metrics`` row (pure)."""

from __future__ import annotations

from datetime import datetime, timezone

from pipeline.metrics import progress_row

PROGRESS = {"name": "features", "runId": "r1", "batchId": 3,
            "timestamp": "2026-11-25T08:00:05.000Z", "numInputRows": 10}  # fmt: skip


def test_no_watermark_yet_is_missing_not_the_epoch() -> None:
    before = progress_row({**PROGRESS, "eventTime": {"watermark": "1970-01-01T00:00:00.000Z"}})
    assert before["watermark"] is None
    after = progress_row({**PROGRESS, "eventTime": {"watermark": "2026-11-25T07:58:00.000Z"}})
    assert after["watermark"] == datetime(2026, 11, 25, 7, 58, tzinfo=timezone.utc)
    assert progress_row(PROGRESS)["watermark"] is None
