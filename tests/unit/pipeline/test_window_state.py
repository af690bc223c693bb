"""The driver's window state: a window closes once the latest event less the watermark passes
its end, with its final state; a closed window delivered again is not counted twice."""

from __future__ import annotations

import pandas as pd
from pandas.testing import assert_frame_equal

from pipeline.detection import WindowState, advance, profiled
from pipeline.profiles import HISTORY_COLUMNS, ProfileSpec, profiles

T0 = pd.Timestamp("2026-11-25 08:00:00")


def window(start_min: int, last_min: float, count: int = 20, device: str = "d1") -> dict:
    start = T0 + pd.Timedelta(minutes=start_min)
    row = {name: 1.0 for name in HISTORY_COLUMNS}
    row.update({
        "device_id": device, "window_start": start, "window_end": start + pd.Timedelta(minutes=10),
        "event_count": count, "first_event_time": start,
        "last_event_time": T0 + pd.Timedelta(minutes=last_min),
    })  # fmt: skip
    return row


def step(state: WindowState, rows: list[dict]) -> tuple[WindowState, pd.DataFrame]:
    return advance(state, pd.DataFrame(rows), spec=ProfileSpec(), watermark_s=300, min_events=3)


def test_windows_close_with_their_final_state_once_the_watermark_passes_their_end() -> None:
    state, closing = step(WindowState.empty(), [window(0, 4, count=8), window(-5, 4, count=8)])
    assert closing.empty  # latest event 08:04: nothing ends before 07:59
    state, closing = step(state, [window(0, 9.9, count=20), window(5, 10.5, count=9)])
    # 08:10:30 less the watermark is 08:05:30: the window ending at 08:05 closes.
    assert list(closing["window_start"]) == [T0 - pd.Timedelta(minutes=5)]
    state, closing = step(state, [window(5, 15.5), window(10, 15.5, count=3)])
    assert list(closing["window_start"]) == [T0]
    assert closing["event_count"].tolist() == [20]  # the latest state, not the first
    assert sorted(state.history["window_start"]) == [T0 - pd.Timedelta(minutes=5), T0]
    assert sorted(state.open["window_start"]) == [T0 + pd.Timedelta(minutes=5),
                                                  T0 + pd.Timedelta(minutes=10)]  # fmt: skip


def test_a_closed_window_delivered_again_does_not_count_twice() -> None:
    state, _ = step(WindowState.empty(), [window(0, 9.5)])
    state, closing = step(state, [window(10, 20)])
    assert list(closing["window_start"]) == [T0]
    state, closing = step(state, [window(0, 9.5)])  # as Spark never would, but a test might
    assert closing.empty and len(state.history) == 1


def test_thin_windows_close_but_teach_the_profile_nothing() -> None:
    state, _ = step(WindowState.empty(), [window(0, 9.5, count=2)])
    state, closing = step(state, [window(10, 20)])
    assert len(closing) == 1 and state.history.empty


def test_profiles_kept_from_earlier_batches_are_the_ones_computed_afresh() -> None:
    """Two devices, windows of 10 minutes every 5, one batch a minute for an hour with ten
    minutes of silence in it: each batch's profiles of its changed and of its closing windows,
    partly taken from the state, equal those computed from scratch against the same history.
    d1's levels change every window, so a profile kept after d1's history grew differs. After
    the silence one batch closes three windows of each device, the last reading the first."""
    state, spec, reused, closing_reused = WindowState.empty(), ProfileSpec(), 0, 0
    for minute in [*range(40), *range(50, 70)]:
        rows = []
        for device, level in (("d1", 1.0 + minute), ("d2", 5.0)):
            for start in (minute // 5 * 5 - 5, minute // 5 * 5):
                row = window(start, minute + 0.5, count=20 + minute, device=device)
                row.update({name: level for name in HISTORY_COLUMNS if name.endswith("_mean")})
                rows.append(row)
        changed = pd.DataFrame(rows)
        state, closing = advance(state, changed, spec=spec, watermark_s=300, min_events=3)
        reused += len(state.profiles)
        if minute == 50:
            assert sorted(closing["window_start"].unique()) == [
                T0 + pd.Timedelta(minutes=m) for m in (25, 30, 35)]  # fmt: skip
        if len(closing):
            keys = pd.MultiIndex.from_frame(closing[["device_id", "window_start"]])
            closing_reused += keys.isin(state.profiles.index).sum()
            closing_prof, state = profiled(state, closing, spec)
            assert_frame_equal(closing_prof, profiles(closing, state.history, spec))
        prof, state = profiled(state, changed, spec)
        assert_frame_equal(prof, profiles(changed, state.history, spec))
    # The cache served changed and closing windows, and histories grew.
    assert reused > 0 and closing_reused > 0 and len(state.history) > 10


def test_windows_with_no_valid_event_yet_close_nothing_and_have_a_profile() -> None:
    """A first batch whose windows hold only copies or flagged readings: no event time yet."""
    row = window(0, 4)
    row["last_event_time"] = pd.NaT
    state, closing = step(WindowState.empty(), [row])
    assert closing.empty and state.max_event_time is None
    assert profiles(closing, state.history, ProfileSpec()).empty
    assert profiled(state, closing, ProfileSpec())[0].empty
    prof, state = profiled(state, pd.DataFrame([row]), ProfileSpec())
    assert prof["profile_windows"].tolist() == [0]
