"""What the running pipeline tells its terminal beside the progress line: that it keeps
falling behind, once.

Falling behind means the input waiting in Kafka keeps growing, so results come later and later.
A micro-batch longer than its trigger interval does not mean that: Spark warns "Current batch is
falling behind" for each one (``infra.logs`` keeps that warning out of the log file unless
``-v``), yet on a small machine that is the steady state, each batch taking what arrived while
the last one ran.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pipeline.metrics import BACKLOG, Backlog


@dataclass
class FallingBehind:
    """Follows each query's micro-batches (``MetricsListener.on_progress``) and words one
    warning, the first time a query's Kafka backlog grew ``batches`` micro-batches in a row, to
    at least ``growth`` times what it was and at least ``floor_s`` seconds of input.

    The backlog is counted in seconds of input: the messages waiting when a batch was planned,
    over the rate at which messages arrived since the query's batch before. A fleet that sends
    more keeps more messages waiting per batch without falling behind; a backlog of more seconds
    of input each time is what does not end. A query that takes all that waits finds, at its
    next batch, what arrived while this one ran: its backlog in seconds is then how long its
    last batch took, which grows and shrinks by a few seconds as windows close, and runs of
    growth that end a few seconds up are that, not a falling behind.

    Args:
        batches: how many growing micro-batches in a row make it last.
        growth: how much the backlog must have grown over them.
        floor_s: how many seconds of input it must have grown to.
        log_file: where Spark's own lines are, named in the warning.
        bounds: the most messages a batch of each query takes (maxOffsetsPerTrigger); when more
            than that were waiting, the warning names the bound.
    """

    batches: int = 5
    growth: float = 2.0
    floor_s: float = 30.0
    log_file: str | None = None
    bounds: Mapping[str, int] = field(default_factory=dict)
    _last: dict[str, tuple[int, datetime, Backlog]] = field(default_factory=dict)
    _growing: dict[str, list[float]] = field(default_factory=dict)
    _warned: bool = False

    def observe(self, row: Mapping[str, Any]) -> str | None:
        """The warning, when the query of ``row`` (its latest micro-batch, as
        ``MetricsListener.latest`` holds it) has just grown its backlog long enough (once)."""
        query, backlog, at = row["query_name"], row.get(BACKLOG), row.get("timestamp")
        last = self._last.get(query)
        if self._warned or backlog is None or at is None:
            return None  # said, or no Kafka source
        if last is not None and last[0] == row["batch_id"]:
            return None  # no new batch
        self._last[query] = (row["batch_id"], at, backlog)
        seconds = None if last is None else input_seconds(last[1:], (at, backlog))
        growing = self._growing.setdefault(query, [])
        if seconds is None or (growing and seconds <= growing[-1]):
            growing.clear()
        if seconds is not None:
            growing.append(seconds)
        if (
            len(growing) > self.batches
            and growing[-1] >= self.growth * growing[0]
            and growing[-1] >= self.floor_s
        ):
            self._warned = True
            bound = self.bounds.get(query, 0)
            # More waiting than a batch may take: the bound, not the cores, sets the pace. (Not
            # the batch's rows: Spark rounds each partition's share of the bound down, and other
            # sources add theirs.)
            capped = bool(bound) and backlog.waiting > bound
            return self._message(query, growing, backlog.waiting, bound if capped else None)
        return None

    def _message(
        self, query: str, growing: list[float], waiting: int, capped_at: int | None
    ) -> str:
        where = f"; Spark's warnings: {self.log_file}" if self.log_file else ""
        helps = (
            "more cores (IOT_SPARK_MASTER) or less input help"
            if capped_at is None
            else f"its batches take at most {capped_at:,} messages, fewer than arrive while one "
            "runs: raise IOT_PIPELINE_MAX_OFFSETS_PER_TRIGGER"
        )
        return (
            f"falling behind: the {query} query's Kafka backlog grew {len(growing) - 1} "
            f"micro-batches in a row, from {growing[0]:.1f} s to {growing[-1]:.1f} s of input "
            f"({waiting:,} messages), so results come later and later; {helps}{where} (said once)"
        )


def input_seconds(before: tuple[datetime, Backlog], now: tuple[datetime, Backlog]) -> float | None:
    """The messages waiting ``now``, in seconds of input at the rate they arrived since
    ``before`` (each a batch's planning time and backlog). None when none arrived: a backlog
    that gets no input cannot grow."""
    arrived = now[1].latest - before[1].latest
    elapsed = (now[0] - before[0]).total_seconds()
    if arrived <= 0 or elapsed <= 0:
        return None
    return now[1].waiting / (arrived / elapsed)
