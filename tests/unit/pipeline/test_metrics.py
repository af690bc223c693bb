"""A query's progress as a ``pipeline_metrics`` row (pure)."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

from pipeline.metrics import Backlog, kafka_backlog, progress_row, state_summary


def row(progress: dict[str, Any]) -> dict[str, Any]:
    """The row of a query whose store counts its rows (Spark's default)."""
    return progress_row(progress, rocksdb_counts_rows=True)


PROGRESS = {"name": "features", "runId": "r1", "batchId": 3,
            "timestamp": "2026-11-25T08:00:05.000Z", "numInputRows": 10}  # fmt: skip


def test_no_watermark_yet_is_missing_not_the_epoch() -> None:
    before = row({**PROGRESS, "eventTime": {"watermark": "1970-01-01T00:00:00.000Z"}})
    assert before["watermark"] is None
    after = row({**PROGRESS, "eventTime": {"watermark": "2026-11-25T07:58:00.000Z"}})
    assert after["watermark"] == datetime(2026, 11, 25, 7, 58, tzinfo=timezone.utc)
    assert row(PROGRESS)["watermark"] is None


def test_a_batchs_kafka_end_offsets_are_kept_and_other_sources_are_not() -> None:
    kafka = {"description": "KafkaV2[Subscribe[iot.telemetry]]",
             "endOffset": {"iot.telemetry": {"0": 12, "1": 7}}}  # fmt: skip
    delta = {"description": "DeltaSource[quarantine]",
             "endOffset": {"sourceVersion": 1, "reservoirVersion": 3, "index": -1}}  # fmt: skip
    as_text = {"description": "KafkaV2[Subscribe[iot.firmware]]",
               "endOffset": '{"iot.firmware": {"0": 4}}'}  # fmt: skip
    ends = row({**PROGRESS, "sources": [kafka, delta, as_text]})["kafka_end_offsets"]
    assert json.loads(ends) == {
        "iot.telemetry": {"0": 12, "1": 7}, "iot.firmware": {"0": 4}
    }  # fmt: skip
    assert row({**PROGRESS, "sources": [delta]})["kafka_end_offsets"] is None
    assert row(PROGRESS)["kafka_end_offsets"] is None


def test_a_batchs_kafka_backlog_is_what_its_topics_held_beyond_its_start() -> None:
    telemetry = {"description": "KafkaV2[Subscribe[iot.telemetry]]",
                 "startOffset": {"iot.telemetry": {"0": 100, "1": 40}},
                 "endOffset": {"iot.telemetry": {"0": 150, "1": 60}},
                 "latestOffset": {"iot.telemetry": {"0": 180, "1": 60}}}  # fmt: skip
    firmware = {"description": "KafkaV2[Subscribe[iot.firmware]]",
                "startOffset": '{"iot.firmware": {"0": 4}}',
                "latestOffset": '{"iot.firmware": {"0": 9}}'}  # fmt: skip
    delta = {"description": "DeltaSource[quarantine]",
             "startOffset": {"sourceVersion": 1, "reservoirVersion": 2, "index": -1},
             "latestOffset": {"sourceVersion": 1, "reservoirVersion": 3, "index": -1}}  # fmt: skip
    first = {**telemetry, "startOffset": None}  # a query's first batch reports no start

    assert kafka_backlog([telemetry, firmware, delta]) == Backlog(latest=249, waiting=105)
    assert kafka_backlog([telemetry]) == Backlog(latest=240, waiting=100)
    assert kafka_backlog([first]) is None
    assert kafka_backlog([delta]) is None
    assert kafka_backlog([]) is None


def test_the_debug_log_says_where_each_state_operator_spent_its_time() -> None:
    dedup = {"operatorName": "dedupe", "numRowsTotal": 1500000, "numRowsUpdated": 100000,
             "numRowsRemoved": 98000, "allUpdatesTimeMs": 900, "allRemovalsTimeMs": 2100,
             "commitTimeMs": 40}  # fmt: skip
    windows = {"operatorName": "stateStoreSave", "numRowsTotal": 50000, "numRowsUpdated": 49000,
               "allUpdatesTimeMs": 700, "allRemovalsTimeMs": 30, "commitTimeMs": 25}  # fmt: skip
    assert state_summary([dedup, windows], rocksdb_counts_rows=True) == (
        "dedupe 1500000 rows (100000 updated, 98000 removed; ms: update 900, evict 2100, "
        "commit 40); stateStoreSave 50000 rows (49000 updated, 0 removed; ms: update 700, "
        "evict 30, commit 25)"
    )
    assert state_summary([], rocksdb_counts_rows=True) == "none"


def test_rows_a_rocksdb_store_does_not_count_are_unknown_not_zero() -> None:
    # RocksDB with its row count off reports 0 rows held; its metrics name it.
    rocksdb = {"operatorName": "dedupe", "numRowsTotal": 0, "numRowsUpdated": 400,
               "customMetrics": {"rocksdbGetCount": 403, "rocksdbPutCount": 400}}  # fmt: skip
    on_heap = {"operatorName": "stateStoreSave", "numRowsTotal": 50,
               "customMetrics": {"loadedMapCacheHitCount": 3}}  # fmt: skip

    def held(*operators: dict[str, object], counts: bool) -> object:
        progress = {**PROGRESS, "stateOperators": list(operators)}
        return progress_row(progress, rocksdb_counts_rows=counts)["state_rows"]

    assert held(rocksdb, on_heap, counts=False) is None
    assert held(on_heap, counts=False) == 50
    assert held(rocksdb, on_heap, counts=True) == 50
    assert held(counts=False) == 0  # a stateless query holds none
    assert state_summary([rocksdb, on_heap], rocksdb_counts_rows=False) == (
        "dedupe uncounted rows (400 updated, 0 removed; ms: update 0, evict 0, commit 0); "
        "stateStoreSave 50 rows (0 updated, 0 removed; ms: update 0, evict 0, commit 0)"
    )
