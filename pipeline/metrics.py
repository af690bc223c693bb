"""Per-micro-batch progress of every query into ``pipeline_metrics``.

The listener only buffers rows (it runs on Spark's listener thread); the job's main loop flushes
the buffer with one append, so monitoring never slows a micro-batch down.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from datetime import datetime, timezone
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql.streaming.listener import StreamingQueryListener

from infra import contract as c
from pipeline.sinks import driver_frame

log = logging.getLogger(__name__)


def progress_row(progress: dict[str, Any]) -> dict[str, Any]:
    """One ``pipeline_metrics`` row from a StreamingQueryProgress as a dict (pure)."""
    operators = progress.get("stateOperators") or []
    watermark = (progress.get("eventTime") or {}).get("watermark")
    return {
        "query_name": progress.get("name") or "",
        "run_id": str(progress.get("runId")),
        "batch_id": int(progress.get("batchId", -1)),
        "timestamp": _ts(progress.get("timestamp")),
        "num_input_rows": int(progress.get("numInputRows") or 0),
        "input_rows_per_second": float(progress.get("inputRowsPerSecond") or 0.0),
        "processed_rows_per_second": float(progress.get("processedRowsPerSecond") or 0.0),
        "batch_duration_ms": int(progress.get("batchDuration") or 0),
        "watermark": _watermark(watermark),
        "state_rows": sum(int(op.get("numRowsTotal") or 0) for op in operators),
        "late_rows_dropped": sum(int(op.get("numRowsDroppedByWatermark") or 0) for op in operators),
        "kafka_end_offsets": kafka_end_offsets(progress.get("sources") or []),
    }


def kafka_end_offsets(sources: list[dict[str, Any]]) -> str | None:
    """The end offsets of a progress's Kafka sources as one JSON object, {topic: {partition:
    offset}}; None without a Kafka source. A Kafka source's offsets are that shape (Spark gives
    them parsed, or as JSON text); a Delta source's are not."""
    ends: dict[str, dict[str, int]] = {}
    for source in sources:
        offsets = source.get("endOffset")
        if isinstance(offsets, str):
            try:
                offsets = json.loads(offsets)
            except ValueError:
                continue
        if (
            isinstance(offsets, dict)
            and offsets
            and all(isinstance(parts, dict) for parts in offsets.values())
        ):
            for topic, parts in offsets.items():
                ends.setdefault(topic, {}).update({str(p): int(o) for p, o in parts.items()})
    return json.dumps(ends, sort_keys=True) if ends else None


def _ts(text: str | None) -> datetime | None:
    if not text:
        return None
    return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(timezone.utc)


def _watermark(text: str | None) -> datetime | None:
    """The query's watermark; None until it has one (Spark reports the epoch until then, which
    read as a value is a lag of 56 years)."""
    at = _ts(text)
    return None if at is None or at <= c.NO_WATERMARK else at


class MetricsListener(StreamingQueryListener):
    """Buffers a row per query progress; ``flush`` appends them to ``pipeline_metrics``."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._rows: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self.latest: dict[str, dict[str, Any]] = {}

    def onQueryStarted(self, event: Any) -> None:
        log.info("query %s started (id %s)", event.name, event.id)

    def onQueryProgress(self, event: Any) -> None:
        progress = json.loads(event.progress.json)
        row = progress_row(progress)
        log.debug("%s batch %d took (ms): %s", row["query_name"], row["batch_id"],
                  progress.get("durationMs"))  # fmt: skip
        with self._lock:
            self._rows.append(row)
            self.latest[row["query_name"]] = row

    def onQueryIdle(self, event: Any) -> None:
        pass

    def onQueryTerminated(self, event: Any) -> None:
        if event.exception:
            log.error("query %s failed: %s", event.id, event.exception)

    def flush(self, spark: SparkSession) -> int:
        """Append buffered rows; returns how many were written."""
        with self._lock:
            rows, self._rows = self._rows, []
        if rows:
            frame = driver_frame(spark, rows, c.spark_ddl(c.PIPELINE_METRICS_COLUMNS))
            frame.write.format("delta").mode("append").save(self.path)
        return len(rows)

    def status_line(self) -> str:
        with self._lock:
            latest = dict(self.latest)
        parts = []
        for name, row in sorted(latest.items()):
            wm = row["watermark"].strftime("%H:%M:%S") if row["watermark"] else "-"
            parts.append(
                f"{name}: batch {row['batch_id']} in {row['num_input_rows']} "
                f"({row['processed_rows_per_second']:.0f}/s, {row['batch_duration_ms']} ms, "
                f"wm {wm}, late {row['late_rows_dropped']})"
            )
        return " | ".join(parts) or "waiting for the first micro-batch"


class Laps:
    """Where a batch's time went, step by step, for the debug log."""

    def __init__(self) -> None:
        self.last = time.perf_counter()
        self.laps: list[str] = []

    def __call__(self, name: str) -> None:
        now = time.perf_counter()
        self.laps.append(f"{name} {now - self.last:.2f} s")
        self.last = now

    def __str__(self) -> str:
        return ", ".join(self.laps)
