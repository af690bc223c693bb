"""Deterministic detection rules over window features (pure; batch or ``foreachBatch`` data).

Each rule is a named condition on one features row plus a severity, a score and a reason text.
``rule_alerts`` turns features into one row per (device, window, alert type) that fired.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from infra import contract as c
from pipeline import columns as col


@dataclass(frozen=True)
class Thresholds:
    """Rule thresholds; defaults suit devices that report every 10-30 s."""

    max_speed_kmh: float = 900.0  # faster than an airliner
    min_travel_km: float = 50.0
    clone_min_excess: int = 2  # readings beyond the sequence range
    flood_events_per_min: float = 30.0
    stuck_min_events: int = 8
    tamper_power_ratio: float = 0.5  # real power over voltage x current
    min_events: int = 3


@dataclass(frozen=True)
class Rule:
    alert_type: str
    severity: str
    condition: Column
    score: Column
    reason: Column


def rules(t: Thresholds) -> list[Rule]:
    def num(name: str) -> Column:
        return F.coalesce(F.col(name), F.lit(0))

    stuck_metrics = [
        F.when(
            (F.col(f"{m}_std") == 0) & F.col(f"{m}_mean").isNotNull()
            & (F.col(col.EVENT_COUNT) >= t.stuck_min_events),
            F.lit(m),
        )
        for m in c.REPEAT_METRICS
    ]  # fmt: skip
    stuck = F.concat_ws(",", *stuck_metrics)
    return [
        Rule("rogue_device", "critical", ~F.col("registered"), F.lit(1.0),
             F.lit("device_id is not in the device registry")),
        Rule("impossible_travel", "high",
             (num("implied_speed_kmh") > t.max_speed_kmh) & (num("spread_km") > t.min_travel_km),
             F.least(F.lit(1.0), num("implied_speed_kmh") / (4 * t.max_speed_kmh)),
             F.format_string("moved %.0f km at %.0f km/h", num("spread_km"),
                             num("implied_speed_kmh"))),
        Rule("cloned_device", "high", num("seq_excess_count") >= t.clone_min_excess,
             F.least(F.lit(1.0), num("seq_excess_count") / num(col.EVENT_COUNT)),
             F.format_string("%d readings beyond the sequence range, spread %.1f km",
                             num("seq_excess_count"), num("spread_km"))),
        Rule("replay", "high", num(col.DUPLICATE_COUNT) > 0,
             F.least(F.lit(1.0), num(col.DUPLICATE_COUNT) / F.greatest(num(col.EVENT_COUNT),
                                                                          F.lit(1))),
             F.format_string("%d messages re-sent with an event_id already seen",
                             num(col.DUPLICATE_COUNT))),
        Rule("firmware_mismatch", "medium", num("firmware_mismatch_count") > 0,
             num("firmware_mismatch_count") / F.greatest(num(col.EVENT_COUNT), F.lit(1)),
             F.format_string("firmware %s, registry expects %s", F.col("last_firmware"),
                             F.col("expected_firmware"))),
        Rule("flood", "medium", num("events_per_min") > t.flood_events_per_min,
             F.least(F.lit(1.0), num("events_per_min") / (10 * t.flood_events_per_min)),
             F.format_string("%.1f messages/min", num("events_per_min"))),
        Rule("stuck_sensor", "medium", stuck != "", F.lit(0.8),
             F.concat(F.lit("constant readings: "), stuck)),
        Rule("tampering", "high",
             F.col("power_ratio_mean").isNotNull()
             & (F.col("power_ratio_mean") < t.tamper_power_ratio),
             F.lit(1.0) - F.coalesce(F.col("power_ratio_mean"), F.lit(0.0)),
             F.format_string("power is %.0f%% of voltage x current",
                             F.col("power_ratio_mean") * 100)),
    ]  # fmt: skip


def alert_id(device_id: Column, alert_type: Column, window_start: Column) -> Column:
    """Deterministic key: the same device, window and type always give the same id."""
    return F.sha2(F.concat_ws("|", device_id, alert_type, window_start.cast("string")), 256)


def rule_alerts(features: DataFrame, thresholds: Thresholds | None = None) -> DataFrame:
    """One row per (device, window, alert type) whose rule fired.

    Input: ``window_features`` output. Output: alert_id, device_id, alert_type, severity, score,
    reasons (array), window_start, window_end, first_event_time, last_event_time.
    """
    t = thresholds or Thresholds()
    eligible = features.where(F.col(col.EVENT_COUNT) + F.col(col.DUPLICATE_COUNT) >= t.min_events)
    fired = F.array(
        *(
            F.when(
                F.coalesce(r.condition, F.lit(False)),
                F.struct(
                    F.lit(r.alert_type).alias("alert_type"),
                    F.lit(r.severity).alias("severity"),
                    r.score.cast("double").alias("score"),
                    F.array(r.reason).alias("reasons"),
                ),
            )
            for r in rules(t)
        )
    )
    return (
        eligible.select(
            "device_id", col.WINDOW_START, col.WINDOW_END, "first_event_time", "last_event_time",
            F.explode(F.filter(fired, lambda x: x.isNotNull())).alias("a"),
        )
        .select(
            alert_id(F.col("device_id"), F.col("a.alert_type"), F.col(col.WINDOW_START)).alias(
                "alert_id"
            ),
            "device_id", "a.alert_type", "a.severity", "a.score", "a.reasons",
            col.WINDOW_START, col.WINDOW_END, "first_event_time", "last_event_time",
        )
    )  # fmt: skip
