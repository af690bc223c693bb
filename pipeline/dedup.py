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
# How many chunks of arrival time the state is kept in (``SeenEvents``).
SPANS = 8


@dataclass(frozen=True)
class _Chunk:
    """Kept events, sorted by key for binary search."""

    keys: Int64s
    times: Int64s
    coords: Int64s
    oldest: int
    newest: int

    @classmethod
    def of(cls, keys: Int64s, times: Int64s, coords: Int64s) -> _Chunk:
        order = np.argsort(keys, kind="stable")
        return cls(keys[order], times[order], coords[order], int(times.min()), int(times.max()))

    def span_with(self, other: _Chunk) -> int:
        """The arrival times both chunks together cover."""
        return max(self.newest, other.newest) - min(self.oldest, other.oldest)

    def merged(self, other: _Chunk) -> _Chunk:
        """Both chunks in one, still sorted by key: both are sorted already, so ``other``'s
        rows are placed among these by binary search rather than sorted again."""
        at = np.searchsorted(self.keys, other.keys, side="right")
        at += np.arange(len(other.keys))
        theirs = np.zeros(len(self.keys) + len(other.keys), dtype=bool)
        theirs[at] = True

        def interleave(mine: Int64s, their: Int64s) -> Int64s:
            out = np.empty(len(theirs), dtype=np.int64)
            out[theirs], out[~theirs] = their, mine
            return out

        return _Chunk(interleave(self.keys, other.keys), interleave(self.times, other.times),
                      interleave(self.coords, other.coords), min(self.oldest, other.oldest),
                      max(self.newest, other.newest))  # fmt: skip

    def since(self, threshold: int) -> _Chunk | None:
        """This chunk without the events that arrived before ``threshold`` (None: all did)."""
        if self.newest < threshold:
            return None
        if self.oldest >= threshold:
            return self
        keep = self.times >= threshold
        times = self.times[keep]
        return _Chunk(self.keys[keep], times, self.coords[keep], int(times.min()), self.newest)

    def copies_of(self, keys: Int64s, coords: Int64s, threshold: int) -> Bools:
        """True where a row with the same key, other coordinates and a time at or after
        ``threshold`` is in this chunk. ``keys`` sorted: the binary searches then walk the
        chunk in order."""
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
    """The events kept within ``horizon_us`` of the newest one: the ingest's dedup state.

    A batch's new events come as a chunk sorted by key, merged into the chunk before it while
    the two together arrived within ``horizon_us / SPANS``: a batch then searches about SPANS
    chunks, not one per batch (180 for a 15-minute horizon and a batch every 5 s), and each
    merge moves at most a ``SPANS``-th of the state.
    """

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
        by_key = np.argsort(keys)
        sorted_keys, sorted_coords = keys[by_key], coords[by_key]
        found = np.zeros(len(keys), dtype=bool)
        for chunk in self._chunks:
            found |= chunk.copies_of(sorted_keys, sorted_coords, threshold)
        copied = np.empty(len(keys), dtype=bool)
        copied[by_key] = found
        return first_in_batch & ~copied

    def add(self, keys: Int64s, times: Int64s, coords: Int64s, batch_times: Int64s) -> None:
        """Keep the new events of a batch (``batch_times``: all its valid rows' times, which
        move ``newest`` whether or not they were new) and forget what fell out of the horizon."""
        threshold = self.threshold(batch_times)
        if threshold is None:
            return
        self.newest = threshold + self.horizon_us
        chunks = [kept for chunk in self._chunks if (kept := chunk.since(threshold)) is not None]
        recent = times >= threshold
        if recent.any():
            chunks.append(_Chunk.of(keys[recent], times[recent], coords[recent]))
        span = self.horizon_us // SPANS
        while len(chunks) >= 2 and chunks[-2].span_with(chunks[-1]) <= span:
            last = chunks.pop()
            chunks[-1] = chunks[-1].merged(last)
        self._chunks = chunks
