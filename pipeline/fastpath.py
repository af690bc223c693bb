"""The fast path: the checks one event decides, published within milliseconds of its message.

Four rules need no window (``infra.contract.PER_EVENT_ALERT_TYPES``): a device that is not in
the registry (``rogue_device``), a firmware other than the one the registry expects
(``firmware_mismatch``), a reading outside its physical range (``impossible_reading``) and a
device clock running ahead (``clock_ahead``); the last two are readings the parser quarantines.
The fast path raises them for each event, in a query of its own that runs in Spark's Real-time
Mode: long-running tasks, one per Kafka partition, read the telemetry topic and write to the
alerts topic as records arrive, with no micro-batch to wait for (and so without foreachBatch or a
Delta sink, which Real-time Mode does not offer)::

    telemetry topic -> parse (the pipeline's own checks) -> valid events, and readings
      quarantined out of range or ahead -> registry join (stream-static, broadcast)
      -> per-event rules -> alerts topic

Its messages are the windowed path's (``pipeline.publish``), with these differences:

- ``path`` is ``fast`` (``windowed`` on the others);
- a ``firmware_mismatch`` names the firmware its event reports (the windowed path's alert counts
  the window's readings of another firmware: ``pipeline.rules``);
- one message per offending event and window: an event lies in window/slide sliding windows, and
  each message carries the ``alert_id`` the windowed path gives that window's alert, so a
  consumer dropping copies by ``alert_id`` sees each alert once;
- the event that raised it: ``event_id`` and its telemetry message's partition, offset and
  timestamp; ``first_event_time`` and ``last_event_time`` are its event time (for a clock
  ahead, its message's timestamp: the time its windows are counted at); ``detected_at`` is
  when the fast path raised it; ``batch_id`` is null.

The windowed path stays the system of record. It raises the same alerts, with the same ids, once
a window holds the rule's minimum of events, and writes them to the ``alerts`` table. A fast alert
the windowed path never raises is one its window did not confirm (fewer events than the minimum,
or an event later than the watermark).

At least once: the fast path commits its offsets every ``fast_path_checkpoint_interval``; after a
restart it may publish again what it read since the last commit. The registry is read at each
such commit.

A small micro-batch query (``fast_log_rows``) records each fast message in the ``fast_alerts``
table, so the dashboard can say which path raised an alert first.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from infra import contract as c
from pipeline.columns import REASON
from pipeline.features import firmware_differs, with_device
from pipeline.publish import EVENT_FIELDS, FAST, PATH
from pipeline.rules import (
    CLOCK_AHEAD_REASON,
    FIRMWARE_REASON,
    IMPOSSIBLE_REASON,
    ROGUE_REASON,
    SEVERITY,
)
from pipeline.transforms import now

# Timestamps in messages: UTC ISO 8601 to the microsecond, as ``pipeline.publish`` writes them
# (the session time zone is UTC).
ISO_TIME = "yyyy-MM-dd'T'HH:mm:ss.SSSSSS'Z'"


def window_starts(event_time: Column, *, window_s: int, slide_s: int) -> Column:
    """The starts of the sliding windows holding ``event_time``: Spark's ``window(event_time,
    window, slide)`` starts, newest first, as an array."""
    micros, slide_us = F.unix_micros(event_time), F.lit(slide_s * 1_000_000)
    # Integer arithmetic, floored also before 1970 (pmod is never negative), as window() does.
    latest = micros - F.pmod(micros, slide_us)
    back = F.sequence(F.lit(0), F.lit(window_s // slide_s - 1))
    return F.transform(back, lambda k: F.timestamp_micros(latest - k * slide_us))


def alert_id(device_id: Column, alert_type: Column, window_start: Column) -> Column:
    """``pipeline.alerts.alert_id_of`` as a Spark column."""
    start = F.date_format(window_start, "yyyy-MM-dd HH:mm:ss")
    return F.sha2(F.concat_ws("|", device_id, alert_type, start), 256)


def fast_alerts(events: DataFrame, devices: DataFrame, *, window_s: int, slide_s: int) -> DataFrame:
    """One alert row per event that a per-event rule flags and per window holding the event.

    Input: ``events_and_flagged`` rows (a stream or a batch) and the registry. Output: the
    ``alerts`` columns, then ``path`` and EVENT_FIELDS. Stateless: safe in Real-time Mode.

    c.PER_EVENT_ALERT_TYPES, one per event: a valid event of a device not in the registry raises
    ``rogue_device``; one of a registered device reporting another firmware, ``firmware_mismatch``;
    a registered device's reading quarantined out of range, ``impossible_reading``, or with its
    clock ahead, ``clock_ahead`` (counted at its message's Kafka timestamp, as the windowed path
    counts it). A rogue device's quarantined readings raise nothing more: it is already critical.
    """
    reason = F.col(REASON)
    rogue = ~F.col("registered") & reason.isNull()
    cases = [
        (rogue, "rogue_device", F.lit(ROGUE_REASON)),
        (F.col("registered") & (reason == c.REASON_OUT_OF_RANGE), "impossible_reading",
         F.lit(IMPOSSIBLE_REASON)),
        (F.col("registered") & (reason == c.REASON_CLOCK_AHEAD), "clock_ahead",
         F.lit(CLOCK_AHEAD_REASON)),
        (reason.isNull() & firmware_differs(), "firmware_mismatch",
         F.format_string(FIRMWARE_REASON, F.col("firmware"), F.col("expected_firmware"))),
    ]  # fmt: skip

    def first_case(value: Callable[[str, Column], Column]) -> Column:
        chosen: Column = F.lit(None)
        for test, alert_type, text in reversed(cases):
            chosen = F.when(test, value(alert_type, text)).otherwise(chosen)
        return chosen

    alert_type = first_case(lambda kind, _: F.lit(kind))
    at = F.when(reason == c.REASON_CLOCK_AHEAD, F.col("kafka_timestamp")).otherwise(
        F.col("event_time")
    )
    flagged = (
        with_device(events, devices)
        .select("*", alert_type.alias("alert_type"), first_case(lambda _, text: text)
                .alias("_reason"), at.alias("_at"))
        .where(F.col("alert_type").isNotNull())
        .select("*", F.explode(window_starts(F.col("_at"), window_s=window_s, slide_s=slide_s))
                .alias("window_start"))
    )  # fmt: skip
    severity = F.create_map(*(F.lit(x) for t in c.PER_EVENT_ALERT_TYPES for x in (t, SEVERITY[t])))
    values = {
        "alert_id": alert_id(F.col("device_id"), F.col("alert_type"), F.col("window_start")),
        "device_id": F.col("device_id"),
        "alert_type": F.col("alert_type"),
        "severity": F.element_at(severity, F.col("alert_type")),
        "score": F.lit(1.0),
        "reasons": F.array(F.col("_reason")),
        "model_name": F.lit(None).cast("string"),
        "model_version": F.lit(None).cast("string"),
        "window_start": F.col("window_start"),
        "window_end": F.col("window_start") + F.make_dt_interval(secs=F.lit(window_s)),
        "first_event_time": F.col("_at"),
        "last_event_time": F.col("_at"),
        "status": F.lit(c.ALERT_RAISED),
        "detected_at": now(),
        "batch_id": F.lit(None).cast("long"),
        PATH: F.lit(FAST),
        **{name: F.col(name) for name in EVENT_FIELDS},
    }
    return flagged.select(
        *(values[name].cast(kind).alias(name) for name, kind in c.FAST_MESSAGE_COLUMNS)
    )


def fast_messages(alerts: DataFrame) -> DataFrame:
    """``fast_alerts`` rows as Kafka sink records: key ``device_id``, value the JSON message."""
    options = {"timestampFormat": ISO_TIME, "ignoreNullFields": "false"}
    return alerts.select(
        F.col("device_id").alias("key"),
        F.to_json(F.struct(*alerts.columns), options).alias("value"),
    )


def fast_log_rows(messages: DataFrame) -> DataFrame:
    """The alerts topic's fast messages (Kafka source rows) as ``fast_alerts`` table rows; the
    windowed path's messages, and any value that is not a fast message, are skipped."""
    schema = ", ".join(f"`{name}` {kind}" for name, kind in c.FAST_MESSAGE_COLUMNS)
    parsed = messages.select(
        F.from_json(F.col("value").cast("string"), schema, {"timestampFormat": ISO_TIME})
        .alias("m"),
        F.col("timestamp").alias("published_at"),
    )  # fmt: skip
    rows = parsed.where(F.col(f"m.{PATH}") == FAST).select(
        "m.*", F.col("m.first_event_time").alias("event_time"), "published_at"
    )
    return rows.select(*c.column_names(c.FAST_ALERTS_COLUMNS))


_LOCAL = re.compile(r"^local\[(\*|\d+)(,\d+)?\]$|^local$")


def realtime_master(master: str, partitions: int) -> str:
    """A local master with ``partitions`` more task slots: the fast path holds one per Kafka
    partition for as long as it runs, and the micro-batch queries need theirs beside it. Any
    other master is returned as it is (size its cores for both)."""
    found = _LOCAL.match(master)
    if not found:
        return master
    threads, failures = (found.group(1), found.group(2) or "") if found.group(1) else ("1", "")
    base = (os.cpu_count() or 2) if threads == "*" else int(threads)
    return f"local[{base + partitions}{failures}]"
