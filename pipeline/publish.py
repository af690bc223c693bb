"""Alerts leave the lake: every change to an alert row is published to the alerts topic.

A message is the alert's row as the ``alerts`` table holds it after the change (every contract
column, JSON, timestamps in UTC ISO 8601), keyed by ``device_id``, so one device's messages keep
their order in one partition. An alert gives one message when raised and one per later change:
its final values when its window closes, ``status`` ``withdrawn`` when the finished window no
longer calls for it.

At least once: a batch publishes its changes, waits for the broker to acknowledge them, and only
then writes the table. A batch that crashed in between is replayed on the same input and state,
so it publishes the same changes again; one whose table write succeeded finds them written and
publishes nothing. Hence the latest message of an ``alert_id`` is the table's row, and a consumer
drops copies by keeping, per ``alert_id``, the latest message (or the first of each
``status``, to act once per raise and once per withdrawal).

Every message also says which ``path`` raised it: ``windowed`` for these, ``fast`` for the
per-event checks of ``pipeline.fastpath``, which publish straight from their query with the same
``alert_id`` and carry the event that raised them (EVENT_FIELDS). The table's row of an alert is
its latest ``windowed`` message.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

import pandas as pd

from infra import contract as c
from infra.errors import ConfigError
from infra.kafka_client import connect, ensure_topic, librdkafka_options
from infra.settings import CommonSettings
from pipeline.alerts import records

if TYPE_CHECKING:
    from confluent_kafka import KafkaError, Message, Producer

log = logging.getLogger(__name__)

# Which path raised a message: the windowed queries (the table's rows) or the fast path.
PATH, WINDOWED, FAST = "path", "windowed", "fast"
# What a fast-path message adds after ``path``: the event that raised it and its telemetry
# message (c.FAST_MESSAGE_COLUMNS).
_FAST_NAMES = c.column_names(c.FAST_MESSAGE_COLUMNS)
EVENT_FIELDS = tuple(_FAST_NAMES[_FAST_NAMES.index(PATH) + 1 :])
_TIMESTAMPS = {name for name, kind in c.ALERTS_COLUMNS if kind == "timestamp"} | {"kafka_timestamp"}


class AlertPublishError(RuntimeError):
    """The broker did not acknowledge every alert of a batch: the batch fails before it writes
    the table, and its replay publishes them again."""


def _json_value(name: str, value: Any) -> Any:
    if value is None or value is pd.NaT:
        return None
    if isinstance(value, float) and math.isnan(value):
        return None
    if name in _TIMESTAMPS:
        stamp = pd.Timestamp(value)
        stamp = stamp.tz_convert("UTC") if stamp.tzinfo else stamp  # naive: UTC (Spark's session)
        return stamp.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    if name == "reasons":
        return [str(reason) for reason in value]
    if hasattr(value, "item"):  # numpy scalars
        return value.item()
    return value


def alert_message(row: Mapping[str, Any]) -> bytes:
    """The message value of an alert row: its contract columns, then ``path``, as one JSON
    object."""
    fields = {name: _json_value(name, row.get(name)) for name in c.column_names(c.ALERTS_COLUMNS)}
    return json.dumps({**fields, PATH: WINDOWED}, separators=(",", ":")).encode()


def read_alert_message(value: bytes) -> dict[str, Any]:
    """``alert_message`` read back, timestamps as UTC datetimes (consumers and tests)."""
    record: dict[str, Any] = json.loads(value)
    for name in _TIMESTAMPS:
        if record.get(name) is not None:  # "Z": Python 3.10's fromisoformat needs "+00:00"
            record[name] = datetime.fromisoformat(record[name].replace("Z", "+00:00"))
    return record


class AlertPublisher:
    """Publishes alert rows to ``topic``; a call returns once the broker has acknowledged every
    message (``enable.idempotence``: a producer retry is not a copy), or raises
    ``AlertPublishError``."""

    def __init__(self, conf: dict[str, Any], topic: str, *, timeout_s: float = 130.0) -> None:
        self.conf = {
            **conf,
            "enable.idempotence": True,
            "acks": "all",
            # Java's partitioner, as the fast path's Spark Kafka sink uses: one device's messages
            # from both paths share a partition, and so their order.
            "partitioner": "murmur2_random",
            "linger.ms": 5,
            # A broker restart (seconds) is ridden out; an outage longer than this fails the
            # batch, which the reading side would do as well.
            "message.timeout.ms": int((timeout_s - 10) * 1000),
        }
        self.topic = topic
        self.timeout_s = timeout_s
        self._producer: Producer | None = None
        # The detection and firmware queries publish from their own threads; a flush waits for
        # every message in the producer, so one call at a time keeps each call's report its own.
        self._lock = threading.Lock()
        # Set once a call failed: the pipeline is stopping, and the writes that run at stop
        # (``FeaturesBatchWriter.finish``) must not wait for the broker again.
        self.failed: str | None = None

    def _client(self) -> Producer:
        if self._producer is None:
            from confluent_kafka import Producer

            self._producer = Producer(self.conf)
        return self._producer

    def __call__(self, rows: pd.DataFrame) -> None:
        if rows.empty:
            return
        with self._lock:
            self._publish(rows)

    def _publish(self, rows: pd.DataFrame) -> None:
        producer = self._client()
        failed: list[str] = []

        def report(error: KafkaError | None, _message: Message) -> None:
            if error is not None:
                failed.append(error.str())

        for record in records(rows):
            while True:
                try:
                    producer.produce(self.topic, key=str(record["device_id"]).encode(),
                                     value=alert_message(record), on_delivery=report)  # fmt: skip
                    break
                except BufferError:  # the local queue is full: let deliveries drain it
                    producer.poll(0.5)
        started = time.monotonic()
        waiting = producer.flush(self.timeout_s)
        if waiting or failed:
            reason = failed[0] if failed else f"no acknowledgement within {self.timeout_s:.0f} s"
            self.failed = reason
            raise AlertPublishError(
                f"{waiting + len(failed)} of {len(rows)} alerts not published to topic "
                f"{self.topic!r}: {reason}"
            )
        log.debug("%d alert changes published in %.3f s", len(rows), time.monotonic() - started)

    def close(self) -> None:
        if self._producer is not None:
            self._producer.flush(0 if self.failed else self.timeout_s)
            self._producer = None


def client_config(settings: CommonSettings) -> dict[str, Any]:
    """librdkafka options of the pipeline's own clients (alerts topic, webhook relay); their
    log lines go to Python's logging (the log file), not straight to stderr."""
    return {"bootstrap.servers": settings.bootstrap_servers, **librdkafka_options(settings),
            "logger": logging.getLogger("librdkafka")}  # fmt: skip


def ensure_output_topic(settings: CommonSettings, topic: str, *, like: str, setting: str) -> None:
    """Create ``topic`` if absent, with as many partitions and replicas as ``like`` (the
    telemetry topic: ``acks=all`` waits for every replica). At start: a topic that cannot be
    reached or created fails the start, naming the ``setting`` to change."""
    conf = client_config(settings)
    try:
        _, metadata = connect(conf)
        source = metadata.topics.get(like)
        partitions = list(source.partitions.values()) if source else []
        replicas = len(partitions[0].replicas) if partitions else 1
        ensure_topic(conf, topic, max(1, len(partitions)), replication=replicas)
    except ConfigError:
        raise
    except Exception as exc:
        raise ConfigError(
            f"Cannot create or use the topic {topic!r} on {settings.bootstrap_servers}: {exc}. "
            f"Create it, or set {setting} to a topic this user can write."
        ) from None


def alert_publisher(settings: CommonSettings, topic: str, *, like: str) -> AlertPublisher:
    """The publisher of the alerts ``topic``, created if absent (``ensure_output_topic``)."""
    ensure_output_topic(settings, topic, like=like, setting="IOT_PIPELINE_ALERTS_TOPIC")
    return AlertPublisher(client_config(settings), topic)
