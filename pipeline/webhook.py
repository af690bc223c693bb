"""The webhook relay: every message of the alerts topic is POSTed to a URL, retried with backoff;
one that cannot be delivered goes to a dead-letter topic.

The relay is a Kafka consumer of the alerts topic (``pipeline.publish``) in a group of its own,
on a thread of the pipeline process. The stream never waits for it: a slow or dead receiver
delays the POSTs, not the alerts. A message's offset is committed once it was delivered or
dead-lettered, so after a crash or a stop the relay resumes where it was: at least once, like the
topic. The receiver drops copies by ``alert_id`` (also sent as the ``X-Alert-Id`` header) and
``status``.

The fast path (``pipeline.fastpath``) publishes a message per offending event: a device that is
not in the registry gives one every few seconds, all with the same ``alert_id`` for a window.
The relay POSTs the first and skips a fast message whose alert it has already POSTed (it
remembers the last RECENT_ALERTS alert ids). Windowed messages, the table's rows, are always
POSTed. A restarted fast path publishes again what it read since its last commit, so at start the
relay reads back the messages before its committed offsets and remembers their alerts: a fast
copy of an alert relayed before the restart is not POSTed again.
"""

from __future__ import annotations

import http.client
import json
import logging
import threading
import time
import urllib.error
import urllib.request
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from pipeline.publish import FAST, PATH

if TYPE_CHECKING:
    from confluent_kafka import Consumer, KafkaError, Message, Producer

log = logging.getLogger(__name__)

# How many alert ids the relay remembers to skip fast-path copies.
RECENT_ALERTS = 100_000
# How long a start may take to read back the alerts relayed before it.
RECALL_TIMEOUT_S = 60.0
# Retrying these may succeed; any other 4xx means the receiver refuses this message as it is.
_RETRYABLE_STATUS = {408, 425, 429}
_MAX_DELAY_S = 60.0


class DeliveryError(Exception):
    def __init__(self, reason: str, *, retryable: bool) -> None:
        super().__init__(reason)
        self.retryable = retryable


def where(url: str) -> str:
    """The URL as logs and dead letters show it: scheme, host and port (a path or query can hold
    a token)."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.hostname}" + (f":{parts.port}" if parts.port else "")


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """A redirect is an answer other than 2xx: urllib would follow it with a GET, without the
    body, and call the alert delivered."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


_OPENER = urllib.request.build_opener(_NoRedirects())


def post(url: str, body: bytes, *, alert_id: str, timeout_s: float) -> None:
    """POST ``body`` as JSON; returns on a 2xx answer.

    Raises:
        DeliveryError: any other answer, or none; ``retryable`` says whether to try again.
    """
    request = urllib.request.Request(
        url, data=body, method="POST",
        headers={"Content-Type": "application/json", "X-Alert-Id": alert_id},
    )  # fmt: skip
    try:
        with _OPENER.open(request, timeout=timeout_s) as answer:
            answer.read(65536)
    except urllib.error.HTTPError as exc:
        retryable = exc.code >= 500 or exc.code in _RETRYABLE_STATUS
        raise DeliveryError(f"HTTP {exc.code} {exc.reason}", retryable=retryable) from None
    except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
        # Refused, unreachable, timed out, or an answer that is not HTTP.
        reason = getattr(exc, "reason", None) or type(exc).__name__
        raise DeliveryError(f"no answer: {reason}", retryable=True) from None


def delays(attempts: int, first_s: float) -> list[float]:
    """The waits between ``attempts`` tries: ``first_s``, doubling, at most a minute each."""
    return [min(first_s * 2**i, _MAX_DELAY_S) for i in range(max(0, attempts - 1))]


def dead_letter(message: bytes, *, url: str, attempts: int, error: str) -> bytes:
    """The dead-letter record of an alert message that could not be delivered."""
    try:
        alert: Any = json.loads(message)
    except ValueError:
        alert = message.decode(errors="replace")
    return json.dumps({
        "alert": alert, "url": where(url), "attempts": attempts, "error": error,
        "failed_at": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
    }).encode()  # fmt: skip


@dataclass
class WebhookRelay:
    """Relays the alerts ``topic`` to ``url`` on a thread of its own (``start``, ``stop``)."""

    # librdkafka options (bootstrap servers and security) and the URL may hold secrets.
    conf: dict[str, Any] = field(repr=False)
    topic: str
    url: str = field(repr=False)
    dead_letter_topic: str
    group: str
    attempts: int = 5
    first_delay_s: float = 1.0
    timeout_s: float = 5.0
    send: Callable[..., None] = post
    _stop: threading.Event = field(default_factory=threading.Event, repr=False)
    _thread: threading.Thread | None = field(default=None, repr=False)
    # Alert ids POSTed lately, oldest first (only the relay's thread uses it).
    _posted: OrderedDict[str, None] = field(default_factory=OrderedDict, repr=False)

    def start(self) -> WebhookRelay:
        self._thread = threading.Thread(target=self._run, name="webhook-relay", daemon=True)
        self._thread.start()
        log.info("webhook relay: alerts of topic %s to %s", self.topic, where(self.url))
        return self

    def stop(self, timeout_s: float = 30.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _run(self) -> None:
        from confluent_kafka import Consumer, Producer

        # One message may take every try and wait: the group must not drop the consumer meanwhile.
        worst_s = sum(delays(self.attempts, self.first_delay_s)) + self.attempts * self.timeout_s
        consumer = Consumer({
            **self.conf, "group.id": self.group, "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "max.poll.interval.ms": int(max(300.0, worst_s + 60.0) * 1000),
        })  # fmt: skip
        producer = Producer({**self.conf, "enable.idempotence": True, "acks": "all",
                             "message.timeout.ms": 20_000})  # fmt: skip
        try:
            self._recall(consumer)
        except Exception:  # the relay runs on: at worst a fast copy is POSTed again
            log.exception("webhook relay: could not read back the alerts relayed before")
        consumer.subscribe([self.topic])
        try:
            while not self._stop.is_set():
                try:
                    self._relay_next(consumer, producer)
                except Exception:  # never let the relay die: the next poll tries again
                    log.exception("webhook relay: unexpected error; retrying in 5 s")
                    self._stop.wait(5.0)
        finally:
            consumer.close()
            producer.flush(10)

    def _recall(self, consumer: Consumer) -> None:
        """Remember the alerts of the last RECENT_ALERTS messages relayed before this start
        (those before the group's committed offsets)."""
        from confluent_kafka import Consumer, TopicPartition

        topic = consumer.list_topics(self.topic, timeout=10).topics.get(self.topic)
        partitions = [TopicPartition(self.topic, p) for p in (topic.partitions if topic else {})]
        if not partitions:
            return
        ends = {tp.partition: tp.offset for tp in consumer.committed(partitions, timeout=10)
                if tp.offset > 0}  # fmt: skip
        if not ends:
            return
        reader = Consumer({**self.conf, "group.id": f"{self.group}-recall",
                           "enable.auto.commit": False})  # fmt: skip
        try:
            back = RECENT_ALERTS // len(ends)
            starts = []
            for partition, end in ends.items():
                low, _ = reader.get_watermark_offsets(
                    TopicPartition(self.topic, partition), timeout=10
                )
                starts.append(TopicPartition(self.topic, partition, max(low, end - back)))
            reader.assign(starts)
            deadline = time.monotonic() + RECALL_TIMEOUT_S
            while ends and time.monotonic() < deadline:
                for message in reader.consume(1000, timeout=1.0):
                    until = ends.get(message.partition() or 0)
                    if message.error() is not None or until is None:
                        continue
                    offset = message.offset() or 0
                    if offset < until:
                        alert_id, _ = _alert_id_and_path(message.value() or b"")
                        if alert_id:
                            self._remember(alert_id)
                    if offset >= until - 1:
                        del ends[message.partition() or 0]
            if ends:
                log.warning("webhook relay: alerts relayed before the start not all read back "
                            "within %.0f s; a fast copy of one may be POSTed again",
                            RECALL_TIMEOUT_S)  # fmt: skip
        finally:
            reader.close()

    def _relay_next(self, consumer: Consumer, producer: Producer) -> None:
        from confluent_kafka import TopicPartition

        message = consumer.poll(1.0)
        if message is None:
            return
        if message.error() is not None:
            log.warning("webhook relay: %s", message.error())
            return
        try:
            delivered = self._deliver(message, producer)
        except Exception:
            # Read again after the pause, not skipped: a later commit would pass over it.
            consumer.seek(
                TopicPartition(
                    str(message.topic()), message.partition() or 0, message.offset() or 0
                )
            )
            raise
        if delivered:
            consumer.commit(message=message, asynchronous=False)

    def _deliver(self, message: Message, producer: Producer) -> bool:
        """True once delivered or dead-lettered; False when stopped before either (the message
        stays uncommitted and is relayed after the next start)."""
        body = message.value() or b""
        alert_id, path = _alert_id_and_path(body)
        if path == FAST and alert_id in self._posted:
            return True  # a copy: the receiver has this alert
        waits = delays(self.attempts, self.first_delay_s)
        tried = 0
        error = ""
        while True:
            tried += 1
            try:
                self.send(self.url, body, alert_id=alert_id, timeout_s=self.timeout_s)
                self._remember(alert_id)
                return True
            except DeliveryError as exc:
                error = str(exc)
                if not exc.retryable or tried > len(waits):
                    break
                wait = waits[tried - 1]
                log.info("webhook: alert %s not delivered (%s); try %d of %d in %.1f s",
                         alert_id[:12], error, tried + 1, self.attempts, wait)  # fmt: skip
                if self._stop.wait(wait):
                    return False
        log.warning("webhook: alert %s not delivered after %d tries (%s): to topic %s",
                    alert_id[:12], tried, error, self.dead_letter_topic)  # fmt: skip
        record = dead_letter(body, url=self.url, attempts=tried, error=error)
        failed: list[str] = []

        def report(problem: KafkaError | None, _message: Message) -> None:
            if problem is not None:
                failed.append(problem.str())

        producer.produce(self.dead_letter_topic, key=message.key(), value=record,
                         on_delivery=report)  # fmt: skip
        if producer.flush(30) or failed:  # not committed: tried again after a pause
            reason = failed[0] if failed else "no acknowledgement"
            raise RuntimeError(f"dead-letter topic {self.dead_letter_topic!r}: {reason}")
        # Its fast copies are not tried again: each would take every try while the receiver
        # is down.
        self._remember(alert_id)
        return True

    def _remember(self, alert_id: str) -> None:
        self._posted[alert_id] = None
        self._posted.move_to_end(alert_id)
        while len(self._posted) > RECENT_ALERTS:
            self._posted.popitem(last=False)


def _alert_id_and_path(body: bytes) -> tuple[str, str]:
    try:
        record = json.loads(body)
        return str(record.get("alert_id", "")), str(record.get(PATH, ""))
    except (ValueError, AttributeError):
        return "", ""
