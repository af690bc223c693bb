"""What the ingest's dedup decision (``pipeline.dedup.SeenEvents``) costs a batch on the driver.

Usage::

    .venv/bin/python bench/ingest_dedup.py [--rate 5000] [--batch-s 5] [--horizon-minutes 15]

Batches of ``--rate`` x ``--batch-s`` events, one every ``--batch-s`` seconds of arrival time,
each decided and then kept as the ingest does (``decide``, then ``add`` of the new events), with
random 64-bit keys and coordinates (the cost depends on how many rows are kept and searched,
not on their values). The first horizon's batches fill the state; the batches after it are
timed.

To compare with older code, put that checkout first on the path: in its folder,
``PYTHONPATH=. /path/to/this/.venv/bin/python /path/to/this/bench/ingest_dedup.py``.

Prints the events the state holds at the end, and the median and largest time of ``decide``
and of ``add`` over the timed batches.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from pipeline.dedup import SeenEvents

MICROS = 1_000_000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rate", type=int, default=5000, help="events per second")
    parser.add_argument("--batch-s", type=float, default=5.0, help="arrival time per batch")
    parser.add_argument("--horizon-minutes", type=float, default=15.0)
    parser.add_argument("--timed", type=int, default=200, help="batches timed after the fill")
    args = parser.parse_args()

    rng = np.random.default_rng(1)
    horizon = int(args.horizon_minutes * 60 * MICROS)
    step = int(args.batch_s * MICROS)
    size = int(args.rate * args.batch_s)
    seen = SeenEvents(horizon)
    fill = horizon // step + 1
    decide_s: list[float] = []
    add_s: list[float] = []
    for number in range(fill + args.timed):
        keys = rng.integers(np.iinfo(np.int64).min, np.iinfo(np.int64).max, size, dtype=np.int64)
        coords = rng.integers(np.iinfo(np.int64).min, np.iinfo(np.int64).max, size, dtype=np.int64)
        times = number * step + np.sort(rng.integers(0, step, size)).astype(np.int64)
        start = time.perf_counter()
        is_new = seen.decide(keys, times, coords, np.arange(size, dtype=np.int64))
        decided = time.perf_counter()
        seen.add(keys[is_new], times[is_new], coords[is_new], times)
        if number >= fill:
            decide_s.append(decided - start)
            add_s.append(time.perf_counter() - decided)

    print(f"{size:,} events a batch, {args.horizon_minutes:g}-minute horizon: "
          f"{seen.size:,} events kept")  # fmt: skip
    for name, laps in (("decide", decide_s), ("add", add_s)):
        print(f"  {name}: median {statistics.median(laps) * 1000:.1f} ms, "
              f"max {max(laps) * 1000:.1f} ms over {len(laps)} batches")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
