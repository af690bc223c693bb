"""Which events of an ingest batch are new: the dedup decision and its state, in plain numpy.

An event is identified by ``key``, a 64-bit hash of (event_id, event_time): copies of an event
are the same message sent again. ``coord`` is a hash of the message's source coordinates (topic,
partition, offset), so a row can tell its own earlier write (a batch replayed after a crash) from
an earlier copy. ``time`` is when the message reached the source (its Kafka timestamp, epoch
microseconds): the horizon is counted in it rather than in event time, which a device's clock
sets, so one device with a clock hours ahead cannot switch dedup off for everyone else.

The rule, for each batch in order:

- ``newest`` is the latest time among the events already kept and this batch's valid rows; the
  ``threshold`` is ``newest - horizon``;
- a valid row is a duplicate when an earlier copy that arrived at or after the threshold is kept
  (with other coordinates), or when a copy with smaller coordinates is in the same batch;
- every other valid row is new (a copy sent more than the horizon after its original is not
  recognised: like Spark's ``dropDuplicatesWithinWatermark``, dedup holds within a horizon).

The decision depends only on the batch and on the events kept before it, so a batch replayed
after a crash decides the same. The state after a restart is loaded from ``telemetry`` (the kept
events within the horizon); rows the batch itself wrote in an earlier attempt are recognised by
their coordinates and not counted as copies. Two different events with the same 64-bit key (odds
about 1 in 10^12 per batch at 5,000 events/s) would send the later one to quarantine as a copy.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

Int64s = npt.NDArray[np.int64]
Bools = npt.NDArray[np.bool_]


@dataclass(frozen=True)
class _Chunk:
    """Kept events added together, sorted by key for binary search."""

    keys: Int64s
    times: Int64s
    coords: Int64s
    newest: int

    @classmethod
    def of(cls, keys: Int64s, times: Int64s, coords: Int64s) -> _Chunk:
        order = np.argsort(keys, kind="stable")
        return cls(keys[order], times[order], coords[order], int(times.max()))

    def copies_of(self, keys: Int64s, coords: Int64s, threshold: int) -> Bools:
        """True where a row with the same key, other coordinates and a time at or after
        ``threshold`` is in this chunk."""
        found = np.zeros(len(keys), dtype=bool)
        if len(self.keys) == 0:
            return found
        left = np.searchsorted(self.keys, keys, side="left")
        right = np.searchsorted(self.keys, keys, side="right")
        for row in np.flatnonzero(right > left):  # few rows match: a loop over them is cheap
            span = slice(left[row], right[row])
            found[row] = bool(
                np.any((self.coords[span] != coords[row]) & (self.times[span] >= threshold))
            )
        return found


@dataclass
class SeenEvents:
    """The events kept within ``horizon_us`` of the newest one: the ingest's dedup state."""

    horizon_us: int
    newest: int | None = None
    _chunks: list[_Chunk] = field(default_factory=list)

    @property
    def size(self) -> int:
        return sum(len(chunk.keys) for chunk in self._chunks)

    def threshold(self, times: Int64s) -> int | None:
        """The earliest arrival time an original can have and still be recognised in a batch
        of ``times``; None when nothing has been seen at all."""
        candidates = [int(times.max())] if len(times) else []
        if self.newest is not None:
            candidates.append(self.newest)
        return max(candidates) - self.horizon_us if candidates else None

    def decide(self, keys: Int64s, times: Int64s, coords: Int64s, order: Int64s) -> Bools:
        """``is_new`` for the valid rows of a batch; ``order`` ranks the rows by their source
        coordinates (the smallest is the first copy within the batch)."""
        if len(keys) == 0:
            return np.zeros(0, dtype=bool)
        by_order = np.argsort(order, kind="stable")
        first_in_batch = np.zeros(len(keys), dtype=bool)
        _, first = np.unique(keys[by_order], return_index=True)
        first_in_batch[by_order[first]] = True
        threshold = self.threshold(times)
        assert threshold is not None
        copied = np.zeros(len(keys), dtype=bool)
        for chunk in self._chunks:
            copied |= chunk.copies_of(keys, coords, threshold)
        return first_in_batch & ~copied

    def add(self, keys: Int64s, times: Int64s, coords: Int64s, batch_times: Int64s) -> None:
        """Keep the new events of a batch (``batch_times``: all its valid rows' times, which
        move ``newest`` whether or not they were new) and forget what fell out of the horizon."""
        threshold = self.threshold(batch_times)
        if threshold is None:
            return
        self.newest = threshold + self.horizon_us
        if len(keys):
            self._chunks.append(_Chunk.of(keys, times, coords))
        self._chunks = [chunk for chunk in self._chunks if chunk.newest >= threshold]
