"""Window features on static data: the trend per metric (``<metric>_slope``) and the share of
distinct readings (``<metric>_distinct_share``)."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import pytest

from pipeline.features import DISTINCT_RSD, features_from_events
from tests.pipeline_helpers import device_series
from tests.unit.pipeline.test_rules import events_df, registry_df

START = datetime(2026, 11, 22, 8, 0, tzinfo=timezone.utc)


def test_slope_is_the_trend_in_units_per_minute(spark: Any) -> None:
    drifting = device_series("travel", START, 20)  # a registered id; every 30 s
    for i, event in enumerate(drifting):
        event["metrics"]["temperature_c"] = 21.0 + 0.75 * i  # +1.5 degrees a minute
    events = events_df(spark, device_series("clean", START, 20)).unionByName(
        events_df(spark, drifting)
    )
    features = features_from_events(events, registry_df(spark), window="10 minutes",
                                     slide="10 minutes")  # fmt: skip
    rows = {r.device_id: r for r in features.where("event_count >= 10").collect()}
    assert rows["travel"].temperature_c_slope == pytest.approx(1.5)
    # The clean series' small periodic noise has next to no trend.
    assert abs(rows["clean"].temperature_c_slope) < 0.05
    assert rows["clean"].humidity_pct_slope is None  # a meter has no humidity sensor


def test_distinct_share_shows_a_sensor_that_repeats_one_value(spark: Any) -> None:
    stuck = device_series("travel", START, 20)  # every 30 s
    for event in stuck[5:]:  # stuck for the last 15 of the window's 20 readings
        event["metrics"]["power_w"] = 500.0
    events = events_df(spark, device_series("clean", START, 20)).unionByName(
        events_df(spark, stuck)
    )
    features = features_from_events(events, registry_df(spark), window="10 minutes",
                                     slide="10 minutes")  # fmt: skip
    rows = {r.device_id: r for r in features.where("event_count >= 10").collect()}
    # Distinct readings are counted by a sketch, within about DISTINCT_RSD.
    assert rows["travel"].power_w_distinct_share == pytest.approx(6 / 20, rel=DISTINCT_RSD)
    # The clean series repeats its temperature (3 values) but never its power.
    assert rows["clean"].power_w_distinct_share == pytest.approx(1.0, rel=DISTINCT_RSD)
    assert rows["clean"].power_w_distinct_share <= 1.0
    assert rows["clean"].temperature_c_distinct_share == pytest.approx(3 / 20, rel=DISTINCT_RSD)
    assert rows["clean"].humidity_pct_distinct_share is None  # a meter has no humidity sensor


def test_a_window_carries_the_registry_s_labels_not_its_events_firmware(spark: Any) -> None:
    events = events_df(spark, device_series("firmware", START, 4, firmware="6.6.6")).unionByName(
        events_df(spark, device_series("rogue", START, 3))
    )
    features = features_from_events(events, registry_df(spark), window="10 minutes",
                                     slide="10 minutes")  # fmt: skip
    got = sorted(
        (r.device_id, r.device_type, r.expected_firmware, r.registered, r.firmware_mismatch_count)
        for r in features.collect()
    )
    assert got == [("firmware", "smart_meter", "1.0.0", True, 4), ("rogue", None, None, False, 0)]
    assert "last_firmware" not in features.columns


def test_the_window_aggregation_hashes_its_rows(spark: Any) -> None:
    """A string in the aggregation buffer (say, a ``first`` of the device type) makes Spark sort
    each micro-batch's rows and aggregate them interpreted; hashing them cut detection's task CPU
    at 5,000 events/s by 10-16 % (docs/PERFORMANCE.md, session 60)."""
    events = events_df(spark, device_series("clean", START, 4))
    features = features_from_events(events, registry_df(spark), window="10 minutes",
                                     slide="5 minutes", watermark="5 minutes")  # fmt: skip
    plan = features._jdf.queryExecution().executedPlan().toString()
    assert "HashAggregate" in plan
    assert "SortAggregate" not in plan and "ObjectHashAggregate" not in plan


def test_a_slope_does_not_depend_on_how_its_window_was_split(spark: Any) -> None:
    """The same window summed in other partitions or micro-batches: the same trend to eight
    digits (the exactly-once tests compare features across runs to seven)."""
    import random

    from pyspark.sql import functions as F

    rng = random.Random(1)
    events = []
    for device in ("clean", "travel", "stuck", "flood"):
        series = device_series(device, START, 600, every_s=0.97)  # ten minutes, about 1 Hz
        for i, event in enumerate(series):
            event["metrics"]["power_w"] = 400 + 0.01 * i + rng.gauss(0, 3)
        events += series
    frame = events_df(spark, events)

    def slopes(split: Any) -> dict[str, float]:
        features = features_from_events(split, registry_df(spark), window="10 minutes",
                                         slide="10 minutes")  # fmt: skip
        return {r.device_id: r.power_w_slope for r in
                features.where("event_count > 500").collect()}  # fmt: skip

    whole = slopes(frame.coalesce(1))
    assert len(whole) == 4
    for seed in range(3):
        split = slopes(frame.orderBy(F.rand(seed)).repartition(7))
        # Over epoch minutes they differed by about 1e-7; since SLOPE_ORIGIN_S, about 1e-9.
        assert all(split[d] == pytest.approx(whole[d], rel=1e-8, abs=0) for d in whole)
