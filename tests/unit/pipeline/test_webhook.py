"""The webhook relay's pure parts: backoff, what logs show of the URL, the dead letter."""

from __future__ import annotations

import json

from pipeline.webhook import dead_letter, delays, where


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
