"""What the device profiles cost a detection batch, computed afresh or kept between batches.

Usage::

    .venv/bin/python bench/detection_profiles.py [--devices 25000] [--batch-s 25] [--minutes 20]

A fleet of ``--devices`` devices, each with two hours of closed windows (the profile's span) and
its two open windows (10 minutes every 5). Every device reports in every batch, as at 25,000
devices and 5,000 events/s, so a batch changes both open windows of every device, and the batch
whose event time passes a window's end plus the watermark closes one window of every device
(windows are aligned to the same boundaries for the whole fleet). The batches run through the
detection's own ``advance``; then, per batch, the profiles of the windows it closes and of
those it changed are computed both ways, in turns:

- **afresh**: ``pipeline.profiles.profiles`` against the history;
- **kept**: ``pipeline.detection.profiled``, as the detection batch does, which takes them from
  the state where the history they read has not changed since.

To compare with older code, put that checkout first on the path: in its folder,
``PYTHONPATH=. /path/to/this/.venv/bin/python /path/to/this/bench/detection_profiles.py``.

Prints, per kind of batch (closing windows or not), the median time of each way and of the
whole series; both ways must give the same profiles (checked on every batch). The metric values
are random: a profile's cost depends on the rows it reads, not on their values.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import pandas as pd

from pipeline import columns as col
from pipeline.detection import WindowState, advance, profiled
from pipeline.profiles import HISTORY_COLUMNS, ProfileSpec, history_rows, profiles

T0 = pd.Timestamp("2026-12-01 08:00:00")


def windows(devices: list[str], starts: list[pd.Timestamp], last: pd.Timestamp,
            spec: ProfileSpec, rng: np.random.Generator) -> pd.DataFrame:  # fmt: skip
    """One row per device and start: HISTORY_COLUMNS with random levels."""
    n = len(devices) * len(starts)
    frame = pd.DataFrame({
        "device_id": np.repeat(devices, len(starts)),
        col.WINDOW_START: np.tile(np.array(starts, dtype="datetime64[ns]"), len(devices)),
    })  # fmt: skip
    frame[col.WINDOW_END] = frame[col.WINDOW_START] + pd.Timedelta(seconds=spec.window_s)
    frame[col.EVENT_COUNT] = rng.integers(80, 160, n)
    frame["first_event_time"] = frame[col.WINDOW_START]
    frame["last_event_time"] = frame[col.WINDOW_END].clip(upper=last)
    for name in HISTORY_COLUMNS:
        if name not in frame:
            frame[name] = rng.normal(100.0, 10.0, n)
    return frame


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--devices", type=int, default=25000)
    parser.add_argument("--batch-s", type=float, default=25.0, help="event time per batch")
    parser.add_argument("--minutes", type=float, default=20.0, help="event time of the run")
    args = parser.parse_args()

    spec, watermark_s, rng = ProfileSpec(), 300.0, np.random.default_rng(1)
    slide = pd.Timedelta(seconds=spec.slide_s)
    devices = [f"dev-{i:06d}" for i in range(args.devices)]
    # Closed windows ending by T0, two hours' worth; the open ones start from T0 - slide.
    past = [T0 - pd.Timedelta(seconds=spec.window_s + spec.span_s) + k * slide
            for k in range(int(spec.span_s // spec.slide_s))]  # fmt: skip
    history = history_rows(windows(devices, past, T0, spec, rng), min_events=3)
    state = WindowState(pd.DataFrame(), history.reset_index(drop=True), None)
    times: dict[bool, dict[str, list[float]]] = {
        closing: {"afresh": [], "kept": []} for closing in (True, False)
    }
    now = T0 + pd.Timedelta(seconds=1)
    for _ in range(int(args.minutes * 60 // args.batch_s)):
        newest = now.floor(slide)
        changed = windows(devices, [newest - slide, newest], now, spec, rng)
        state, closing = advance(state, changed, spec=spec, watermark_s=watermark_s,
                                 min_events=3)  # fmt: skip
        started = time.perf_counter()
        afresh = [profiles(part, state.history, spec) for part in (closing, changed)]
        took_afresh = time.perf_counter() - started
        started = time.perf_counter()
        kept_closing, state = profiled(state, closing, spec)  # as the detection batch does
        kept, state = profiled(state, changed, spec)
        took_kept = time.perf_counter() - started
        if len(closing):
            pd.testing.assert_frame_equal(kept_closing, afresh[0])
        pd.testing.assert_frame_equal(kept, afresh[1])
        times[len(closing) > 0]["afresh"].append(took_afresh)
        times[len(closing) > 0]["kept"].append(took_kept)
        now += pd.Timedelta(seconds=args.batch_s)

    print(f"{args.devices:,} devices, {len(changed):,} windows changed per batch, "
          f"{len(state.history):,} history rows")  # fmt: skip
    for closing, ways in times.items():
        if ways["afresh"]:
            print(f"  {'closing' if closing else 'not closing'} ({len(ways['afresh'])} batches): "
                  + ", ".join(f"{way} median {statistics.median(t):.2f} s, sum {sum(t):.1f} s"
                              for way, t in ways.items()))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
