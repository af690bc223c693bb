"""Window features on static data: the trend per metric (``<metric>_slope``)."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import pytest

from pipeline.features import features_from_events
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
