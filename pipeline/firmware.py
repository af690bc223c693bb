"""Firmware tamper detection: reported firmware changes joined, stream to stream, with the
authorized updates.

firmware_ingest: topic iot.firmware_updates -> parse -> quarantine | ``firmware_updates`` (Delta)
firmware:        telemetry (Delta stream) + registry -> events whose firmware is not the
                 registered one -> LEFT OUTER JOIN ``firmware_updates`` (Delta stream) on device,
                 firmware and ``authorized_at`` within [event_time - grace, event_time +
                 watermark] -> events no update authorizes -> ``firmware_tamper`` alerts (MERGE)

Both sides carry a watermark and the join condition bounds time, so Spark drops join state once
the watermark has passed it, and emits an unmatched change only when no update can match it any
more. The session uses the ``max`` watermark policy (see ``infra.spark``): the update topic is
quiet most of the time and must not hold back the telemetry's watermark.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from infra import contract as c
from infra import lake
from pipeline import columns as col
from pipeline.alerts import Publish, alert_frame, upsert_alerts
from pipeline.features import firmware_differs, with_device
from pipeline.sinks import idempotent_append, side_by_side
from pipeline.transforms import now

log = logging.getLogger(__name__)

TAMPER = "firmware_tamper"
_UPDATE_STRUCT = "`update` map<string, variant>, `end` boolean, `_corrupt` string"


def parse_firmware_updates(raw: DataFrame) -> DataFrame:
    """Parse update records; ``reason`` is null for a valid update.

    Input: the Kafka source's shape (key, value, topic, partition, offset, timestamp). Output:
    the ``firmware_updates`` columns plus the raw ones, ``reason`` and ``detail``. Stateless.
    """
    # As for telemetry (``pipeline.transforms``): the value parsed as the first member of a
    # wrapper object, so text after the update is an error; fields as variants, so a number is
    # not taken for a string.
    wrapped = F.concat(F.lit('{"update":'), F.col(col.VALUE).cast("string"), F.lit(',"end":true}'))
    options = {"columnNameOfCorruptRecord": "_corrupt"}
    decoded = raw.select("*", F.from_json(wrapped, _UPDATE_STRUCT, options).alias("_j"))
    not_object = (F.col("_j.update").isNull() | F.col("_j._corrupt").isNotNull()
                  | F.col("_j.end").isNull())  # fmt: skip

    def kind(name: str) -> Column:
        """The field's JSON type (null when absent; VOID for JSON null)."""
        return F.schema_of_variant(F.col("_j.update")[name])

    def string(name: str) -> Column:
        return F.when(kind(name) == "STRING", F.col("_j.update")[name].cast("string"))

    def first_of(names: tuple[str, ...], test: Callable[[str], Column]) -> Column:
        return F.coalesce(*(F.when(test(name), F.lit(name)) for name in names))

    required = c.FIRMWARE_UPDATE_REQUIRED
    optional = tuple(n for n in ("update_id",) if n not in required)
    missing = first_of(required, lambda n: kind(n).isNull() | (kind(n) == "VOID"))
    wrong = first_of((*required, *optional), lambda n: kind(n).isNotNull()
                     & ~kind(n).isin("STRING", "VOID"))  # fmt: skip
    authorized_at = F.try_to_timestamp(string("authorized_at"))
    typed = decoded.select(
        "*",
        F.coalesce(string("update_id"), F.sha2(F.col(col.VALUE), 256)).alias("update_id"),
        string("device_id").alias("device_id"),
        string("firmware").alias("firmware"),
        authorized_at.alias("authorized_at"),
        F.substring(string("authorized_at"), 1, 64).alias("_authorized_text"),
        not_object.alias("_not_object"),
        missing.alias("_missing"),
        wrong.alias("_wrong"),
        now().alias("ingest_time"),
    )
    reason = (
        F.when(F.col("_not_object"), F.lit(c.REASON_INVALID_JSON))
        .when(F.col("_missing").isNotNull(), F.lit(c.REASON_MISSING_FIELD))
        .when(F.col("_wrong").isNotNull(), F.lit(c.REASON_WRONG_TYPE))
        .when(F.col("authorized_at").isNull(), F.lit(c.REASON_BAD_TIMESTAMP))
    )
    detail = (
        F.when(F.col("_not_object"), F.lit("firmware update is not one JSON object"))
        .when(F.col("_missing").isNotNull(), F.concat(F.lit("missing "), F.col("_missing")))
        .when(F.col("_wrong").isNotNull(), F.concat(F.col("_wrong"), F.lit(" is not a string")))
        .when(F.col("authorized_at").isNull(),
              F.concat(F.lit("authorized_at: "), F.col("_authorized_text")))
    )  # fmt: skip
    return typed.select("*", reason.alias(col.REASON), detail.alias(col.DETAIL)).drop(
        "_j", "_authorized_text", "_not_object", "_missing", "_wrong"
    )


def valid_updates(parsed: DataFrame) -> DataFrame:
    """Valid rows of ``parse_firmware_updates`` in the ``firmware_updates`` table's shape."""
    return parsed.where(F.col(col.REASON).isNull()).select(
        "update_id", "device_id", "firmware", "authorized_at",
        F.col(col.TOPIC).alias("kafka_topic"), F.col(col.PARTITION).alias("kafka_partition"),
        F.col(col.OFFSET).alias("kafka_offset"), F.col(col.TIMESTAMP).alias("kafka_timestamp"),
        "ingest_time",
    )  # fmt: skip


def rejected_updates(parsed: DataFrame) -> DataFrame:
    """Invalid rows of ``parse_firmware_updates`` in the ``quarantine`` table's shape."""
    return parsed.where(F.col(col.REASON).isNotNull()).select(
        F.col(col.VALUE).alias("raw_value"), F.col(col.KEY).alias("raw_key"),
        F.col(col.REASON).alias("reason"), F.col(col.DETAIL).alias("detail"), "device_id",
        F.col("update_id").alias("event_id"), F.col("authorized_at").alias("event_time"),
        F.col(col.TOPIC).alias("kafka_topic"), F.col(col.PARTITION).alias("kafka_partition"),
        F.col(col.OFFSET).alias("kafka_offset"), F.col(col.TIMESTAMP).alias("kafka_timestamp"),
        "ingest_time",
    )  # fmt: skip


def firmware_changes(
    events: DataFrame, devices: DataFrame, *, watermark: str | None = None
) -> DataFrame:
    """Events reporting a firmware other than the registry's expected one (registered devices).

    Input: telemetry rows; ``devices``: the registry. Output: device_id, event_time, firmware,
    expected_firmware. Safe on a stream (stream-static join). The ``watermark`` is set on every
    event, before the filter: an unmatched change is decided once time has moved on for the
    fleet, not only once another change arrives (which may be never).
    """
    events = events.select("device_id", "event_time", "firmware")
    if watermark:
        events = events.withWatermark("event_time", watermark)
    joined = with_device(events, devices)
    return joined.where(firmware_differs()).select(
        "device_id", "event_time", "firmware", "expected_firmware"
    )


def unauthorized_changes(
    changes: DataFrame, updates: DataFrame, *, grace: str, watermark: str | None = None
) -> DataFrame:
    """The changes that no update authorizes: same device and firmware, ``authorized_at`` from
    ``grace`` before the event up to ``watermark`` after it.

    Input: ``firmware_changes`` output (on streams, with its ``watermark``); ``updates`` with
    device_id, firmware, authorized_at, update_id. Output: the change columns. On streams
    ``watermark`` is required: it bounds the join state and decides when an unmatched change is
    final (left outer join).
    """
    after = watermark or "0 seconds"
    right = updates.select(
        F.col("device_id").alias("u_device_id"), F.col("firmware").alias("u_firmware"),
        "authorized_at", "update_id",
    )  # fmt: skip
    if watermark:
        right = right.withWatermark("authorized_at", watermark)
    condition = (
        (F.col("device_id") == F.col("u_device_id"))
        & (F.col("firmware") == F.col("u_firmware"))
        & (F.col("authorized_at") >= F.col("event_time") - F.expr(f"INTERVAL {grace}"))
        & (F.col("authorized_at") <= F.col("event_time") + F.expr(f"INTERVAL {after}"))
    )
    return (
        changes.join(right, condition, "leftOuter")
        .where(F.col("update_id").isNull())
        .select("device_id", "event_time", "firmware", "expected_firmware")
    )


def tamper_windows(unauthorized: DataFrame, *, window: str) -> DataFrame:
    """Per device and window of ``unauthorized_changes`` rows: the window, its first and last
    unauthorized event times, the firmware reported and the one expected.

    Windows are tumbling, ``window`` long, so the alert_id of a device's window is the same in
    every micro-batch. Not for streams: use it inside ``foreachBatch`` or on static data.
    """
    grouped = unauthorized.groupBy("device_id", F.window("event_time", window).alias("w")).agg(
        F.min("event_time").alias("first_event_time"),
        F.max("event_time").alias("last_event_time"),
        # Two readings at the same time: the greater firmware, whichever micro-batch read it.
        F.max_by("firmware", F.struct("event_time", "firmware")).alias("firmware"),
        F.first("expected_firmware").alias("expected_firmware"),
    )
    return grouped.select(
        "device_id", F.col("w.start").alias(col.WINDOW_START), F.col("w.end").alias(col.WINDOW_END),
        "first_event_time", "last_event_time", "firmware", "expected_firmware",
    )  # fmt: skip


def tamper_alerts(windows: pd.DataFrame) -> pd.DataFrame:
    """One ``firmware_tamper`` alert per row of ``tamper_windows`` (DETECTOR_COLUMNS)."""
    reasons = [
        f"firmware {found} reported with no authorized update (registry expects {expected})"
        for found, expected in zip(windows["firmware"], windows["expected_firmware"], strict=True)
    ]
    return alert_frame(windows, TAMPER, "critical", 1.0, pd.Series(reasons, index=windows.index))


@dataclass
class FirmwareIngestWriter:
    """``foreachBatch`` of the update topic: valid updates to ``firmware_updates``, the rest to
    ``quarantine``, each append idempotent per batch."""

    lake_root: str
    app_id: str

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        parsed = parse_firmware_updates(batch).localCheckpoint(eager=True)
        side_by_side(
            lambda: idempotent_append(valid_updates(parsed),
                                      lake.table_path(self.lake_root, lake.FIRMWARE_UPDATES),
                                      f"{self.app_id}-firmware-updates", batch_id),
            lambda: idempotent_append(rejected_updates(parsed),
                                      lake.table_path(self.lake_root, lake.QUARANTINE),
                                      f"{self.app_id}-firmware-quarantine", batch_id),
        )  # fmt: skip


@dataclass
class TamperBatchWriter:
    """``foreachBatch`` of the join: MERGE tamper alerts (a replayed batch changes nothing); with
    ``publish``, the rows the MERGE changes are published first (``pipeline.publish``)."""

    lake_root: str
    window: str
    publish: Publish | None = None

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        windows = tamper_windows(batch, window=self.window).toPandas()
        if windows.empty:  # most batches: a MERGE of nothing would still plan, scan and commit
            return
        path = lake.table_path(self.lake_root, lake.ALERTS)
        upsert_alerts(batch.sparkSession, tamper_alerts(windows), batch_id, path=path,
                      publish=self.publish)  # fmt: skip
