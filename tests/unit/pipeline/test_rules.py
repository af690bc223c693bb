"""Each rule fires on its scenario and stays silent on clean data (feature code + rules, batch)."""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from pyspark.sql import functions as F

from infra import contract as c
from pipeline.features import features_from_events
from pipeline.profiles import LEARNED_RATE, learned_distinct
from pipeline.rules import RuleThresholds, rule_alerts
from tests.pipeline_helpers import device_series

START = datetime(2026, 11, 22, 8, 0, tzinfo=timezone.utc)
REGISTERED = ["clean", "travel", "clone", "replay", "firmware", "flood", "stuck", "tamper"]


def events_df(spark: Any, events: list[dict[str, Any]], duplicates: int = 0) -> Any:
    rows = [
        {**{k: v for k, v in e.items() if k != "metrics"}, **e["metrics"],
         "event_time": datetime.fromisoformat(e["event_time"].replace("Z", "+00:00")),
         "is_duplicate": 0}
        for e in events
    ]  # fmt: skip
    rows += [{**rows[i], "is_duplicate": 1} for i in range(duplicates)]
    schema = ", ".join(
        ["event_id string", "device_id string", "event_time timestamp", "seq long",
         "firmware string", "lat double", "lon double"]
        + [f"{m} double" for m in c.METRICS] + ["is_duplicate int"]
    )  # fmt: skip
    return spark.createDataFrame(
        [{k: r.get(k) for k in [f.split()[0] for f in schema.split(", ")]} for r in rows], schema
    )


def registry_df(spark: Any) -> Any:
    return spark.createDataFrame(
        [(d, "smart_meter", 52.52, 13.40, "1.0.0", "active") for d in REGISTERED],
        "device_id string, device_type string, site_lat double, site_lon double, "
        "expected_firmware string, status string",
    )


@pytest.fixture(scope="module")
def alert_rows(spark: Any) -> Any:
    travel = device_series("travel", START, 20)
    for e in travel[10:]:
        e["lat"], e["lon"] = 40.4, -3.7  # Berlin to Madrid in 30 seconds
    clone_a = device_series("clone", START, 20, every_s=30)
    clone_b = device_series("clone", START + timedelta(seconds=15), 20, lat=52.53, lon=13.41)
    stuck = device_series("stuck", START, 20, metrics={"temperature_c": 21.5})
    tamper = device_series("tamper", START, 20)
    for e in tamper:  # reported power drops to 30% of voltage x current
        e["metrics"]["power_w"] = e["metrics"]["voltage_v"] * e["metrics"]["current_a"] * 0.3
    parts = [
        events_df(spark, device_series("clean", START, 20)),
        events_df(spark, device_series("rogue", START, 20)),
        events_df(spark, travel),
        events_df(spark, clone_a + clone_b),
        events_df(spark, device_series("replay", START, 20), duplicates=4),
        events_df(spark, device_series("firmware", START, 20, firmware="6.6.6")),
        events_df(spark, device_series("flood", START, 400, every_s=1.5)),
        events_df(spark, stuck),
        events_df(spark, tamper),
    ]
    events = parts[0]
    for part in parts[1:]:
        events = events.unionByName(part)
    features = features_from_events(
        events, registry_df(spark), window="10 minutes", slide="5 minutes"
    )
    return rule_alerts(features.toPandas())


@pytest.fixture(scope="module")
def alerts(alert_rows: Any) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for row in alert_rows.itertuples():
        found.setdefault(row.device_id, set()).add(row.alert_type)
    return found


@pytest.mark.parametrize(
    ("device", "alert_type"),
    [("rogue", "rogue_device"), ("travel", "impossible_travel"), ("clone", "cloned_device"),
     ("replay", "replay"), ("firmware", "firmware_mismatch"), ("flood", "flood"),
     ("stuck", "stuck_sensor"), ("tamper", "tampering")],
)  # fmt: skip
def test_rule_fires_on_its_scenario(
    alerts: dict[str, set[str]], device: str, alert_type: str
) -> None:
    assert alert_type in alerts.get(device, set())


def test_clean_device_raises_nothing(alerts: dict[str, set[str]]) -> None:
    assert "clean" not in alerts


def test_a_firmware_mismatch_says_how_many_readings_and_what_the_registry_expects(
    alert_rows: Any,
) -> None:
    mismatches = alert_rows[alert_rows["alert_type"] == "firmware_mismatch"]
    # 20 readings every 30 s from 08:00: the windows from 07:55, 08:00 and 08:05 hold 10, 20, 10.
    got = [(start.strftime("%H:%M"), reasons) for start, reasons in
           zip(mismatches["window_start"], mismatches["reasons"], strict=True)]  # fmt: skip
    text = "%d readings of a firmware other than the registry's 1.0.0"
    assert sorted(got) == [("07:55", [text % 10]), ("08:00", [text % 20]), ("08:05", [text % 10])]


def test_each_scenario_raises_only_its_own_kind(alerts: dict[str, set[str]]) -> None:
    assert alerts["firmware"] == {"firmware_mismatch"}
    assert alerts["replay"] == {"replay"}
    assert alerts["tamper"] == {"tampering"}
    assert alerts["stuck"] == {"stuck_sensor"}


def test_alert_ids_are_deterministic(spark: Any) -> None:
    events = events_df(spark, device_series("rogue", START, 10))
    features = features_from_events(
        events, registry_df(spark), window="10 minutes", slide="5 minutes"
    )
    first = sorted(rule_alerts(features.toPandas())["alert_id"])
    second = sorted(rule_alerts(features.toPandas())["alert_id"])
    assert first == second and len(first) == len(set(first)) > 0
    # The same id as SQL computes it from the alert's columns (README: the alerts table).
    text = F.concat_ws("|", F.col("device_id"), F.lit("rogue_device"),
                       F.col("window_start").cast("string"))  # fmt: skip
    sql_ids = sorted(
        r.alert_id for r in features.select(F.sha2(text, 256).alias("alert_id")).collect()
    )
    assert first == sql_ids


def test_no_location_is_no_travel(spark: Any) -> None:
    """A device without GPS (lat/lon null) is never read as moving to the antipode."""
    events = events_df(spark, device_series("clean", START, 20, lat=None, lon=None))
    features = features_from_events(
        events, registry_df(spark), window="10 minutes", slide="5 minutes"
    ).toPandas()
    assert features["spread_km"].isna().all() and features["implied_speed_kmh"].isna().all()
    assert features["max_distance_km"].isna().all()
    assert rule_alerts(features).empty


def test_a_1hz_device_is_no_flood_once_its_rate_is_learned(spark: Any) -> None:
    events = events_df(spark, device_series("clean", START, 1200, every_s=1))
    features = features_from_events(
        events, registry_df(spark), window="10 minutes", slide="5 minutes"
    ).toPandas()
    assert set(rule_alerts(features)["alert_type"]) == {"flood"}  # cold start: type threshold
    learned = features.assign(**{LEARNED_RATE: 60.0})
    assert rule_alerts(learned).empty
    flooding = learned.assign(events_per_min=400.0)
    assert set(rule_alerts(flooding)["alert_type"]) == {"flood"}


def test_stuck_is_a_share_of_distinct_readings_far_below_the_device_s_own(spark: Any) -> None:
    """A coarse sensor repeats readings as a matter of course (usual share 0.5): a window at 0.25
    is its normal noise, at 0.1 it is stuck; a fine sensor (usual 0.95) at 0.25 is stuck."""
    events = events_df(spark, device_series("clean", START, 40))
    features = features_from_events(
        events, registry_df(spark), window="10 minutes", slide="5 minutes"
    ).toPandas()
    usual = learned_distinct("temperature_c")

    def stuck(share: float, usual_share: float) -> bool:
        window = features.assign(temperature_c_distinct_share=share, **{usual: usual_share})
        return "stuck_sensor" in set(rule_alerts(window)["alert_type"])

    assert not stuck(0.25, 0.5) and stuck(0.1, 0.5)
    assert stuck(0.25, 0.95) and not stuck(0.35, 0.95)


def test_thresholds_per_device_type_from_configuration(spark: Any) -> None:
    events = events_df(spark, device_series("flood", START, 400, every_s=1.5))
    features = features_from_events(
        events, registry_df(spark), window="10 minutes", slide="5 minutes"
    ).toPandas()
    assert set(rule_alerts(features)["alert_type"]) == {"flood"}
    quiet = RuleThresholds.parse('{"smart_meter": {"flood_events_per_min": 100}}')
    assert rule_alerts(features, quiet).empty
    other_type = RuleThresholds.parse('{"thermostat": {"flood_events_per_min": 100}}')
    assert set(rule_alerts(features, other_type)["alert_type"]) == {"flood"}
    everywhere = RuleThresholds.parse('{"*": {"flood_events_per_min": 100}}')
    assert rule_alerts(features, everywhere).empty


@pytest.mark.parametrize(
    ("text", "message"),
    [("{", "not JSON"), ('{"smart_meter": 3}', "map a device type"),
     ('{"*": {"flood_rate": 3}}', "unknown ['flood_rate']"),
     ('{"*": {"flood_factor": "high"}}', "must be numbers")],
)  # fmt: skip
def test_bad_rule_thresholds_say_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        RuleThresholds.parse(text)
