"""The webhook relay's pure parts: backoff, what logs show of the URL, the dead letter."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from pipeline.webhook import DeliveryError, WebhookRelay, dead_letter, delays, where


def test_retries_wait_longer_each_time_up_to_a_minute() -> None:
    assert delays(5, 1.0) == [1.0, 2.0, 4.0, 8.0]
    assert delays(1, 1.0) == []
    assert delays(10, 10.0)[-3:] == [60.0, 60.0, 60.0]


def test_logs_and_dead_letters_show_the_host_not_a_token() -> None:
    assert (
        where("https://hooks.example.com/services/T0/B0/s3cret?x=1") == "https://hooks.example.com"
    )
    assert where("http://127.0.0.1:8080/alerts") == "http://127.0.0.1:8080"


def test_a_dead_letter_holds_the_alert_the_tries_and_the_last_error() -> None:
    letter = json.loads(dead_letter(b'{"alert_id": "a1"}', url="https://h.example/p?t=1",
                                    attempts=5, error="HTTP 503 Service Unavailable"))  # fmt: skip
    assert letter["alert"] == {"alert_id": "a1"} and letter["attempts"] == 5
    assert letter["url"] == "https://h.example" and letter["error"].startswith("HTTP 503")
    assert json.loads(dead_letter(b"not json", url="http://h", attempts=1, error="x"))["alert"] == (
        "not json"
    )


class _Message:
    def __init__(self) -> None:
        self.body = b'{"alert_id": "a1"}'

    def value(self) -> bytes:
        return self.body

    def key(self) -> bytes:
        return b"d1"

    def topic(self) -> str:
        return "iot.alerts"

    def partition(self) -> int:
        return 2

    def offset(self) -> int:
        return 41

    def error(self) -> None:
        return None


class _Consumer:
    def __init__(self) -> None:
        self.seeks: list[tuple[str, int, int]] = []
        self.commits = 0

    def poll(self, _timeout: float) -> _Message:
        return _Message()

    def seek(self, position: Any) -> None:
        self.seeks.append((position.topic, position.partition, position.offset))

    def commit(self, **_kw: Any) -> None:
        self.commits += 1


class _Producer:
    """Takes a dead letter and reports it failed (the broker refused the topic)."""

    def __init__(self) -> None:
        self.reports: list[Callable[..., None]] = []

    def produce(self, _topic: str, **kw: Any) -> None:
        self.reports.append(kw["on_delivery"])

    def flush(self, _timeout: float) -> int:
        from confluent_kafka import KafkaError

        for report in self.reports:
            report(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED), None)
        return 0  # librdkafka counts a failed message as no longer waiting


def test_a_dead_letter_the_broker_refuses_is_read_again_not_committed() -> None:
    def refuse(*_args: Any, **_kw: Any) -> None:
        raise DeliveryError("HTTP 400 Bad Request", retryable=False)

    relay = WebhookRelay({}, "iot.alerts", "http://h/x", "dead", group="g", send=refuse)
    consumer = _Consumer()
    with pytest.raises(RuntimeError, match="dead-letter topic 'dead'"):
        relay._relay_next(consumer, _Producer())  # type: ignore[arg-type]
    assert consumer.commits == 0 and consumer.seeks == [("iot.alerts", 2, 41)]


def test_fast_path_copies_of_an_alert_are_posted_once_windowed_messages_always() -> None:
    import json

    posted: list[tuple[str, str]] = []

    def send(_url: str, body: bytes, **_kw: Any) -> None:
        record = json.loads(body)
        posted.append((record["alert_id"], record["path"]))

    relay = WebhookRelay({}, "iot.alerts", "http://h/x", "dead", group="g", send=send)
    consumer = _Consumer()
    stream = [("a1", "fast"), ("a1", "fast"), ("a2", "fast"), ("a1", "windowed"),
              ("a1", "windowed"), ("a1", "fast"), ("a3", "windowed"), ("a3", "fast")]  # fmt: skip
    for alert_id, path in stream:
        message = _Message()
        message.body = json.dumps({"alert_id": alert_id, "path": path}).encode()
        consumer.poll = lambda _timeout, message=message: message  # type: ignore[method-assign]
        relay._relay_next(consumer, _Producer())  # type: ignore[arg-type]
    assert posted == [("a1", "fast"), ("a2", "fast"), ("a1", "windowed"), ("a1", "windowed"),
                      ("a3", "windowed")]  # fmt: skip
    assert consumer.commits == len(stream)  # a skipped copy is committed too
