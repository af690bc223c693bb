"""Per-device sliding-window features: one definition for the stream and for batch training data.

``with_device`` joins events to the registry; ``window_features`` aggregates them; ``with_labels``
gives each window the registry's strings. All are pure ``DataFrame -> DataFrame`` functions: on a
stream they need a watermark on ``event_time`` first (``window_features`` adds it when
``watermark`` is given); on static data they run as they are.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from infra import contract as c
from pipeline import columns as col
from pipeline.transforms import copy_rank

EARTH_RADIUS_KM = 6371.0
# Metrics whose statistics the detectors and the model read.
STAT_FUNCS = {"mean": F.avg, "std": F.stddev_samp, "min": F.min, "max": F.max}
# Relative error of the distinct counts (HyperLogLog++). At a window's few dozen readings the
# sketch counts almost exactly either way; 0.1 keeps 128 registers (12 longs per metric in the
# window state) instead of 0.05's 512, and the smaller state cut a detection batch at 100,000
# devices by a fifth (docs/PERFORMANCE.md). Changing it changes the window state: see the README
# on upgrades that change the features.
DISTINCT_RSD = 0.1
SLOPE_ORIGIN_S = 1_767_225_600.0  # 2026-01-01 00:00:00 UTC
REGISTRY_COLUMNS = ("device_type", "site_lat", "site_lon", "expected_firmware", "status")
# The registry's strings a window carries (joined after the aggregation: ``with_labels``).
LABELS = ("device_type", "expected_firmware")
# Event columns the feature stage reads; ``is_duplicate`` and ``flag`` are added by
# ``feature_events`` and ``quarantine_feature_events``.
EVENT_COLUMNS = ("device_id", "event_time", "seq", "firmware", "lat", "lon", *c.METRICS)
_EVENT_TYPES = dict(c.TELEMETRY_COLUMNS)
FLAG = "flag"


def feature_events(events: DataFrame, *, duplicates: bool) -> DataFrame:
    """Events in the shape the feature stage reads: EVENT_COLUMNS plus ``is_duplicate`` and
    ``flag`` (null).

    A duplicate (a copy of an event_id already seen) keeps only its device and event time: it
    counts in its window's ``duplicate_count`` and nowhere else. Safe on a stream.
    """
    if not duplicates:
        return events.select(*EVENT_COLUMNS, F.lit(0).alias("is_duplicate"), _no_flag())
    return _counted_only(events, F.col("event_time"), F.lit(1), _no_flag())


def quarantine_feature_events(quarantine: DataFrame) -> DataFrame:
    """The ``quarantine`` rows that count in windows, in the shape the feature stage reads:
    duplicates (``is_duplicate`` 1) and readings that flag their device (``flag``, the alert type
    of their reason: ``infra.contract.QUARANTINE_ALERT_TYPES``). Each keeps only its device and a
    time, and counts in its window's ``duplicate_count`` or ``FLAG_COUNTS`` column only.

    A clock running ahead counts at the time its message was sent (its Kafka timestamp): its own
    event time is the very thing that is wrong. Safe on a stream.
    """
    reason = F.col("reason")
    flags = F.create_map(*(F.lit(x) for pair in c.QUARANTINE_ALERT_TYPES.items() for x in pair))
    rows = quarantine.where((reason == c.REASON_DUPLICATE) | reason.isin(*c.QUARANTINE_ALERT_TYPES))
    at = F.when(reason == c.REASON_CLOCK_AHEAD, F.col("kafka_timestamp")).otherwise(
        F.col("event_time")
    )
    is_duplicate = (reason == c.REASON_DUPLICATE).cast("int")
    return _counted_only(rows, at, is_duplicate, F.element_at(flags, reason))


def _no_flag() -> Column:
    return F.lit(None).cast("string").alias(FLAG)


def _counted_only(events: DataFrame, at: Column, is_duplicate: Column, flag: Column) -> DataFrame:
    return events.select(
        "device_id",
        at.alias("event_time"),
        *(F.lit(None).cast(_EVENT_TYPES[name]).alias(name) for name in EVENT_COLUMNS[2:]),
        is_duplicate.alias("is_duplicate"),
        flag.alias(FLAG),
    )


def batch_feature_input(events: DataFrame) -> DataFrame:
    """Static bronze events (copies included) as the stream sees them: the first copy of each
    event (same event_id and event_time, as the ingest decides within a batch; smallest
    source coordinates) as an event, later copies as duplicates.

    Input: ``valid_events`` output. Not for streams (the stream dedups at ingest).
    """
    ranked = events.withColumn("_copy", copy_rank(col.BRONZE_COORDS))
    firsts = feature_events(ranked.where(F.col("_copy") == 1), duplicates=False)
    return firsts.unionByName(feature_events(ranked.where(F.col("_copy") > 1), duplicates=True))


def haversine_km(lat1: Column, lon1: Column, lat2: Column, lon2: Column) -> Column:
    """Great-circle distance in km; null when any input is null (no location is no distance).

    The null check is explicit: ``least`` skips nulls, so without it a missing coordinate
    would read as half the Earth's circumference (a 20,015 km "jump").
    """
    dlat = F.radians(lat2 - lat1)
    dlon = F.radians(lon2 - lon1)
    a = (
        F.sin(dlat / 2) ** 2
        + F.cos(F.radians(lat1)) * F.cos(F.radians(lat2)) * F.sin(dlon / 2) ** 2
    )
    known = lat1.isNotNull() & lon1.isNotNull() & lat2.isNotNull() & lon2.isNotNull()
    return F.when(known, F.lit(2 * EARTH_RADIUS_KM) * F.asin(F.sqrt(F.least(F.lit(1.0), a))))


def with_device(events: DataFrame, devices: DataFrame) -> DataFrame:
    """Left-join events to the registry; devices not in it are kept with ``registered`` false.

    Input: events with ``device_id``; ``devices`` with the registry columns. Output: the event
    columns plus REGISTRY_COLUMNS and ``registered``. Safe on a stream (stream-static join).
    """
    registry = devices.select("device_id", *REGISTRY_COLUMNS, F.lit(True).alias("registered"))
    return events.join(F.broadcast(registry), "device_id", "left").withColumn(
        "registered", F.coalesce(F.col("registered"), F.lit(False))
    )


def event_measures(events: DataFrame) -> DataFrame:
    """Per-event values the window aggregates need (distance from site, power ratio, ...).

    Input: ``with_device`` output plus ``is_duplicate`` (0 or 1) and ``flag``. Stateless; safe on
    a stream.
    """
    return events.select(
        "*",
        haversine_km(F.col("lat"), F.col("lon"), F.col("site_lat"), F.col("site_lon")).alias(
            "distance_km"
        ),
        # Real power over apparent power: about the power factor; tampering pushes it down.
        F.when(
            (F.col("voltage_v") * F.col("current_a")) > 1.0,
            F.col("power_w") / (F.col("voltage_v") * F.col("current_a")),
        ).alias("power_ratio"),
        firmware_differs().cast("int").alias("fw_mismatch"),
    )


def firmware_differs() -> Column:
    """The event reports a firmware other than the one the registry expects (both known)."""
    return (F.col("firmware").isNotNull() & F.col("expected_firmware").isNotNull()
            & (F.col("firmware") != F.col("expected_firmware")))  # fmt: skip


def _window_aggregates() -> list[Column]:
    """Numbers only: one string in the aggregation buffer (a ``first`` of the device type, a
    ``max_by`` of the firmware) and Spark sorts every batch's rows and aggregates them
    interpreted (``SortAggregate``) instead of hashing them; the registry's strings are joined to
    the windows afterwards (``with_labels``)."""
    valid = (F.col("is_duplicate") == 0) & F.col(FLAG).isNull()

    def over_valid(value: Column) -> Column:
        return F.when(valid, value)

    aggs = [
        F.count_if(valid).cast("long").alias(col.EVENT_COUNT),
        F.sum("is_duplicate").cast("long").alias(col.DUPLICATE_COUNT),
        *(
            F.count_if(F.col(FLAG) == alert_type).cast("long").alias(name)
            for alert_type, name in col.FLAG_COUNTS.items()
        ),
        F.min(over_valid(F.col("event_time"))).alias("first_event_time"),
        F.max(over_valid(F.col("event_time"))).alias("last_event_time"),
        F.min(over_valid(F.col("seq"))).alias("seq_min"),
        F.max(over_valid(F.col("seq"))).alias("seq_max"),
        F.max(F.col("distance_km")).alias("max_distance_km"),
        F.min("lat").alias("lat_min"),
        F.max("lat").alias("lat_max"),
        F.min("lon").alias("lon_min"),
        F.max("lon").alias("lon_max"),
        F.avg("power_ratio").alias("power_ratio_mean"),
        F.min("power_ratio").alias("power_ratio_min"),
        F.sum("fw_mismatch").cast("long").alias("firmware_mismatch_count"),
        F.max(F.col("registered").cast("int")).cast("boolean").alias("registered"),
    ]
    # A slope does not depend on where time starts; its least-squares sums keep more digits over
    # minutes since an origin near the data than since 1970 (there the same window, summed in
    # other micro-batches, differed in the seventh digit).
    minutes = (F.col("event_time").cast("double") - SLOPE_ORIGIN_S) / 60.0
    for metric in c.METRICS:
        for stat, func in STAT_FUNCS.items():
            aggs.append(func(F.col(metric)).alias(f"{metric}_{stat}"))
        # Least-squares trend in units per minute: a drift is steady where noise is not.
        aggs.append(F.regr_slope(F.col(metric), over_valid(minutes)).alias(f"{metric}_slope"))
    for metric in c.REPEAT_METRICS:
        # Exact distinct counts are not allowed on a stream; the sketch is.
        distinct = F.approx_count_distinct(metric, rsd=DISTINCT_RSD)
        share = F.try_divide(distinct, F.count(metric))
        # The sketch can count a few more than there are (about DISTINCT_RSD): a share is <= 1.
        aggs.append(
            F.when(share.isNotNull(), F.least(F.lit(1.0), share)).alias(f"{metric}_distinct_share")
        )
    return aggs


def window_features(
    events: DataFrame,
    *,
    window: str = "10 minutes",
    slide: str = "1 minute",
    watermark: str | None = None,
) -> DataFrame:
    """Aggregate events into per-device sliding windows and derive the features.

    Input: ``event_measures`` output (``device_id``, ``event_time``, metrics, ``is_duplicate``,
    ``distance_km``, ...). Output: one row per (device_id, window_start) with counts and rates,
    mean/std/min/max and trend (``<metric>_slope``, units per minute) per metric, the share of
    distinct readings (``<metric>_distinct_share``, about 1 unless readings repeat), sequence gaps,
    duplicates, quarantined readings that flag the device (``pipeline.columns.FLAG_COUNTS``),
    distance from site, implied speed, power ratio and firmware mismatches. Safe on a stream when
    ``watermark`` is given (late rows beyond it are dropped and counted by Spark).
    """
    if watermark:
        events = events.withWatermark("event_time", watermark)
    grouped = events.groupBy("device_id", F.window("event_time", window, slide).alias("w"))
    features = grouped.agg(*_window_aggregates())
    window_seconds = F.col("w.end").cast("long") - F.col("w.start").cast("long")
    span_hours = (
        F.col("last_event_time").cast("double") - F.col("first_event_time").cast("double")
    ) / 3600.0
    spread_km = haversine_km(F.col("lat_min"), F.col("lon_min"), F.col("lat_max"), F.col("lon_max"))
    expected_events = F.col("seq_max") - F.col("seq_min") + 1
    return features.select(
        "device_id",
        F.col("w.start").alias(col.WINDOW_START),
        F.col("w.end").alias(col.WINDOW_END),
        *[name for name in features.columns if name not in ("device_id", "w")],
        (F.col(col.EVENT_COUNT) * 60.0 / window_seconds).alias("events_per_min"),
        # Readings missing from the device's sequence (negative counts are set to 0).
        F.greatest(F.lit(0), expected_events - F.col(col.EVENT_COUNT)).alias("seq_gap_count"),
        # More readings than sequence numbers: two senders share the id, or a replay.
        F.greatest(F.lit(0), F.col(col.EVENT_COUNT) - expected_events).alias("seq_excess_count"),
        spread_km.alias("spread_km"),
        F.when(span_hours > 0, spread_km / span_hours).alias("implied_speed_kmh"),
    )


def features_from_events(
    events: DataFrame,
    devices: DataFrame,
    *,
    window: str = "10 minutes",
    slide: str = "1 minute",
    watermark: str | None = None,
) -> DataFrame:
    """The whole feature stage: registry join, per-event measures, window aggregates, the
    registry's labels.

    Input: bronze ``telemetry`` rows (and optionally duplicate rows) with an ``is_duplicate``
    column; when absent every row counts as a distinct event. Used by the stream and by training.
    """
    if "is_duplicate" not in events.columns:
        events = events.withColumn("is_duplicate", F.lit(0))
    if FLAG not in events.columns:
        events = events.withColumn(FLAG, F.lit(None).cast("string"))
    return (
        events.transform(lambda df: with_device(df, devices))
        .transform(event_measures)
        .transform(lambda df: window_features(df, window=window, slide=slide, watermark=watermark))
        .transform(lambda df: with_labels(df, devices))
    )


def with_labels(windows: DataFrame, devices: DataFrame) -> DataFrame:
    """``window_features`` rows with the registry's LABELS as the registry reads when the windows
    are computed (on a stream: at each micro-batch); null for a device not in it.

    Safe on a stream (stream-static join, after the aggregation: each micro-batch's changed
    windows only).
    """
    labels = devices.select("device_id", *LABELS)
    return windows.join(F.broadcast(labels), "device_id", "left")
