"""What the running pipeline tells its terminal beside the progress line: that it keeps
falling behind, once.

Spark logs "Current batch is falling behind" at every micro-batch that takes longer than its
trigger interval; that goes to the log file (``infra.logs``), and this says it once, when it
lasts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass
class FallingBehind:
    """Follows each query's latest micro-batch (``MetricsListener.latest``) and words one
    warning, the first time a query's micro-batches took longer than its trigger interval
    ``batches`` times in a row.

    Args:
        intervals_s: trigger interval of each query, in seconds.
        batches: how many such micro-batches in a row make it last (the first ones after a
            start load state and catch up, and are slow anyway).
        log_file: where Spark's own lines are, named in the warning.
    """

    intervals_s: Mapping[str, float]
    batches: int = 5
    log_file: str | None = None
    _seen: dict[str, int] = field(default_factory=dict)
    _slow: dict[str, list[float]] = field(default_factory=dict)
    _warned: bool = False

    def update(self, latest: Mapping[str, Mapping[str, Any]]) -> str | None:
        """The warning, when a query has just been slow ``batches`` times in a row (once)."""
        if self._warned:
            return None
        for query, row in sorted(latest.items()):
            interval = self.intervals_s.get(query)
            if interval is None or self._seen.get(query) == row["batch_id"]:  # or no new batch
                continue
            self._seen[query] = row["batch_id"]
            took = row["batch_duration_ms"] / 1000
            slow = self._slow.setdefault(query, [])
            if took <= interval:
                slow.clear()
                continue
            slow.append(took)
            if len(slow) >= self.batches:
                self._warned = True
                return self._message(query, interval, slow)
        return None

    def _message(self, query: str, interval: float, slow: list[float]) -> str:
        where = f"; Spark's warnings: {self.log_file}" if self.log_file else ""
        return (
            f"falling behind: {len(slow)} {query} micro-batches in a row took "
            f"{min(slow):.1f}-{max(slow):.1f} s against a {interval:g} s trigger, so results "
            f"come later; more cores (IOT_SPARK_MASTER) or less input help{where} (said once)"
        )
