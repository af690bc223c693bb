"""Per-micro-batch progress of every query into ``pipeline_metrics``.

The listener only buffers rows (it runs on Spark's listener thread); the job's main loop flushes
the buffer with one append, so monitoring never slows a micro-batch down.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql.streaming.listener import StreamingQueryListener

from infra import contract as c
from infra.spark import ROCKSDB_COUNTS_ROWS
from pipeline.sinks import driver_frame

log = logging.getLogger(__name__)


def rows_held(operator: dict[str, Any], *, rocksdb_counts_rows: bool) -> int | None:
    """The rows a state operator holds; None where its store does not count them: RocksDB
    (its metrics name it) with ``infra.spark.ROCKSDB_COUNTS_ROWS`` off, which reports 0 (pure)."""
    in_rocksdb = any(name.startswith("rocksdb") for name in operator.get("customMetrics") or {})
    if in_rocksdb and not rocksdb_counts_rows:
        return None
    return int(operator.get("numRowsTotal") or 0)


def rocksdb_counts_rows(spark: SparkSession) -> bool:
    """Whether the session's RocksDB state stores count the rows they hold (Spark's default)."""
    return str(spark.conf.get(ROCKSDB_COUNTS_ROWS, "true")).lower() != "false"


def progress_row(progress: dict[str, Any], *, rocksdb_counts_rows: bool) -> dict[str, Any]:
    """One ``pipeline_metrics`` row from a StreamingQueryProgress as a dict (pure).
    ``state_rows`` is null when a state operator's store does not count its rows."""
    operators = progress.get("stateOperators") or []
    held = [rows_held(op, rocksdb_counts_rows=rocksdb_counts_rows) for op in operators]
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
        "state_rows": None if None in held else sum(n for n in held if n is not None),
        "late_rows_dropped": sum(int(op.get("numRowsDroppedByWatermark") or 0) for op in operators),
        "kafka_end_offsets": kafka_end_offsets(progress.get("sources") or []),
    }


def state_summary(operators: list[dict[str, Any]], *, rocksdb_counts_rows: bool) -> str:
    """A progress's state operators for the DEBUG log: rows held ("uncounted" where the store
    does not count them), updated and removed, and the milliseconds its tasks spent updating,
    evicting (a scan of every key held, for a watermark) and committing the state; ``none`` for
    a stateless query (pure)."""
    held = [rows_held(op, rocksdb_counts_rows=rocksdb_counts_rows) for op in operators]
    parts = [
        f"{op.get('operatorName', '?')} {'uncounted' if rows is None else rows} rows "
        f"({op.get('numRowsUpdated', 0)} updated, {op.get('numRowsRemoved', 0)} removed; "
        f"ms: update {op.get('allUpdatesTimeMs', 0)}, evict {op.get('allRemovalsTimeMs', 0)}, "
        f"commit {op.get('commitTimeMs', 0)})"
        for op, rows in zip(operators, held, strict=True)
    ]
    return "; ".join(parts) or "none"


def kafka_end_offsets(sources: list[dict[str, Any]]) -> str | None:
    """The end offsets of a progress's Kafka sources as one JSON object, {topic: {partition:
    offset}}; None without a Kafka source."""
    ends: dict[str, dict[str, int]] = {}
    for source in sources:
        for topic, parts in (_kafka_offsets(source.get("endOffset")) or {}).items():
            ends.setdefault(topic, {}).update({str(p): o for p, o in parts.items()})
    return json.dumps(ends, sort_keys=True) if ends else None


@dataclass(frozen=True)
class Backlog:
    """Where a micro-batch found its Kafka topics when it was planned."""

    latest: int  # the topics' latest offsets, summed over their partitions
    waiting: int  # messages of those it had not read before (the consumer lag)


def kafka_backlog(sources: list[dict[str, Any]]) -> Backlog | None:
    """The backlog a progress's Kafka sources found: their latest offsets less their start
    offsets. None without a Kafka source, or when Spark reports no start (a query's first
    batch) or no latest offsets."""
    latest = waiting = 0
    found = False
    for source in sources:
        start = _kafka_offsets(source.get("startOffset"))
        newest = _kafka_offsets(source.get("latestOffset"))
        if start is None or newest is None:
            continue
        for topic, parts in newest.items():
            for partition, offset in parts.items():
                latest += offset
                waiting += max(0, offset - start.get(topic, {}).get(partition, offset))
        found = True
    return Backlog(latest, waiting) if found else None


def _kafka_offsets(offsets: Any) -> dict[str, dict[str, int]] | None:
    """Offsets as a Kafka source reports them (parsed, or as JSON text): {topic: {partition:
    offset}}; None for anything else (a Delta source's offsets, none)."""
    if isinstance(offsets, str):
        try:
            offsets = json.loads(offsets)
        except ValueError:
            return None
    if not isinstance(offsets, dict) or not offsets:
        return None
    if not all(isinstance(parts, dict) for parts in offsets.values()):
        return None
    return {t: {str(p): int(o) for p, o in parts.items()} for t, parts in offsets.items()}


def _ts(text: str | None) -> datetime | None:
    if not text:
        return None
    return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(timezone.utc)


def _watermark(text: str | None) -> datetime | None:
    """The query's watermark; None until it has one (Spark reports the epoch until then, which
    read as a value is a lag of 56 years)."""
    at = _ts(text)
    return None if at is None or at <= c.NO_WATERMARK else at


# ``MetricsListener.latest``: each query's latest row, with its ``Backlog`` under this key.
BACKLOG = "kafka_backlog"


class MetricsListener(StreamingQueryListener):
    """Buffers a row per query progress; ``flush`` appends them to ``pipeline_metrics``, and
    ``latest`` keeps each query's latest row and Kafka backlog (``BACKLOG``), and each is given
    to ``on_progress`` when set (on Spark's listener thread: it must be quick)."""

    def __init__(self, path: str, *, rocksdb_counts_rows: bool) -> None:
        self.path = path
        self.rocksdb_counts_rows = rocksdb_counts_rows
        self._rows: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self.latest: dict[str, dict[str, Any]] = {}
        self.on_progress: Callable[[dict[str, Any]], None] | None = None

    def onQueryStarted(self, event: Any) -> None:
        log.info("query %s started (id %s)", event.name, event.id)

    def onQueryProgress(self, event: Any) -> None:
        progress = json.loads(event.progress.json)
        counts = self.rocksdb_counts_rows
        row = progress_row(progress, rocksdb_counts_rows=counts)
        backlog = kafka_backlog(progress.get("sources") or [])
        if log.isEnabledFor(logging.DEBUG):
            state = state_summary(progress.get("stateOperators") or [], rocksdb_counts_rows=counts)
            log.debug("%s batch %d took (ms): %s; Kafka backlog at planning: %s; state: %s",
                      row["query_name"], row["batch_id"], progress.get("durationMs"), backlog,
                      state)  # fmt: skip
        latest = {**row, BACKLOG: backlog}
        with self._lock:
            self._rows.append(row)
            self.latest[row["query_name"]] = latest
        if self.on_progress is not None:
            self.on_progress(latest)

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
        self.laps: list[tuple[str, float]] = []

    def __call__(self, name: str) -> None:
        now = time.perf_counter()
        self.laps.append((name, now - self.last))
        self.last = now

    def seconds(self) -> dict[str, float]:
        return dict(self.laps)

    def __str__(self) -> str:
        return ", ".join(f"{name} {took:.2f} s" for name, took in self.laps)
