"""The webhook relay on a real broker and a real HTTP server: a receiver that fails and
recovers gets every alert once it answers; one that never takes an alert leaves a dead letter;
a restarted relay resumes after what it delivered."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from pipeline.alerts import as_written, records
from pipeline.publish import AlertPublisher, alert_message
from pipeline.webhook import WebhookRelay
from tests.pipeline_helpers import topic_messages
from tests.unit.pipeline.test_alerts import NOW, alerts

pytestmark = pytest.mark.integration


class Receiver:
    """What the HTTP server was sent, and how it answers: ``answers`` in turn, then ``then``."""

    def __init__(self, answers: list[int], then: int = 200) -> None:
        self.answers, self.then = list(answers), then
        self.requests: list[tuple[int, str, bytes]] = []  # (status answered, X-Alert-Id, body)
        self.lock = threading.Lock()

    def taken(self) -> list[tuple[str, bytes]]:
        with self.lock:
            return [(key, body) for status, key, body in self.requests if status == 200]


@contextmanager
def http_server(receiver: Receiver) -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            with receiver.lock:
                status = receiver.answers.pop(0) if receiver.answers else receiver.then
                receiver.requests.append((status, self.headers["X-Alert-Id"], body))
            self.send_response(status)
            if 300 <= status < 400:
                self.send_header("Location", "/elsewhere")
            self.end_headers()

        def do_GET(self) -> None:  # a followed redirect
            with receiver.lock:
                receiver.requests.append((200, "GET " + self.path, b""))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/hooks/alerts?token=s3cret"
    finally:
        server.shutdown()
        server.server_close()


def published(bootstrap: str, topic: str, devices: int) -> list[bytes]:
    """``devices`` alerts published to ``topic``; their message values."""
    rows = as_written(alerts(*[(f"d{i}", 0.5 + i / 100, "40 events") for i in range(devices)]),
                      3, NOW)  # fmt: skip
    AlertPublisher({"bootstrap.servers": bootstrap}, topic)(rows)
    return [alert_message(row) for row in records(rows)]


def relay(bootstrap: str, topic: str, url: str, dead: str, group: str, **kw: Any) -> WebhookRelay:
    return WebhookRelay({"bootstrap.servers": bootstrap}, topic, url, dead, group=group,
                        first_delay_s=0.1, **kw).start()  # fmt: skip


def wait_until(done: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


def test_a_receiver_that_fails_then_recovers_gets_every_alert(
    bootstrap: str, make_topic: Callable[..., str]
) -> None:
    topic, dead, group = make_topic(partitions=2), make_topic(partitions=1), str(uuid.uuid4())
    values = published(bootstrap, topic, devices=4)
    receiver = Receiver(answers=[503, 503, 500])  # down for three tries, then up
    with http_server(receiver) as url:
        first = relay(bootstrap, topic, url, dead, group, attempts=5)
        wait_until(lambda: len(receiver.taken()) >= 4, f"delivered: {receiver.requests}")
        first.stop()
        assert sorted(body for _, body in receiver.taken()) == sorted(values)
        assert all(key == json.loads(body)["alert_id"] for key, body in receiver.taken())
        assert len(receiver.requests) == 4 + 3  # each failed try retried, nothing posted twice
        # Restarted, the relay resumes after what it delivered: nothing is posted again.
        again = relay(bootstrap, topic, url, dead, group, attempts=5)
        time.sleep(5)
        again.stop()
        assert len(receiver.requests) == 4 + 3
    assert topic_messages(bootstrap, dead) == []


def test_an_alert_the_receiver_never_takes_goes_to_the_dead_letter_topic(
    bootstrap: str, make_topic: Callable[..., str]
) -> None:
    topic, dead = make_topic(partitions=1), make_topic(partitions=1)
    values = published(bootstrap, topic, devices=2)
    # The first alert is refused as it is (400: not retried), the second fails every try.
    receiver = Receiver(answers=[400], then=503)
    with http_server(receiver) as url:
        worker = relay(bootstrap, topic, url, dead, str(uuid.uuid4()), attempts=3)
        wait_until(lambda: len(topic_messages(bootstrap, dead)) >= 2, "no dead letters")
        worker.stop()
    letters = [json.loads(m.value()) for m in topic_messages(bootstrap, dead)]
    assert [letter["alert"] for letter in letters] == [json.loads(v) for v in values]
    assert [(letter["attempts"], letter["error"]) for letter in letters] == [
        (1, "HTTP 400 Bad Request"), (3, "HTTP 503 Service Unavailable"),
    ]  # fmt: skip
    assert {letter["url"] for letter in letters} == {url.split("/hooks")[0]}  # no token
    assert [status for status, _, _ in receiver.requests] == [400, 503, 503, 503]


def test_a_redirect_is_no_delivery() -> None:
    """urllib would follow it with a GET, without the alert, and call that delivered."""
    from pipeline.webhook import DeliveryError, post

    receiver = Receiver(answers=[301])
    with http_server(receiver) as url, pytest.raises(DeliveryError, match="HTTP 301") as failure:
        post(url, b"{}", alert_id="a1", timeout_s=5)
    assert failure.value.retryable is False
    assert [key for _, key, _ in receiver.requests] == ["a1"]  # nothing fetched after it


def test_a_restarted_relay_does_not_post_again_a_fast_copy_of_an_alert_it_relayed(
    bootstrap: str, make_topic: Callable[..., str]
) -> None:
    """After a restart the fast path publishes again what it read since its last commit: the
    pager must not get those alerts a second time."""
    from confluent_kafka import Producer

    topic, dead, group = make_topic(partitions=2), make_topic(partitions=1), str(uuid.uuid4())
    windowed = published(bootstrap, topic, devices=3)  # 3 alerts, relayed as windowed messages
    fast = [json.dumps({**json.loads(v), "path": "fast"}).encode() for v in windowed]
    producer = Producer({"bootstrap.servers": bootstrap})

    def send(values: list[bytes]) -> None:
        for value in values:
            producer.produce(topic, key=json.loads(value)["device_id"], value=value)
        assert producer.flush(30) == 0

    send(fast[:1])  # the first alert's fast copy, after its windowed message: skipped
    receiver = Receiver(answers=[])
    with http_server(receiver) as url:
        first = relay(bootstrap, topic, url, dead, group)
        wait_until(lambda: len(receiver.taken()) >= 3, "the windowed messages were not posted")
        time.sleep(3)
        first.stop()
        assert len(receiver.requests) == 3
        # The replay after a restart: fast copies of alerts 0 and 1 again, and a new alert.
        new = json.dumps({**json.loads(fast[2]), "alert_id": "new-alert"}).encode()
        send([fast[0], fast[1], new])
        again = relay(bootstrap, topic, url, dead, group)
        wait_until(lambda: len(receiver.requests) >= 4, "the new alert was not posted")
        time.sleep(3)
        again.stop()
    assert [key for _, key, _ in receiver.requests[3:]] == ["new-alert"]
