"""The ingest's dedup rule (``pipeline.dedup``): which valid rows of a batch are new events."""

from __future__ import annotations

import numpy as np

from pipeline.dedup import SeenEvents

MINUTE = 60_000_000
HORIZON = 10 * MINUTE


def batch(*rows: tuple[int, int, int]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(key, arrival minute, coord) per row; the rank is the row's place (its coordinates)."""
    columns = list(zip(*rows, strict=True)) or [(), (), ()]
    key, minutes, coord = (np.array(values, dtype=np.int64) for values in columns)
    return key, minutes * MINUTE, coord, np.arange(len(rows), dtype=np.int64)


def run(seen: SeenEvents, *rows: tuple[int, int, int]) -> list[bool]:
    """Decide a batch and keep its new events, as the ingest does after its commits."""
    key, times, coord, rank = batch(*rows)
    is_new = seen.decide(key, times, coord, rank)
    seen.add(key[is_new], times[is_new], coord[is_new], times)
    return is_new.tolist()


def test_first_copy_within_a_batch_is_the_one_with_the_smallest_coordinates() -> None:
    seen = SeenEvents(HORIZON)
    key, times, coord, _ = batch((1, 100, 11), (2, 100, 12), (1, 100, 13))
    # The third row has the smallest coordinates: it is the original, the first a copy.
    rank = np.array([2, 0, 1], dtype=np.int64)
    assert seen.decide(key, times, coord, rank).tolist() == [False, True, True]


def test_a_copy_of_an_event_kept_by_an_earlier_batch_is_a_duplicate() -> None:
    seen = SeenEvents(HORIZON)
    assert run(seen, (1, 100, 11), (2, 100, 12)) == [True, True]
    assert run(seen, (3, 101, 13), (1, 100, 14)) == [True, False]
    assert seen.size == 3


def test_a_row_the_batch_wrote_in_an_earlier_attempt_is_not_its_own_copy() -> None:
    """After a crash between the append and the checkpoint commit, the state loaded from the
    table holds the batch's own rows: same key and same coordinates."""
    seen = SeenEvents(HORIZON)
    seen.add(*batch((1, 100, 11), (2, 100, 12))[:3], np.array([100 * MINUTE]))
    assert run(seen, (1, 100, 11), (2, 100, 99)) == [True, False]


def test_an_original_that_arrived_more_than_the_horizon_before_the_newest_is_forgotten() -> None:
    seen = SeenEvents(HORIZON)
    run(seen, (1, 100, 11))
    run(seen, (2, 111, 12))  # newest is now minute 111: minute 100 is 11 minutes behind
    assert run(seen, (1, 100, 13)) == [True]
    # Within the horizon it is.
    assert run(seen, (2, 111, 14)) == [False]


def test_the_horizon_counts_from_the_newest_arrival_including_the_batchs_own() -> None:
    seen = SeenEvents(HORIZON)
    run(seen, (1, 100, 11))
    # The batch's own newest event (minute 120) puts minute 100 outside the horizon.
    assert run(seen, (1, 100, 12), (5, 120, 13)) == [True, True]


def test_state_loaded_from_the_table_decides_like_the_state_kept_in_memory() -> None:
    """A restart must not change a decision: the same batches against a state rebuilt from what
    was kept give the same answers, whatever falls out of the horizon meanwhile."""
    batches = [
        [(1, 100, 1), (2, 101, 2), (1, 100, 3)],
        [(3, 104, 4), (2, 101, 5), (4, 95, 6)],
        [(5, 112, 7), (1, 100, 8), (3, 104, 9)],
        [(6, 113, 10), (4, 95, 11), (5, 112, 12), (6, 113, 13)],
    ]
    live = SeenEvents(HORIZON)
    kept: list[tuple[int, int, int]] = []
    for number, rows in enumerate(batches):
        restarted = SeenEvents(HORIZON)
        if kept:
            key, times, coord, _ = batch(*kept)
            newest = times.max()
            inside = times >= newest - HORIZON  # what the load reads from the table
            restarted.add(key[inside], times[inside], coord[inside], times[inside])
        key, times, coord, rank = batch(*rows)
        expected = restarted.decide(key, times, coord, rank)
        answer = live.decide(key, times, coord, rank)
        assert answer.tolist() == expected.tolist(), f"batch {number}"
        live.add(key[answer], times[answer], coord[answer], times)
        kept += [row for row, new in zip(rows, answer, strict=True) if new]
    assert [row[0] for row in kept] == [1, 2, 3, 4, 5, 1, 6, 4]


def test_state_forgets_what_fell_out_of_the_horizon() -> None:
    seen = SeenEvents(HORIZON)
    for minute in range(100, 160):
        run(seen, (minute, minute, minute))
    assert seen.size <= 11


def test_an_empty_batch_changes_nothing() -> None:
    seen = SeenEvents(HORIZON)
    assert run(seen) == []
    assert seen.newest is None and seen.size == 0


def test_many_batches_decide_as_the_rule_reads_over_every_event_kept() -> None:
    """The rule of ``pipeline.dedup``, read literally over a flat list of every event kept,
    against the state's chunks, merged and trimmed as batches come: copies within and across
    batches, replays of a batch's own rows, arrival times out of order, and far more batches
    than the state has chunks."""
    rng = np.random.default_rng(7)
    seen = SeenEvents(HORIZON)
    kept: list[tuple[int, int, int]] = []  # (key, time, coord) of every event ever kept
    newest: int | None = None
    coord = 0
    for number in range(300):
        size = int(rng.integers(0, 40))
        keys = rng.integers(0, 400, size).astype(np.int64)  # few keys: many copies
        # Arrival a little out of order, three batches a minute.
        times = (number * MINUTE // 3 + rng.integers(-MINUTE, MINUTE, size)).astype(np.int64)
        coords = np.arange(coord, coord + size, dtype=np.int64)
        coord += size
        replays = rng.random(size) < 0.1  # a row the lake may hold from an earlier attempt
        for row in np.flatnonzero(replays):
            seen_row = kept[int(rng.integers(len(kept)))] if kept else None
            if seen_row is not None:
                keys[row], times[row], coords[row] = seen_row
        rank = rng.permutation(size).astype(np.int64)

        latest = max([*times.tolist(), *([newest] if newest is not None else [])], default=None)
        threshold = None if latest is None else latest - HORIZON
        expected = []
        for row in range(size):
            earlier_in_batch = any(
                keys[other] == keys[row] and rank[other] < rank[row] for other in range(size)
            )
            copy_kept = any(
                k == keys[row] and c != coords[row] and t >= threshold for k, t, c in kept
            )
            expected.append(not earlier_in_batch and not copy_kept)

        answer = seen.decide(keys, times, coords, rank)
        assert answer.tolist() == expected, f"batch {number}"
        seen.add(keys[answer], times[answer], coords[answer], times)
        if threshold is not None:
            newest = threshold + HORIZON
        kept += [(int(k), int(t), int(c)) for k, t, c in
                 zip(keys[answer], times[answer], coords[answer], strict=True)]  # fmt: skip
    assert newest is not None
    assert seen.size == sum(1 for _, t, _ in kept if t >= newest - HORIZON)
