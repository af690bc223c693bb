"""The silence detector's logic (``pipeline.silence.Partition`` and ``step``), without Spark:
when a device is silent, when it is merely slow, how a silence ends, what a late burst is, and
that none of it depends on how a partition's readings are cut into micro-batches."""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any

import pandas as pd
import pytest

from infra import contract as c
from pipeline.alerts import alert_id_of
from pipeline.silence import (
    ALIVE,
    CHANGE_COLUMNS,
    ENDED_BY_READING,
    ENDED_BY_RETIREMENT,
    INPUT_COLUMNS,
    LATE_BURST,
    READING,
    RETIRED,
    SILENT,
    Device,
    Partition,
    SilenceSpec,
    pack,
    silence_alerts,
    silence_input,
    step,
    unpack,
)
from pipeline.transforms import senders

T0 = 1_767_225_600_000  # 2026-01-01 00:00:00 UTC, in ms
# The prior is a steady meter's interval, so its learned interval stays exactly 20 s. Readings
# more than 10 s behind their partition's newest are late.
SPEC = SilenceSpec(k=5.0, prior_s=20.0, type_prior_s={"gps_tracker": 15.0, "water_meter": 60.0},
                   late_burst_min=3, lateness_ms=10_000)  # fmt: skip
TYPES = {"g": "gps_tracker", "w": "water_meter"}


def at(seconds: float) -> int:
    return T0 + round(seconds * 1000)


class Feed:
    """One partition, fed micro-batch by micro-batch in offset order. A device named ``rogue-*``
    is not registered; ``x`` is a steady device whose readings move the partition's clock."""

    def __init__(self, spec: SilenceSpec = SPEC) -> None:
        self.partition = Partition(spec)
        self.offset = 0

    def rows(self, *readings: tuple[str, float]) -> pd.DataFrame:
        out = []
        for device, second in readings:
            self.offset += 1
            kind = TYPES.get(device[0], "smart_meter")
            registered = not device.startswith("rogue")
            out.append((0, self.offset, device, READING, at(second), kind, registered))
        return pd.DataFrame(out, columns=INPUT_COLUMNS)

    def __call__(self, *readings: tuple[str, float]) -> list[dict[str, Any]]:
        return step(self.partition, self.rows(*readings))

    def stream_to(self, second: float, every_s: float = 10.0) -> list[dict[str, Any]]:
        """The stream moving on to ``second``: an unregistered device's readings every
        ``every_s`` from the partition's clock (a feed that goes quiet as a whole is another
        matter: ``test_a_span_in_which_the_whole_partition_was_quiet_is_nobodys_silence``)."""
        clock = (self.partition.clock_ms - T0) / 1000 if self.partition.clock_ms else 0.0
        times = [clock + every_s * k for k in range(1, int((second - clock) // every_s) + 1)]
        return self(*(("rogue-1", t) for t in [*times, second] if t <= second))

    def retire(self, device: str) -> list[dict[str, Any]]:
        row = (0, None, device, RETIRED, None, "smart_meter", False)
        return step(self.partition, pd.DataFrame([row], columns=INPUT_COLUMNS))

    def steady(self, device: str, every_s: float, until_s: float) -> None:
        self.steady_from(device, 0.0, every_s, until_s)

    def steady_from(self, device: str, t: float, every_s: float, until_s: float) -> None:
        while t <= until_s:
            assert self((device, t)) == []
            t += every_s

    @property
    def devices(self) -> dict[str, Device]:
        return self.partition.devices


def only(changes: list[dict[str, Any]]) -> dict[str, Any]:
    assert len(changes) == 1, changes
    return changes[0]


def test_a_device_is_silent_once_k_intervals_pass_and_not_a_moment_before() -> None:
    feed = Feed()
    feed.steady("m1", 20.0, 400.0)  # last reading at 400 s, interval 20 s
    assert feed.devices["m1"].interval_ms == pytest.approx(20_000)
    assert feed.partition.next_deadline() == at(500)
    # The partition's time is its newest event time less 10 s.
    assert feed.stream_to(509.999) == []
    silent = only(feed.stream_to(510.0))
    assert silent == {
        "device_id": "m1", "alert_type": SILENT, "start_ms": at(400), "first_ms": at(400),
        "detected_ms": at(500), "end_ms": None, "readings": 0, "behind_ms": None,
        "interval_ms": 20_000, "threshold_ms": 100_000, "ended_by": None,
    }  # fmt: skip
    # Raised once: the clock moving on raises nothing more, and no deadline is left for it.
    assert feed(("rogue-1", 900.0)) == []
    assert feed.partition.next_deadline() is None


def test_reporting_again_ends_the_same_alert_and_the_silence_is_not_learned() -> None:
    feed = Feed()
    feed.steady("m1", 20.0, 400.0)
    raised = only(feed.stream_to(530.0))
    ended = only(feed(("rogue-1", 990.0), ("m1", 1000.0)))
    assert ended == {**raised, "end_ms": at(1000), "ended_by": ENDED_BY_READING}
    assert feed.devices["m1"].interval_ms == pytest.approx(20_000)  # 600 s is not a normal gap
    # But the bar is raised, at most twofold: 2 x the longest gap, which took the 100 s threshold.
    assert feed.partition.next_deadline() == at(1200)
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
    assert (row["severity"], row["last_event_time"]) == ("high", pd.Timestamp(at(500), unit="ms"))


def test_an_open_silence_has_no_end_in_its_alert() -> None:
    feed = Feed()
    feed.steady("m1", 20.0, 400.0)
    alerts = silence_alerts(pd.DataFrame([only(feed.stream_to(511.0))]))
    assert pd.isna(alerts.iloc[0]["window_end"])
    assert alerts.iloc[0]["first_event_time"] == pd.Timestamp(at(400), unit="ms")
    assert alerts.iloc[0]["reasons"] == [
        "no reading since 2026-01-01 00:06:40 UTC for over 1 min 40 s (it reports about every 20 s)"
    ]


def test_a_gap_seen_only_when_the_next_reading_arrives_is_a_silence_too() -> None:
    feed = Feed()
    for t in range(0, 401, 20):
        assert feed(("m1", float(t)), ("x", float(t))) == []
    # The clock stops 5 s short of m1's deadline (500 s, at the partition's time 510 s); x's
    # reading at 515 s would reach it, m1's own comes first and ends a silence seen only now.
    assert feed(*(("x", t) for t in (420.0, 440.0, 460.0, 480.0, 500.0, 505.0))) == []
    ended = only(feed(("m1", 515.0)))
    assert (ended["start_ms"], ended["detected_ms"], ended["end_ms"], ended["ended_by"]) == (
        at(400),
        at(500),
        at(515),
        ENDED_BY_READING,
    )


def test_a_span_in_which_the_whole_partition_was_quiet_is_nobodys_silence() -> None:
    feed = Feed()
    for t in range(0, 401, 20):  # w1, a water_meter, every 60 s: a threshold of 300 s
        w1 = [("w1", float(t))] if t % 60 == 0 else []
        assert feed(("m1", float(t)), ("q1", t - 10.0), *w1) == []
    # Nothing at all from the partition for three hours (the producer was stopped, or the demo
    # is run again), then the fleet reports as before: nobody was silent, and nobody learned a
    # three-hour gap.
    assert feed(("m1", 11_200.0), ("q1", 11_205.0)) == []
    assert (feed.devices["m1"].interval_ms, feed.devices["m1"].longest_ms) == (20_000, 20_000)
    assert feed.devices["q1"].interval_ms == pytest.approx(20_000, rel=0.02)  # 15 s learned
    assert feed.devices["q1"].longest_ms <= 20_000
    # A device the feed's return does not bring back is silent k intervals on: from its last
    # reading (360 s), 40 s before the gap and 260 s after it.
    for t in range(11_220, 11_461, 20):
        assert feed(("m1", float(t)), ("q1", t + 5.0)) == []
    assert feed.stream_to(11_469.0) == []
    silent = only(feed.stream_to(11_470.0))
    assert (silent["device_id"], silent["start_ms"], silent["detected_ms"]) == (
        "w1",
        at(360),
        at(11_460),
    )
    # A gap shorter than a device's threshold is its own: the partition is quiet for 85 s, less
    # than m1's 100 s, and m1's reading after it is a gap of 95 s, learned.
    assert feed(("m1", 11_555.0), ("q1", 11_556.0)) == []
    assert feed.devices["m1"].longest_ms == pytest.approx(95_000)


def test_a_device_slow_within_its_own_jitter_is_never_silent() -> None:
    feed = Feed()
    t, found = 0.0, []
    for k in range(200):  # gaps of 10 s and 50 s in turn: mean 30 s, longest 50 s
        t += 10.0 if k % 2 else 50.0
        found += feed(("j1", t), ("rogue-1", t + 9.0))
    assert found == []
    assert feed.devices["j1"].threshold_ms(SPEC) == pytest.approx(150_000, rel=0.05)


def test_a_device_that_reports_in_bursts_is_not_silent_between_them() -> None:
    feed = Feed()
    t, rounds = 0.0, []
    for _ in range(12):  # ten readings a second apart, then five minutes of nothing
        found = []
        for _ in range(10):
            t += 1.0
            found += feed(("b1", t))
        t += 300.0
        found += feed.stream_to(t)  # the stream moves on
        rounds.append(sum(f["ended_by"] is None for f in found))  # silences raised
    # The first pauses are silences (a device's pattern is not known before it is seen); each
    # doubles the bar (22 s, 44 s, 89 s, 177 s, then 354 s), until a pause is normal.
    assert rounds == [1, 1, 1, 1] + [0] * 8
    assert feed.devices["b1"].threshold_ms(SPEC) > 600_000  # over 2 x the pause
    # A pause three times as long is a silence.
    assert [f["alert_type"] for f in feed.stream_to(t + 900.0)] == [SILENT]


def test_before_its_own_interval_is_learned_a_device_uses_its_types_prior() -> None:
    feed = Feed()
    feed(("g1", 0.0), ("w1", 0.0), ("m1", 0.0))
    deadlines = {d: dev.deadline_ms(SPEC) for d, dev in feed.devices.items()}
    # 5 x 15 s (gps_tracker's prior), 5 x 60 s (water_meter's), 5 x 20 s (the default prior).
    assert deadlines == {"g1": at(75), "w1": at(300), "m1": at(100)}
    g1 = feed.devices["g1"]
    g1.learn(15_000, SPEC)
    assert g1.interval_ms == pytest.approx(15_000)  # the prior and its gap agree
    g1.learn(45_000, SPEC)
    assert g1.interval_ms == pytest.approx(22_500)  # the prior weighs as two gaps


def test_devices_not_in_the_registry_are_not_followed_but_move_the_clock() -> None:
    feed = Feed()
    assert feed(("rogue-1", 0.0), ("rogue-1", 20.0), ("rogue-1", 40.0)) == []
    assert feed.devices == {}
    assert feed.partition.clock_ms == at(40)
    assert feed(("rogue-1", 10_000.0)) == []


def test_retiring_a_silent_device_ends_its_silence_and_forgets_it() -> None:
    feed = Feed()
    feed.steady("m1", 20.0, 400.0)
    feed(("m2", 450.0))
    assert only(feed(("rogue-1", 511.0)))["device_id"] == "m1"
    feed(("rogue-1", 550.0))  # the partition's time: 540 s
    ended = only(feed.retire("m1"))
    assert (ended["device_id"], ended["end_ms"], ended["ended_by"]) == (
        "m1",
        at(540),
        ENDED_BY_RETIREMENT,
    )
    assert set(feed.devices) == {"m2"}
    alerts = silence_alerts(pd.DataFrame([ended]))
    assert alerts.iloc[0]["reasons"][-1] == "retired in the registry at 2026-01-01 00:09:00 UTC"
    # Retiring a device that is not silent raises nothing.
    assert feed.retire("m2") == []
    assert feed.devices == {}


def test_a_store_and_forward_burst_ends_the_silence_and_raises_late_burst() -> None:
    feed = Feed()
    feed.steady("s1", 20.0, 400.0)
    raised = only(feed.stream_to(510.0))
    feed(("rogue-1", 1010.0))  # the partition's time: 1000 s
    # Back online: the readings it buffered (420..980 s) arrive behind the partition's time.
    found = feed(*(("s1", 420.0 + 20 * k) for k in range(29)))
    assert [f["alert_type"] for f in found] == [SILENT, LATE_BURST]
    ended, burst = found
    assert ended == {**raised, "end_ms": at(1000), "ended_by": ENDED_BY_READING}
    assert burst == {
        "device_id": "s1", "alert_type": LATE_BURST, "start_ms": at(420), "first_ms": at(420),
        "detected_ms": at(980), "end_ms": at(980), "readings": 29, "behind_ms": 580_000,
        "interval_ms": 20_000, "threshold_ms": None, "ended_by": None,
    }  # fmt: skip
    # The buffered gaps were normal ones; the device reports on time again: no more alerts.
    assert feed.devices["s1"].interval_ms == pytest.approx(20_000)
    assert feed(("s1", 1000.0), ("s1", 1020.0)) == []
    assert feed.devices["s1"].burst_from_ms is None


def test_a_burst_across_batches_is_one_alert_and_too_few_late_readings_are_none() -> None:
    feed = Feed()
    feed.steady("s1", 20.0, 100.0)
    assert feed(("rogue-1", 205.0), ("s1", 120.0), ("s1", 140.0)) == []  # 2 late: below 3
    grown = only(feed(("rogue-1", 220.0), ("s1", 160.0), ("s1", 180.0)))
    assert (grown["start_ms"], grown["end_ms"], grown["readings"]) == (at(120), at(180), 4)
    assert silence_alerts(pd.DataFrame([grown])).iloc[0]["reasons"] == [
        "4 readings arrived late, the oldest 1 min 15 s behind the stream (event times "
        "2026-01-01 00:02:00 UTC to 2026-01-01 00:03:00 UTC): readings sent in a burst after the "
        "device was offline"
    ]


def test_copies_and_replays_behind_the_clock_are_no_burst_but_say_the_device_is_alive() -> None:
    feed = Feed()
    feed.steady("r1", 20.0, 400.0)
    # Its readings of 300..400 s again, sent later: older than its latest one.
    assert feed(("rogue-1", 490.0), *(("r1", float(s)) for s in range(300, 401, 20))) == []
    assert feed.devices["r1"].burst_readings == 0
    assert feed.devices["r1"].interval_ms == pytest.approx(20_000)
    assert feed.partition.next_deadline() == at(580)  # heard from at 480 s, the partition's time


def test_a_clock_ahead_says_the_device_is_alive_and_nothing_more() -> None:
    feed = Feed()
    feed.steady("m1", 20.0, 400.0)
    feed.stream_to(520.0)  # silent since 400 s, seen at 500 s

    def ahead() -> list[dict[str, Any]]:
        row = (0, feed.offset + 1, "m1", ALIVE, None, "smart_meter", True)
        feed.offset += 1
        return step(feed.partition, pd.DataFrame([row], columns=INPUT_COLUMNS))

    # Alive at the partition's time (510 s), whatever its event time says: the silence ends;
    # its interval and the clock stay.
    ended = only(ahead())
    assert (ended["end_ms"], ended["ended_by"]) == (at(510), ENDED_BY_READING)
    assert feed.devices["m1"].interval_ms == pytest.approx(20_000)
    assert feed.partition.clock_ms == at(520)
    # Overdue again 200 s after 510 s (the bar doubled); a silence counts from its last reading.
    assert feed(("rogue-1", 719.0)) == []
    assert only(feed(("rogue-1", 721.0)))["first_ms"] == at(400)
    assert only(ahead())["end_ms"] == at(711)


def test_records_that_name_no_device_are_skipped_and_leave_the_partition_idle() -> None:
    feed = Feed()
    feed.steady("m1", 20.0, 400.0)
    nameless = pd.DataFrame([(0, feed.offset + 1, None, None, None, None, False)],
                            columns=INPUT_COLUMNS)  # fmt: skip
    assert step(feed.partition, nameless) == []
    assert feed.partition.clock_ms == at(400) and set(feed.devices) == {"m1"}
    # In a micro-batch whose stream time is 600 s they are all the partition received: its
    # timer cannot fire in a micro-batch that brought it input, so it takes the stream's time.
    silent = only(step(feed.partition, nameless, stream_ms=at(600)))
    assert (silent["device_id"], silent["detected_ms"]) == ("m1", at(590))
    # A reading moves the clock itself: the stream's time is not taken.
    assert step(feed.partition, feed.rows(("x", 700.0)), stream_ms=at(5000)) == []
    assert feed.partition.clock_ms == at(700)


def test_an_idle_partition_takes_the_streams_time() -> None:
    feed = Feed()
    feed.steady("m1", 20.0, 400.0)
    assert feed.partition.idle(at(505)) == []  # 495 s: not yet
    silent = only(feed.partition.idle(at(600)))
    assert (silent["device_id"], silent["detected_ms"]) == ("m1", at(590))
    assert feed.partition.idle(at(550)) == []  # the clock never goes back


def test_what_is_decided_does_not_depend_on_how_the_readings_are_cut_into_batches() -> None:
    readings: list[tuple[str, float]] = []
    for t in range(0, 3000, 10):
        readings += [("x", float(t)), ("rogue-1", t + 5.0)]
        if t < 600 or t >= 1200:  # q1: silent from 600 s to 1200 s
            readings.append(("q1", t + 1.0))
        if t == 1800:  # g1 back online: first its buffer, at once
            readings += [("g1", s + 2.0) for s in range(900, 1800, 10)]
        if not 900 <= t < 1800:  # g1: offline from 900 s to 1800 s
            readings.append(("g1", t + 2.0))
    outcomes = []
    for size in (1, 7, 100, len(readings)):
        feed = Feed()
        changes = []
        for i in range(0, len(readings), size):
            changes += feed(*readings[i : i + size])
        latest = {(ch["device_id"], ch["alert_type"], ch["start_ms"]): ch for ch in changes}
        outcomes.append(pd.DataFrame(latest.values(), columns=CHANGE_COLUMNS))
    for other in outcomes[1:]:
        pd.testing.assert_frame_equal(other, outcomes[0])
    kinds = sorted(zip(outcomes[0]["device_id"], outcomes[0]["alert_type"], strict=True))
    assert kinds == [("g1", SILENT), ("g1", LATE_BURST), ("q1", SILENT)]


def test_a_reading_looks_at_its_own_device_not_at_every_device_of_the_partition(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A partition holds thousands of devices at fleet scale, and reads thousands of readings a
    batch. Looking at every device for each reading (to find who is overdue, or whose silence a
    quiet span of the feed was) made the query cost devices x readings: 139 CPU s in one Python
    worker in 5 minutes at 25,000 devices (docs/PERFORMANCE.md). Counted here, not timed: how
    often a device's deadline is asked for, against the readings."""
    asked = 0
    deadline_ms = Device.deadline_ms

    def counted(self: Device, spec: SilenceSpec) -> int | None:
        nonlocal asked
        asked += 1
        return deadline_ms(self, spec)

    monkeypatch.setattr(Device, "deadline_ms", counted)
    devices = [f"m{i}" for i in range(1000)]
    feed = Feed()
    changes: list[dict[str, Any]] = []
    readings = 0
    for second in range(0, 400, 20):  # every device every 20 s (threshold 100 s)
        batch = [(d, second + i / 100) for i, d in enumerate(devices)]
        if second >= 100:  # m0 falls silent after 80 s: the clock passes its deadline
            batch = batch[1:]
        changes += feed(*batch)
        readings += len(batch)
    assert [(ch["device_id"], ch["start_ms"]) for ch in changes] == [("m0", at(80))]
    # About one look per reading (its own device), and a look at all of them each time the
    # clock passes a deadline; the defect was 200 looks per reading.
    assert asked < 3 * readings, (asked, readings)


def test_the_state_of_a_partition_survives_its_round_trip_through_arrow() -> None:
    feed = Feed()
    feed.steady("m1", 20.0, 200.0)
    feed(("g1", 0.0))
    state = dict(feed.devices)
    state["m2"] = Device(device_type=None, last_ms=at(3), heard_ms=at(4), gaps=7,
                         interval_ms=12_345.5, longest_ms=30_000.0, silent_from_ms=at(3),
                         silent_seen_ms=at(90), silent_threshold_ms=61_000, burst_from_ms=at(1),
                         burst_to_ms=at(2), burst_readings=5, burst_behind_ms=9,
                         paused_ms=3_600_000)  # fmt: skip
    state["g2"] = Device(device_type="gps_tracker")
    back = unpack(pack(state))
    assert repr(back) == repr(state)  # NaN, the interval not learned yet, is not equal to itself
    assert math.isnan(back["g2"].interval_ms)
    assert unpack(None) == {}


def test_a_state_written_before_a_field_was_added_loads_with_its_default() -> None:
    import pyarrow as pa

    feed = Feed()
    feed.steady("m1", 20.0, 200.0)
    table = pa.ipc.open_stream(pa.py_buffer(pack(feed.devices))).read_all()
    older = table.drop_columns(["paused_ms"])  # the state of the version before it
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, older.schema) as writer:
        writer.write_table(older)
    assert unpack(sink.getvalue().to_pybytes()) == feed.devices


def test_alert_types_are_the_contracts() -> None:
    assert (SILENT, LATE_BURST) == c.SILENCE_ALERT_TYPES
    assert set(c.SILENCE_ALERT_TYPES) <= set(c.ALERT_TYPES)


def test_the_processor_input_gives_records_that_name_no_device_no_time(spark: Any) -> None:
    # Their time would be the Kafka timestamp alone, and move the watermark: a malformed record
    # sent now would make the partitions of a stream behind the wall clock idle, and silent.
    sent = datetime(2026, 1, 1, 12, 0)
    records = [("m1", b'{"device_id": "m1", "event_time": "2026-01-01T10:00:00Z"}'),
               (None, b"{not json"),
               ("m2", b'{"device_id": "m2", "event_time": "2026-01-01T14:00:00Z"}')]  # fmt: skip
    raw = spark.createDataFrame(
        [(key, value, "t", 0, i, sent) for i, (key, value) in enumerate(records)],
        "key string, value binary, topic string, partition int, offset long, timestamp timestamp",
    )
    registry = spark.createDataFrame(
        [(d, "smart_meter", 52.5, 13.4, "1.0.0", "active") for d in ("m1", "m2")],
        "device_id string, device_type string, site_lat double, site_lon double, "
        "expected_firmware string, status string",
    )
    rows = silence_input(senders(raw), registry, registry.limit(0), lateness="10 seconds",
                         partitions=1)  # fmt: skip
    assert sorted((tuple(r) for r in rows.collect()), key=lambda r: r[1]) == [
        (0, 0, "m1", READING, T0 + 10 * 3600 * 1000, "smart_meter", True),
        (0, 1, None, None, None, None, False),
        (0, 2, "m2", ALIVE, None, "smart_meter", True),  # its clock runs two hours ahead
    ]
