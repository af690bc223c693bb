"""A corpus of hostile messages through the real pipeline (Kafka -> Spark -> Delta): each one is
quarantined with a reason or parsed safely, the pipeline keeps running, and every message is found,
by its Kafka coordinates, in exactly one of telemetry and quarantine.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from infra import contract as c
from infra import lake as lake_tables
from pipeline import job
from pipeline.settings import PipelineSettings
from tests.pipeline_helpers import make_event, produce_at, write_registry

pytestmark = pytest.mark.integration

OK = "ok"
NOW = datetime.now(timezone.utc).replace(microsecond=0)
T = (NOW - timedelta(minutes=30)).isoformat().replace("+00:00", "Z")


def ev(**changes: Any) -> dict[str, Any]:
    """A valid event of device ``dev-1`` with ``changes`` applied (``...`` removes a field)."""
    base = make_event("dev-1", 1, NOW - timedelta(minutes=30))
    base.update(changes)
    return {k: v for k, v in base.items() if v is not ...}


def js(**changes: Any) -> bytes:
    return json.dumps(ev(**changes)).encode()


def raw(text: str) -> bytes:
    """A hand-written JSON value (for what json.dumps refuses to write)."""
    return text.replace("$T", T).encode()


def with_metric(text: str) -> bytes:
    """A hand-written event whose metrics object is ``text``."""
    return raw('{"event_id":"m","device_id":"dev-1","event_time":"$T","seq":1,"metrics":{'
               + text + "}}")  # fmt: skip


def nested(depth: int) -> bytes:
    return raw('{"event_id":"deep","device_id":"dev-1","event_time":"$T","seq":1,"metrics":'
               + "[" * depth + "]" * depth + "}")  # fmt: skip


# (kind, key, value, expected outcome: OK or the quarantine reason)
CORPUS: list[tuple[str, str | None, bytes | None, str]] = [
    ("valid", "dev-1", js(event_id="valid"), OK),
    ("invalid utf-8", "dev-1", b"\xff\xfe" + js(), c.REASON_INVALID_UTF8),
    ("lone surrogate bytes", "dev-1", b'{"event_id":"\xed\xa0\x80"}', c.REASON_INVALID_UTF8),
    ("truncated JSON", "dev-1", js()[:40], c.REASON_INVALID_JSON),
    ("empty value", "dev-1", b"", c.REASON_INVALID_JSON),
    ("tombstone (null value)", "dev-1", None, c.REASON_INVALID_JSON),
    ("JSON array", "dev-1", b"[1, 2, 3]", c.REASON_INVALID_JSON),
    ("JSON string", "dev-1", b'"hello"', c.REASON_INVALID_JSON),
    ("JSON number", "dev-1", b"42", c.REASON_INVALID_JSON),
    ("JSON null", "dev-1", b"null", c.REASON_INVALID_JSON),
    ("binary garbage", "dev-1", bytes(range(1, 128)), c.REASON_INVALID_JSON),
    ("whitespace only", "dev-1", b" \n\t\r ", c.REASON_INVALID_JSON),
    ("XML", "dev-1", b'<?xml version="1.0"?><event><event_id>x</event_id></event>',
     c.REASON_INVALID_JSON),
    ("CSV", "dev-1", f"event_id,device_id,event_time,seq\nx,dev-1,{T},1\n".encode(),
     c.REASON_INVALID_JSON),
    ("gzip", "dev-1", gzip.compress(js(), mtime=0), c.REASON_INVALID_UTF8),
    # Spark's parser reads the first object and ignores the rest: the rest could be an event.
    ("JSON object followed by garbage", "dev-1", js() + b"garbage", c.REASON_INVALID_JSON),
    ("two JSON objects", "dev-1", js() + b"\n" + js(), c.REASON_INVALID_JSON),
    ("JSON object and a stray brace", "dev-1", js() + b"}", c.REASON_INVALID_JSON),
    ("byte order mark", "dev-1", b"\xef\xbb\xbf" + js(event_id="bom"), c.REASON_INVALID_JSON),
    ("deep nesting", "dev-1", nested(5000), c.REASON_INVALID_JSON),
    ("nesting in metrics", "dev-1", nested(50), c.REASON_WRONG_TYPE),
    ("huge string", "dev-1", js(firmware="x" * 100_000), c.REASON_OVERSIZE),
    ("just over the size limit", "dev-1",
     js(firmware="y" * (c.MAX_MESSAGE_BYTES - len(js(firmware="")) + 1)), c.REASON_OVERSIZE),
    ("NaN metric", "dev-1", raw('{"event_id":"nan","device_id":"dev-1","event_time":"$T",'
                                '"seq":1,"metrics":{"power_w":NaN}}'), c.REASON_OUT_OF_RANGE),
    ("Infinity metric", "dev-1", raw('{"event_id":"inf","device_id":"dev-1","event_time":"$T",'
                                     '"seq":1,"metrics":{"power_w":Infinity}}'),
     c.REASON_OUT_OF_RANGE),
    ("-Infinity latitude", "dev-1", raw('{"event_id":"ninf","device_id":"dev-1",'
                                        '"event_time":"$T","seq":1,"lat":-Infinity}'),
     c.REASON_OUT_OF_RANGE),
    # Too large for a double: read as infinity, an impossible value wherever it stands.
    ("1e400 metric", "dev-1", with_metric('"power_w":1e400'), c.REASON_OUT_OF_RANGE),
    ("1e400 latitude", "dev-1", raw('{"event_id":"big-lat","device_id":"dev-1",'
                                    '"event_time":"$T","seq":1,"lat":1e400}'),
     c.REASON_OUT_OF_RANGE),
    ("metric as a boolean", "dev-1", js(metrics={"power_w": True}), c.REASON_WRONG_TYPE),
    ("metric as an object", "dev-1", js(metrics={"power_w": {"value": 414}}), c.REASON_WRONG_TYPE),
    ("seq as a string", "dev-1", js(event_id="seq-str", seq="42"), OK),
    ("lat as a string", "dev-1", js(event_id="lat-str", lat="52.5"), OK),
    ("metric as a string", "dev-1", js(event_id="m-str", metrics={"power_w": "414.5"}), OK),
    ("seq as words", "dev-1", js(seq="seven"), c.REASON_WRONG_TYPE),
    ("seq as the string null", "dev-1", js(seq="null"), c.REASON_WRONG_TYPE),
    ("seq in hex", "dev-1", js(seq="0x1F"), c.REASON_WRONG_TYPE),
    ("seq as a boolean", "dev-1", js(seq=True), c.REASON_WRONG_TYPE),
    # A counter sent as a float comes from a producer counting in floating point (exact only up
    # to 2**53): even 3.0 is quarantined, so the fault shows at its first message.
    ("seq as a float", "dev-1", js(seq=3.0), c.REASON_WRONG_TYPE),
    ("seq with a fraction", "dev-1", js(seq=3.5), c.REASON_WRONG_TYPE),
    ("seq beyond 64 bits", "dev-1", raw('{"event_id":"big","device_id":"dev-1",'
                                        '"event_time":"$T","seq":99999999999999999999999}'),
     c.REASON_WRONG_TYPE),
    ("negative seq", "dev-1", js(seq=-1), c.REASON_OUT_OF_RANGE),
    ("lat as a boolean", "dev-1", js(lat=False), c.REASON_WRONG_TYPE),
    ("lat as an object", "dev-1", js(lat={"deg": 52}), c.REASON_WRONG_TYPE),
    ("metrics as a string", "dev-1", js(metrics="lots"), c.REASON_WRONG_TYPE),
    ("metrics as a list", "dev-1", js(metrics=[1, 2]), c.REASON_WRONG_TYPE),
    ("metrics null", "dev-1", js(event_id="m-null", metrics=None), OK),
    ("latitude 91", "dev-1", js(lat=91.0), c.REASON_OUT_OF_RANGE),
    ("longitude -181", "dev-1", js(lon=-181.0), c.REASON_OUT_OF_RANGE),
    ("humidity 140 %", "dev-1", js(metrics={"humidity_pct": 140}), c.REASON_OUT_OF_RANGE),
    ("negative voltage", "dev-1", js(metrics={"voltage_v": -5}), c.REASON_OUT_OF_RANGE),
    ("signal above 0 dBm", "dev-1", js(metrics={"signal_dbm": 12}), c.REASON_OUT_OF_RANGE),
    ("missing event_id", "dev-1", js(event_id=...), c.REASON_MISSING_FIELD),
    ("missing device_id", None, js(device_id=...), c.REASON_MISSING_FIELD),
    ("missing event_time", "dev-1", js(event_time=...), c.REASON_MISSING_FIELD),
    ("missing seq", "dev-1", js(seq=...), c.REASON_MISSING_FIELD),
    ("event_time null", "dev-1", js(event_time=None), c.REASON_MISSING_FIELD),
    ("event_id null", "dev-1", js(event_id=None), c.REASON_MISSING_FIELD),
    ("device_id null", "dev-1", js(device_id=None), c.REASON_MISSING_FIELD),
    ("camelCase field names", "dev-1",
     json.dumps({"eventId": "camel", "deviceId": "dev-1", "eventTime": T, "seq": 1}).encode(),
     c.REASON_MISSING_FIELD),
    ("empty object", "dev-1", b"{}", c.REASON_MISSING_FIELD),
    ("empty event_id", "dev-1", js(event_id=""), c.REASON_WRONG_TYPE),
    ("event_id of 1,000 characters", "dev-1", js(event_id="e" * 1000), c.REASON_WRONG_TYPE),
    ("device_id of 200 characters", "d" * 200, js(device_id="d" * 200), c.REASON_WRONG_TYPE),
    ("device_id of 100,000 characters", "d" * 100_000, js(device_id="d" * 100_000),
     c.REASON_OVERSIZE),
    # An id or firmware must be a JSON string: 12345, 12345.0 and 1.2345e4 are one number but
    # three texts, and a producer that counts in doubles changes large ids silently.
    ("numeric device_id", "12345", js(device_id=12345), c.REASON_WRONG_TYPE),
    ("boolean device_id", "true", js(device_id=True), c.REASON_WRONG_TYPE),
    ("object device_id", None, js(device_id={"id": "dev-1"}), c.REASON_WRONG_TYPE),
    ("numeric event_id", "dev-1", js(event_id=12345), c.REASON_WRONG_TYPE),
    ("numeric firmware", "dev-1", js(firmware=2), c.REASON_WRONG_TYPE),
    ("timestamp with a space", "dev-1", js(event_id="ts-space", event_time=T.replace("T", " ")),
     OK),
    ("timestamp with an offset", "dev-1",
     js(event_id="ts-offset", event_time=(NOW - timedelta(minutes=30)).astimezone(
         timezone(timedelta(hours=2))).isoformat()), OK),
    ("timestamp with microseconds", "dev-1",
     js(event_id="ts-micro", event_time=T.replace("Z", ".123456Z")), OK),
    ("timestamp as epoch seconds", "dev-1", js(event_time=int(NOW.timestamp())),
     c.REASON_BAD_TIMESTAMP),
    ("timestamp as an epoch milliseconds string", "dev-1",
     js(event_time=str(int(NOW.timestamp() * 1000))), c.REASON_BAD_TIMESTAMP),
    # The contract's time is UTC: a time without a zone may be the device's local time, which
    # read as UTC would be silently hours off.
    ("timestamp without a zone", "dev-1", js(event_time=T.removesuffix("Z")),
     c.REASON_BAD_TIMESTAMP),
    ("date without a time", "dev-1", js(event_time=T[:10]), c.REASON_BAD_TIMESTAMP),
    ("30 February", "dev-1", js(event_time="2025-02-30T08:00:00Z"), c.REASON_BAD_TIMESTAMP),
    ("timestamp in words", "dev-1", js(event_time="yesterday"), c.REASON_BAD_TIMESTAMP),
    ("day-first date", "dev-1", js(event_time="22/11/2026 08:00"), c.REASON_BAD_TIMESTAMP),
    ("year 1900", "dev-1", js(event_time="1900-01-01T00:00:00Z"), c.REASON_BAD_TIMESTAMP),
    ("year 2999", "dev-1", js(event_time="2999-01-01T00:00:00Z"), c.REASON_CLOCK_AHEAD),
    ("clock an hour ahead", "dev-1",
     js(event_time=(NOW + timedelta(hours=1)).isoformat()), c.REASON_CLOCK_AHEAD),
    ("key differs from device_id", "dev-2", js(), c.REASON_KEY_MISMATCH),
    ("no key", None, js(event_id="no-key"), OK),
    ("unicode device_id", "设备-七", js(event_id="uni", device_id="设备-七"), OK),
    ("emoji device_id", "meter-🔥", js(event_id="emoji", device_id="meter-🔥"), OK),
    ("SQL in device_id", "x'; DROP TABLE telemetry; --",
     js(event_id="sql", device_id="x'; DROP TABLE telemetry; --"), OK),
    ("HTML in firmware", "dev-1", js(event_id="html", firmware="<script>alert(1)</script>"), OK),
    ("control characters in firmware", "dev-1", js(event_id="ctrl", firmware="1.0\u0000\u001b"),
     OK),
    ("unknown extra fields", "dev-1", js(event_id="extra", vendor={"a": [1, 2]}, zone=3), OK),
    ("duplicate JSON keys", "dev-1",
     raw('{"event_id":"dupkey","device_id":"dev-1","event_time":"$T","seq":1,"seq":2}'), OK),
    ("whitespace around JSON", "dev-1", b"  \n\t" + js(event_id="ws") + b"  \n", OK),
    ("same event sent twice", "dev-1", js(event_id="valid"), c.REASON_DUPLICATE),
]  # fmt: skip


def test_every_hostile_message_is_quarantined_with_a_reason_or_parsed_safely(
    spark: Any, bootstrap: str, make_topic: Callable[..., str], lake: str, tmp_path: Path
) -> None:
    kinds = [kind for kind, *_ in CORPUS]
    assert len(set(kinds)) == len(kinds) >= 75
    topic = make_topic(partitions=3)
    write_registry(lake, ["dev-1"])
    coordinates = produce_at(bootstrap, topic, [(key, value) for _, key, value, _ in CORPUS])
    at = dict(zip(kinds, coordinates, strict=True))
    settings = PipelineSettings(
        lake_root=lake, checkpoint_root=str(tmp_path / "cp"), bootstrap_servers=bootstrap,
        topic=topic, firmware_topic="", mlflow_tracking_uri=f"sqlite:///{tmp_path / 'none.db'}",
    )  # fmt: skip
    job.run_available_now(spark, settings)

    def by_coordinates(name: str) -> dict[tuple[int, int], Any]:
        rows = spark.read.format("delta").load(lake_tables.table_path(lake, name)).collect()
        assert {r.kafka_topic for r in rows} == {topic}, name
        found = {(r.kafka_partition, r.kafka_offset): r for r in rows}
        assert len(found) == len(rows), f"a message twice in {name}"
        return found

    telemetry, quarantine = by_coordinates("telemetry"), by_coordinates("quarantine")
    # Every message is in exactly one place: nothing lost, nothing twice.
    assert not set(telemetry) & set(quarantine)
    assert set(telemetry) | set(quarantine) == set(at.values())
    outcomes = {}
    for kind, where in at.items():
        if where in telemetry:
            outcomes[kind] = OK
        else:
            row = quarantine[where]
            assert row.reason in c.REASONS and row.detail, kind
            outcomes[kind] = row.reason
    assert outcomes == {kind: expected for kind, _, _, expected in CORPUS}
    # Parsed safely means stored as data, byte for byte.
    assert telemetry[at["SQL in device_id"]].device_id == "x'; DROP TABLE telemetry; --"
    assert telemetry[at["HTML in firmware"]].firmware == "<script>alert(1)</script>"
    assert telemetry[at["unicode device_id"]].device_id == "设备-七"
    assert telemetry[at["unknown extra fields"]].extra == {"vendor": '{"a":[1,2]}', "zone": "3"}
