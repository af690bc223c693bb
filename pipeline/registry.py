"""The device registry as the streaming queries join it: the ``devices`` table, held in Spark's
cache and read again only when the table has a new version.

A stream-static join plans its static side again in every micro-batch. For a Delta table that
planning lists the table's files from its log and filters them by their statistics (Delta's
``PrepareDeltaScan``, a Spark job of its own): 0.3 s of each detection batch's 0.4-0.5 s of
planning on a busy two-core machine, spent on a table that changes a few times a day
(docs/PERFORMANCE.md). Held in the cache, the registry costs a scan of memory instead.

Spark replaces any plan that reads the table's latest version by the cached rows, whichever
DataFrame read it (Delta's file index compares the path, not the version). So one ``refresh``
changes what every running query joins from its next micro-batch on: detection, the firmware
check, the silence query and the fast path. Between dropping the old rows and caching the new
ones, a micro-batch reads the table itself: the current version either way.

The pipeline looks for a new version every second (``watch``): a change reaches the joins of
the micro-batches planned from then on. A batch planned before keeps the registry it read.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field

from pyspark.sql import DataFrame, SparkSession

from infra import lake
from pipeline.sinks import hadoop_path

log = logging.getLogger(__name__)


@dataclass
class PinnedRegistry:
    """``frame``: the ``devices`` table as of ``version``, cached. Build with ``load``."""

    spark: SparkSession
    path: str
    frame: DataFrame = field(repr=False)
    version: int
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _stop: threading.Event = field(default_factory=threading.Event, repr=False)
    _watcher: threading.Thread | None = field(default=None, repr=False)

    @classmethod
    def load(cls, spark: SparkSession, lake_root: str) -> PinnedRegistry:
        path = lake.table_path(lake_root, lake.DEVICES)
        version, frame = _cached(spark, path)
        log.info("registry: version %d cached for the streaming joins", version)
        return cls(spark, path, frame, version)

    def refresh(self) -> bool:
        """Cache the table again if it has a version after ``version``; True when it had.
        Checks for the next commit's file: one file-system call when nothing changed."""
        with self._lock:
            if not _exists(self.spark, _commit_file(self.path, self.version + 1)):
                return False
            self.version, self.frame = _cached(self.spark, self.path)
            log.info("registry: version %d cached for the streaming joins", self.version)
            return True

    def watch(self, every_s: float) -> None:
        """``refresh`` every ``every_s`` seconds on a thread of its own, until ``release``. A
        refresh that fails (the lake unreachable for a moment) is logged and tried again."""
        from pyspark import InheritableThread

        def run() -> None:
            failing = False
            while not self._stop.wait(every_s):
                try:
                    self.refresh()
                except Exception as exc:
                    if not failing:  # once per outage, not every second
                        log.warning("registry: cannot look for a new version of %s (the joins "
                                    "keep version %d): %s", self.path, self.version,
                                    str(exc).splitlines()[0])  # fmt: skip
                    failing = True
                else:
                    if failing:
                        log.info("registry: %s readable again", self.path)
                    failing = False

        self._watcher = InheritableThread(target=run, name="registry-watch", daemon=True)
        self._watcher.start()

    def release(self) -> None:
        """Stop watching and drop the cached rows (the session may outlive the pipeline)."""
        self._stop.set()
        if self._watcher is not None:
            self._watcher.join()
        with self._lock:
            self.frame.unpersist()


def _cached(spark: SparkSession, path: str) -> tuple[int, DataFrame]:
    """The table's latest version and its rows, cached. The version is read first: the rows are
    of that version or a later one, and a later one is cached again at the next refresh."""
    from delta.tables import DeltaTable

    version = DeltaTable.forPath(spark, path).history(1).select("version").first()
    assert version is not None, f"{path} has no history"
    frame = spark.read.format("delta").load(path)
    # Spark keeps one cache entry per plan: the previous version's rows, cached by an earlier
    # call (through any DataFrame reading the table), must go before the new rows can be cached.
    frame.unpersist()
    frame.cache()
    frame.count()
    return int(version[0]), frame


def _commit_file(path: str, version: int) -> str:
    return f"{path.rstrip('/')}/_delta_log/{version:020d}.json"


def _exists(spark: SparkSession, file: str) -> bool:
    fs, path = hadoop_path(spark, file)
    return bool(fs.exists(path))
