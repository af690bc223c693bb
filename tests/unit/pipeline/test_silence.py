"""The silence detector's logic (``pipeline.silence.step``), without Spark: when a device is
silent, when it is merely slow, how a silence ends, what a late burst is."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd
import pytest

from infra import contract as c
from pipeline.alerts import alert_id_of
from pipeline.silence import (
    ACTIVE,
    ENDED_BY_READING,
    ENDED_BY_RETIREMENT,
    LATE_BURST,
    READING,
    RETIRED,
    SILENT,
    Device,
    SilenceSpec,
    next_deadline,
    pack,
    silence_alerts,
    step,
    unpack,
)

T0 = 1_767_225_600_000  # 2026-01-01 00:00:00 UTC, in ms
# The prior is a steady meter's interval, so its learned interval stays exactly 20 s.
SPEC = SilenceSpec(k=5.0, prior_s=20.0, type_prior_s={"gps_tracker": 15.0, "water_meter": 60.0},
                   late_burst_min=3)  # fmt: skip


def rows(*items: tuple[str, str, float | None, str | None]) -> pd.DataFrame:
    """Input rows: (device_id, kind, seconds after T0 or None, device_type)."""
    return pd.DataFrame(
        [(d, k, None if t is None else T0 + round(t * 1000), ty) for d, k, t, ty in items],
        columns=["device_id", "kind", "ts", "device_type"],
    )


def readings(device: str, *seconds: float) -> pd.DataFrame:
    return rows(*((device, READING, s, None) for s in seconds))


def registered(*devices: str, device_type: str = "smart_meter") -> dict[str, Device]:
    state: dict[str, Device] = {}
    step(state, rows(*((d, ACTIVE, None, device_type) for d in devices)), 0, SPEC)
    return state


def at(seconds: float) -> int:
    return T0 + round(seconds * 1000)


def steady(state: dict[str, Device], device: str, every_s: float, until_s: float) -> None:
    """Readings every ``every_s`` from 0 to ``until_s``, one batch each, on time."""
    t = 0.0
    while t <= until_s:
        assert step(state, readings(device, t), at(t - 1), SPEC) == []
        t += every_s


def only(changes: list[dict[str, Any]]) -> dict[str, Any]:
    assert len(changes) == 1, changes
    return changes[0]


def test_a_device_is_silent_once_k_intervals_pass_and_not_a_moment_before() -> None:
    state = registered("m1")
    steady(state, "m1", 20.0, 400.0)  # last reading at 400 s, interval 20 s
    assert state["m1"].interval_ms == pytest.approx(20_000)
    assert next_deadline(state, SPEC) == at(500)
    assert step(state, readings("other", 499.0), at(499.999), SPEC) == []
    silent = only(step(state, readings("other", 510.0), at(500), SPEC))
    assert silent == {
        "device_id": "m1", "alert_type": SILENT, "start_ms": at(400), "first_ms": at(400),
        "detected_ms": at(500), "end_ms": None, "readings": 0, "behind_ms": None,
        "interval_ms": 20_000, "threshold_ms": 100_000, "ended_by": None,
    }  # fmt: skip
    # Raised once: the watermark moving on raises nothing more, and no timer is left for it.
    assert step(state, readings("other", 900.0), at(890), SPEC) == []
    assert next_deadline(state, SPEC) is None


def test_reporting_again_ends_the_same_alert_and_the_silence_is_not_learned() -> None:
    state = registered("m1")
    steady(state, "m1", 20.0, 400.0)
    raised = only(step(state, pd.DataFrame(columns=["device_id", "kind", "ts", "device_type"]),
                       at(520), SPEC))  # fmt: skip
    ended = only(step(state, readings("m1", 1000.0), at(990), SPEC))
    assert ended == {**raised, "end_ms": at(1000), "ended_by": ENDED_BY_READING}
    assert state["m1"].interval_ms == pytest.approx(20_000)  # the 600 s gap is not a normal one
    # But the bar is raised, at most twofold: 2 x the longest gap, which took the 100 s threshold.
    assert next_deadline(state, SPEC) == at(1200)
    alerts = silence_alerts(pd.DataFrame([raised, ended]))
    assert len(alerts) == 1  # the latest change of one alert
    row = alerts.iloc[0]
    assert row["alert_id"] == alert_id_of("m1", SILENT, pd.Timestamp(at(400), unit="ms"))
    assert row["window_end"] == pd.Timestamp(at(1000), unit="ms")
    assert row["reasons"] == [
        "no reading since 2026-01-01 00:06:40 UTC for over 1 min 40 s (it reports about every "
        "20 s)",
        "reported again at 2026-01-01 00:16:40 UTC, after 10 min",
    ]
    assert (row["severity"], row["last_event_time"]) == ("high", pd.Timestamp(at(520), unit="ms"))


def test_an_open_silence_has_no_end_in_its_alert() -> None:
    state = registered("m1")
    steady(state, "m1", 20.0, 400.0)
    alerts = silence_alerts(pd.DataFrame([only(step(state, readings("x", 1.0), at(501), SPEC))]))
    assert pd.isna(alerts.iloc[0]["window_end"])
    assert alerts.iloc[0]["first_event_time"] == pd.Timestamp(at(400), unit="ms")
    assert alerts.iloc[0]["reasons"] == [
        "no reading since 2026-01-01 00:06:40 UTC for over 1 min 40 s (it reports about every 20 s)"
    ]


def test_a_gap_seen_only_when_the_next_reading_arrives_is_a_silence_too() -> None:
    state = registered("m1")
    steady(state, "m1", 20.0, 400.0)
    # The watermark never reached the deadline (500 s) before the next reading, at 700 s.
    ended = only(step(state, readings("m1", 700.0), at(450), SPEC))
    assert (ended["start_ms"], ended["detected_ms"], ended["end_ms"], ended["ended_by"]) == (
        at(400),
        at(500),
        at(700),
        ENDED_BY_READING,
    )


def test_a_device_slow_within_its_own_jitter_is_never_silent() -> None:
    state = registered("j1")
    t, found = 0.0, []
    for k in range(200):  # gaps of 10 s and 50 s in turn: mean 30 s, longest 50 s
        t += 10.0 if k % 2 else 50.0
        found += step(state, readings("j1", t), at(t - 1), SPEC)
    assert found == []
    assert state["j1"].threshold_ms(SPEC) == pytest.approx(150_000, rel=0.05)  # 5 x about 30 s


def test_a_device_that_reports_in_bursts_is_not_silent_between_them() -> None:
    state = registered("b1")
    t, rounds = 0.0, []
    for _ in range(12):  # ten readings a second apart, then five minutes of nothing
        found = []
        for _ in range(10):
            t += 1.0
            found += step(state, readings("b1", t), at(t - 1), SPEC)
        t += 300.0
        found += step(state, readings("x", t), at(t - 1), SPEC)  # the stream moves on
        rounds.append(sum(f["ended_by"] is None for f in found))  # silences raised
    # The first pauses are silences (a device's pattern is not known before it is seen); each
    # doubles the bar (22 s, 44 s, 89 s, 177 s, then 354 s), until a pause is normal.
    assert rounds == [1, 1, 1, 1] + [0] * 8
    assert state["b1"].threshold_ms(SPEC) > 600_000  # over 2 x the pause
    # A pause three times as long is a silence.
    found = step(state, readings("x", t + 900.0), at(t + 900.0), SPEC)
    assert [f["alert_type"] for f in found] == [SILENT]


def test_before_its_own_interval_is_learned_a_device_uses_its_types_prior() -> None:
    state = registered("g1", device_type="gps_tracker")
    state.update(registered("w1", device_type="water_meter"))
    state.update(registered("m1"))
    step(state, pd.concat([readings(d, 0.0) for d in ("g1", "w1", "m1")]), at(-1), SPEC)
    assert next_deadline({"g1": state["g1"]}, SPEC) == at(75)  # 5 x 15 s (gps_tracker's prior)
    assert next_deadline({"w1": state["w1"]}, SPEC) == at(300)  # 5 x 60 s (water_meter's)
    assert next_deadline({"m1": state["m1"]}, SPEC) == at(100)  # 5 x 20 s (the default prior)
    state["g1"].learn(15_000, SPEC)
    assert state["g1"].interval_ms == pytest.approx(15_000)  # the prior and its gap agree
    state["g1"].learn(45_000, SPEC)
    # The prior weighs as two gaps: (2 x 15 + 15 + 45) / 4.
    assert state["g1"].interval_ms == pytest.approx(22_500)


def test_devices_not_in_the_registry_are_not_followed() -> None:
    state = registered("m1")
    assert step(state, readings("rogue-1", 0.0, 20.0, 40.0), at(0), SPEC) == []
    assert "rogue-1" not in state
    assert step(state, readings("x", 10_000.0), at(10_000), SPEC) == []


def test_retiring_a_silent_device_ends_its_silence_and_forgets_it() -> None:
    state = registered("m1", "m2")
    steady(state, "m1", 20.0, 400.0)
    step(state, readings("m2", 450.0), at(449), SPEC)
    assert only(step(state, readings("x", 1.0), at(501), SPEC))["device_id"] == "m1"
    ended = only(step(state, rows(("m1", RETIRED, None, "smart_meter")), at(540), SPEC))
    assert (ended["device_id"], ended["end_ms"], ended["ended_by"]) == (
        "m1",
        at(540),
        ENDED_BY_RETIREMENT,
    )
    assert set(state) == {"m2"}
    alerts = silence_alerts(pd.DataFrame([ended]))
    assert alerts.iloc[0]["reasons"][-1] == "retired in the registry at 2026-01-01 00:09:00 UTC"
    # Retiring a device that is not silent raises nothing.
    assert step(state, rows(("m2", RETIRED, None, "smart_meter")), at(541), SPEC) == []
    assert state == {}


def test_a_store_and_forward_burst_ends_the_silence_and_raises_late_burst() -> None:
    state = registered("s1")
    steady(state, "s1", 20.0, 400.0)
    raised = only(step(state, readings("x", 1.0), at(500), SPEC))
    # Back online at 1000 s: the readings it buffered (420..980 s) arrive behind the watermark.
    buffered = [420.0 + 20 * k for k in range(29)]
    found = step(state, readings("s1", *buffered), at(1000), SPEC)
    assert [f["alert_type"] for f in found] == [SILENT, LATE_BURST]
    ended, burst = found
    assert ended == {**raised, "end_ms": at(1000), "ended_by": ENDED_BY_READING}
    assert burst == {
        "device_id": "s1", "alert_type": LATE_BURST, "start_ms": at(420), "first_ms": at(420),
        "detected_ms": at(980), "end_ms": at(980), "readings": 29, "behind_ms": 580_000,
        "interval_ms": 20_000, "threshold_ms": None, "ended_by": None,
    }  # fmt: skip
    # The buffered gaps were normal ones; the device reports on time again: no more alerts.
    assert state["s1"].interval_ms == pytest.approx(20_000)
    assert step(state, readings("s1", 1000.0, 1020.0), at(999), SPEC) == []
    assert state["s1"].burst_from_ms is None


def test_a_burst_across_batches_is_one_alert_and_too_few_late_readings_are_none() -> None:
    state = registered("s1")
    steady(state, "s1", 20.0, 100.0)
    assert step(state, readings("s1", 120.0, 140.0), at(200), SPEC) == []  # 2 late: below 3
    grown = only(step(state, readings("s1", 160.0, 180.0), at(210), SPEC))
    assert (grown["start_ms"], grown["end_ms"], grown["readings"]) == (at(120), at(180), 4)
    assert silence_alerts(pd.DataFrame([grown])).iloc[0]["reasons"] == [
        "4 readings arrived late, the oldest 1 min 20 s behind the stream (event times "
        "2026-01-01 00:02:00 UTC to 2026-01-01 00:03:00 UTC): readings sent in a burst after the "
        "device was offline"
    ]


def test_copies_and_replays_behind_the_watermark_are_no_burst_but_say_the_device_is_alive() -> None:
    state = registered("r1")
    steady(state, "r1", 20.0, 400.0)
    # Its readings of 300..400 s again, 2 minutes later: older than its latest one.
    assert step(state, readings("r1", *range(300, 401, 20)), at(480), SPEC) == []
    assert state["r1"].burst_readings == 0
    assert state["r1"].interval_ms == pytest.approx(20_000)
    assert next_deadline(state, SPEC) == at(580)  # heard from at 480 s, the watermark


def test_the_state_of_a_bucket_survives_its_round_trip_through_arrow() -> None:
    state = registered("m1", "m2", "g1")
    steady(state, "m1", 20.0, 200.0)
    state["m2"] = Device(device_type=None, last_ms=at(3), heard_ms=at(4), gaps=7,
                         interval_ms=12_345.5, longest_ms=30_000.0, silent_from_ms=at(3),
                         silent_seen_ms=at(90), silent_threshold_ms=61_000, burst_from_ms=at(1),
                         burst_to_ms=at(2), burst_readings=5, burst_behind_ms=9)  # fmt: skip
    back = unpack(pack(state))
    assert repr(back) == repr(state)  # NaN, the interval not learned yet, is not equal to itself
    assert math.isnan(back["g1"].interval_ms)
    assert unpack(None) == {}


def test_alert_types_are_the_contracts() -> None:
    assert (SILENT, LATE_BURST) == c.SILENCE_ALERT_TYPES
    assert set(c.SILENCE_ALERT_TYPES) <= set(c.ALERT_TYPES)
