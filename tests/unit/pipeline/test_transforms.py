"""Parsing and quarantine rules on static DataFrames."""

from __future__ import annotations

import json
import math
from datetime import datetime, timezone
from typing import Any

import pytest

from infra import contract as c
from pipeline.dedup import SeenEvents
from pipeline.ingest import IngestBatchWriter, WrittenOffsets
from pipeline.transforms import parse_events, quarantined, senders, valid_events

HORIZON_US = 10 * 60 * 1_000_000

RAW_DDL = "key string, value binary, topic string, partition int, offset long, timestamp timestamp"
KAFKA_TS = datetime(2026, 11, 22, 8, 0, tzinfo=timezone.utc)


def event(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "event_id": "e-1",
        "device_id": "dev-1",
        "event_time": "2026-11-22T08:00:00Z",
        "seq": 7,
        "firmware": "1.2.0",
        "lat": 52.5,
        "lon": 13.4,
        "metrics": {"voltage_v": 230.0, "current_a": 2.0, "power_w": 420.0,
                    "temperature_c": None},
    }  # fmt: skip
    base.update(overrides)
    return {k: v for k, v in base.items() if v is not ...}


def raw_rows(values: list[bytes], key: str | None = "dev-1") -> list[tuple[Any, ...]]:
    return [(key, v, "t", 0, i, KAFKA_TS) for i, v in enumerate(values)]


def parse(spark: Any, values: list[bytes], key: str | None = "dev-1") -> list[Any]:
    raw = spark.createDataFrame(raw_rows(values, key), RAW_DDL)
    return parse_events(raw).orderBy("offset").collect()


def test_valid_event_is_typed_and_extra_fields_are_kept(spark: Any) -> None:
    value = json.dumps(event(vendor="acme", zone=3)).encode()
    row = parse(spark, [value])[0]
    assert row.reason is None
    assert row.event_time == datetime(2026, 11, 22, 8, 0)  # session time zone is UTC
    assert (row.seq, row.voltage_v, row.power_w, row.temperature_c) == (7, 230.0, 420.0, None)
    assert row.extra == {"vendor": "acme", "zone": "3"}


BAD_RECORDS: list[tuple[bytes, str, str | None]] = [
        (b"{not json", c.REASON_INVALID_JSON, "value is not a JSON object"),
        (b"[1, 2, 3]", c.REASON_INVALID_JSON, "value is not a JSON object"),
        (json.dumps(event()).encode() + b"garbage", c.REASON_INVALID_JSON,
         "value is not a JSON object"),
        (json.dumps(event()).encode() + b"\n" + json.dumps(event(event_id="e-2")).encode(),
         c.REASON_INVALID_JSON, "value is not a JSON object"),
        (json.dumps(event()).encode() + b"}", c.REASON_INVALID_JSON, "value is not a JSON object"),
        (b"\xff\xfe{}", c.REASON_INVALID_UTF8, "value is not valid UTF-8"),
        (json.dumps(event(event_id=...)).encode(), c.REASON_MISSING_FIELD, "missing event_id"),
        (json.dumps(event(seq=...)).encode(), c.REASON_MISSING_FIELD, "missing seq"),
        (json.dumps(event(device_id=None)).encode(), c.REASON_MISSING_FIELD, "missing device_id"),
        (json.dumps(event(seq="seven")).encode(), c.REASON_WRONG_TYPE, "wrong type: seq"),
        (json.dumps(event(seq="null")).encode(), c.REASON_WRONG_TYPE, "wrong type: seq"),
        (json.dumps(event(seq=7.0)).encode(), c.REASON_WRONG_TYPE, "wrong type: seq"),
        (json.dumps(event(device_id=42)).encode(), c.REASON_WRONG_TYPE, "wrong type: device_id"),
        (json.dumps(event(event_id=True)).encode(), c.REASON_WRONG_TYPE, "wrong type: event_id"),
        (json.dumps(event(firmware={"v": 1})).encode(), c.REASON_WRONG_TYPE,
         "wrong type: firmware"),
        (json.dumps(event(lat={"a": 1})).encode(), c.REASON_WRONG_TYPE, "wrong type: lat"),
        (json.dumps(event(metrics={"power_w": "high"})).encode(), c.REASON_WRONG_TYPE,
         "wrong type: metrics.power_w"),
        (json.dumps(event(metrics=[1])).encode(), c.REASON_WRONG_TYPE, "metrics is not an object"),
        (json.dumps(event(device_id="")).encode(), c.REASON_WRONG_TYPE, None),
        (json.dumps(event(event_time="yesterday")).encode(), c.REASON_BAD_TIMESTAMP, None),
        (json.dumps(event(event_time="2026-11-22T08:00:00")).encode(), c.REASON_BAD_TIMESTAMP,
         "event_time without a time zone: 2026-11-22T08:00:00"),
        (json.dumps(event(event_time="2026-02-30T08:00:00Z")).encode(), c.REASON_BAD_TIMESTAMP,
         "event_time: 2026-02-30T08:00:00Z"),
        (json.dumps(event(event_time="1970-01-01T00:00:00Z")).encode(), c.REASON_BAD_TIMESTAMP,
         None),
        # A clock set centuries ahead is a clock ahead like any other.
        (json.dumps(event(event_time="2999-01-01T00:00:00Z")).encode(), c.REASON_CLOCK_AHEAD,
         None),
        # A device clock 20 minutes ahead of the time the message was produced (KAFKA_TS).
        (json.dumps(event(event_time="2026-11-22T08:20:00Z")).encode(), c.REASON_CLOCK_AHEAD,
         "event_time more than 1 minute ahead of the message: 2026-11-22T08:20:00Z"),
        (json.dumps(event(lat=123.0)).encode(), c.REASON_OUT_OF_RANGE, "out of range: lat"),
        (json.dumps(event(seq=-1)).encode(), c.REASON_OUT_OF_RANGE, "out of range: seq"),
        (json.dumps(event(metrics={"humidity_pct": 140})).encode(), c.REASON_OUT_OF_RANGE,
         "out of range: humidity_pct"),
        # A number a double cannot hold is an impossible value, at the top level as in metrics.
        (b'{"event_id":"e","device_id":"dev-1","event_time":"2026-11-22T08:00:00Z","seq":1,'
         b'"lat":NaN}', c.REASON_OUT_OF_RANGE, "out of range: lat"),
        (b'{"event_id":"e","device_id":"dev-1","event_time":"2026-11-22T08:00:00Z","seq":1,'
         b'"lon":1e400}', c.REASON_OUT_OF_RANGE, "out of range: lon"),
        (b'{"event_id":"e","device_id":"dev-1","event_time":"2026-11-22T08:00:00Z","seq":1,'
         b'"metrics":{"power_w":1e400}}', c.REASON_OUT_OF_RANGE, "out of range: power_w"),
        (json.dumps(event(device_id="dev-2")).encode(), c.REASON_KEY_MISMATCH, None),
        (json.dumps(event(firmware="x" * (c.MAX_MESSAGE_BYTES + 1))).encode(), c.REASON_OVERSIZE,
         None),
]  # fmt: skip


@pytest.fixture(scope="module")
def parsed_bad_records(spark: Any) -> list[Any]:
    """All bad records parsed in one job (one row per case, in order)."""
    return parse(spark, [value for value, _, _ in BAD_RECORDS])


@pytest.mark.parametrize("case", range(len(BAD_RECORDS)))
def test_bad_records_get_a_reason(parsed_bad_records: list[Any], case: int) -> None:
    _, reason, detail = BAD_RECORDS[case]
    row = parsed_bad_records[case]
    assert row.reason == reason
    if detail is not None:
        assert row.detail == detail
    else:
        assert row.detail


def test_a_clock_slightly_ahead_or_behind_is_accepted(spark: Any) -> None:
    values = [json.dumps(event(event_time=t)).encode()
              for t in ("2026-11-22T08:00:50Z", "2026-11-22T02:00:00Z")]  # fmt: skip
    assert [row.reason for row in parse(spark, values)] == [None, None]


def test_times_with_their_zone_are_accepted(spark: Any) -> None:
    times = ["2026-11-22T08:00:00.123Z", "2026-11-22 08:00:00Z", "2026-11-22T10:00:00+02:00",
             "2026-11-22T10:00:00+0200", "2026-11-22T03:00:00-05"]  # fmt: skip
    rows = parse(spark, [json.dumps(event(event_time=t)).encode() for t in times])
    assert [(row.reason, row.event_time) for row in rows] == [
        (None, datetime(2026, 11, 22, 8, 0, 0, 123000)),
        *[(None, datetime(2026, 11, 22, 8, 0))] * 4,
    ]


def test_numbers_sent_as_strings_and_null_key_are_accepted(spark: Any) -> None:
    value = json.dumps(event(seq="42", lat="52.5", device_id="12345")).encode()
    row = parse(spark, [value], key=None)[0]
    assert (row.reason, row.seq, row.lat, row.device_id) == (None, 42, 52.5, "12345")


def test_split_keeps_every_record_once(spark: Any) -> None:
    values = [json.dumps(event(event_id=f"e{i}")).encode() for i in range(5)] + [b"oops", b"{}"]
    raw = spark.createDataFrame(raw_rows(values), RAW_DDL)
    parsed = parse_events(raw)
    good, bad = valid_events(parsed), quarantined(parsed)
    assert good.count() == 5 and bad.count() == 2
    assert good.columns == c.column_names(c.TELEMETRY_COLUMNS)
    assert bad.columns == c.column_names(c.QUARANTINE_COLUMNS)
    assert sorted(r.raw_value for r in bad.collect()) == [b"oops", b"{}"]


@pytest.mark.parametrize("split", [valid_events, quarantined])
def test_keeping_one_side_of_the_split_parses_each_value_once(spark: Any, split: Any) -> None:
    # A filter on the reason pushed below the checks would parse the value again for each field
    # a check reads (over 80 times, 10x slower): the typed read, the read as text, the metrics,
    # the rare unknown fields.
    raw = spark.createDataFrame(raw_rows([b"{}"]), RAW_DDL)
    plan = split(parse_events(raw))._jdf.queryExecution().optimizedPlan().toString()
    assert plan.count("from_json(") <= 4


# JSON texts put in place of one field of a valid event: every kind of value, the ones the typed
# read takes and the ones it fails on (then the record is read again as text).
FIELD_VALUES = [
    ..., "null", '""', '"x"', '"42"', '" 7 "', '"52.5"', "42", "42.0", "-1", "0", "1e3", "1e400",
    "-1e400", "NaN", "Infinity", "-Infinity", '"NaN"', '"Infinity"', '"-INF"', '"0x1p3"', "true",
    "[]", "[1]", "{}", '{"a": 1}', "9223372036854775808", "123456789012345678901234567890",
    "52.12345678901234567890", '"2026-11-22T08:00:00Z"', '"\\u0064ev-1"',
]  # fmt: skip
MESSAGE_SHAPES = [
    b"{}", b"null", b"[]", b'"text"', b"42", b"", b" ",
    json.dumps(event(), indent=2).encode(),
    json.dumps(event()).encode() + b"  \n",
    b"  " + json.dumps(event()).encode(),
    json.dumps(event(vendor="acme", zone=None, tags=[1, {"a": 2}])).encode(),
    json.dumps(event(metrics={"power_w": 1.0, "event_id": 5, "volts": "x"})).encode(),
    json.dumps(event(metrics=None)).encode(),
    json.dumps(event(metrics={})).encode(),
    json.dumps(event(metrics="{}")).encode(),
    json.dumps(event(event_id='e-"1"', device_id="d\u00e9v-1")).encode(),
    json.dumps(event(event_id="x" * (c.MAX_ID_LENGTH + 1))).encode(),
    # A key given twice: the parser keeps one, the same in both reads.
    json.dumps(event()).encode()[:-1] + b', "seq": "eight"}',
    json.dumps(event()).encode()[:-1] + b', "seq": 8}',
    b'{"seq": "eight", ' + json.dumps(event())[1:].encode(),
    # The simulator's fixed-width form: numbers right-aligned, strings padded after the quote.
    b'{"event_id":"e-1"  ,"device_id":"dev-1","event_time":"2026-11-22T08:00:00.000Z","seq":    7,'
    b'"firmware":"1.2.0","lat": 52.500000,"lon": 13.400000,"metrics":{"voltage_v": 230.00,'
    b'"current_a":   2.00,"power_w": 420.00,"temperature_c":null}}',
]  # fmt: skip


def with_value(name: str, text: Any) -> bytes:
    """A valid event's JSON with ``name`` (``metrics.<m>`` for a metric) set to the JSON ``text``,
    or left out for ``...``."""
    body = event()
    parent, key = (body["metrics"], name.split(".")[1]) if "." in name else (body, name)
    parent[key] = "@@"
    if text is ...:
        del parent[key]
        return json.dumps(body).encode()
    return json.dumps(body).replace('"@@"', text).encode()


def comparable(row: Any) -> dict[str, Any]:
    """A row as a dict in which NaN equals NaN."""
    return {k: "NaN" if isinstance(v, float) and math.isnan(v) else v
            for k, v in row.asDict().items()}  # fmt: skip


def test_the_typed_read_decides_every_record_as_the_read_as_text_does(spark: Any) -> None:
    names = [n for n, _ in c.EVENT_FIELDS] + [f"metrics.{m}" for m in ("power_w", "humidity_pct")]
    values = [with_value(name, text) for name in names for text in FIELD_VALUES]
    values += MESSAGE_SHAPES + [value for value, _, _ in BAD_RECORDS]
    raw = spark.createDataFrame(raw_rows(values), RAW_DDL)
    both = [
        [comparable(row) for row in parse_events(raw, typed_first=first)
         .drop("ingest_time").orderBy("offset").collect()]
        for first in (True, False)
    ]  # fmt: skip
    assert len(both[0]) == len(values)
    for typed_first, as_text in zip(*both, strict=True):
        assert typed_first == as_text, values[typed_first["offset"]]
    # The corpus holds each outcome: valid records, and records of every reason but oversize.
    reasons = {row["reason"] for row in both[0]}
    assert None in reasons and len(reasons) >= 9


def test_senders_reads_who_sent_each_record_and_when_and_nothing_else(spark: Any) -> None:
    records: list[tuple[str | None, bytes]] = [
        ("dev-1", json.dumps(event()).encode()),
        # Quarantined for its content, but its device sent it then.
        (None, json.dumps(event(device_id="dev-2", metrics={"voltage_v": 9999.0})).encode()),
        (None, json.dumps(event(device_id="dev-3", metrics=...)).encode()),
        # A clock ahead: the device is alive, its time is wrong.
        ("dev-4", json.dumps(event(device_id="dev-4", event_time="2026-11-22T09:00:00Z")).encode()),
        # Names no device, or no sound time: nothing to say about a device.
        ("dev-5", json.dumps(event(device_id="dev-6")).encode()),  # the key names another
        (None, json.dumps(event(device_id="")).encode()),
        (None, json.dumps(event(device_id="dev-7", event_time="2026-11-22T08:00:00")).encode()),
        (None, json.dumps(event(device_id="dev-8", event_time="1999-12-31T23:00:00Z")).encode()),
        (None, json.dumps(event(device_id="dev-9", event_time="yesterday")).encode()),
        (None, json.dumps(event(device_id=..., event_time=...)).encode()),
        (None, b"[1, 2, 3]"),
        (None, b"{not json"),
    ]
    raw = spark.createDataFrame(
        [(key, value, "t", 0, i, KAFKA_TS) for i, (key, value) in enumerate(records)], RAW_DDL
    )
    found = senders(raw, max_clock_ahead="1 minute")
    at_8 = datetime(2026, 11, 22, 8, 0)
    assert [tuple(r) for r in found.orderBy("kafka_offset").collect()] == [
        (0, 0, at_8, "dev-1", at_8, False),
        (0, 1, at_8, "dev-2", at_8, False),
        (0, 2, at_8, "dev-3", at_8, False),
        (0, 3, at_8, "dev-4", datetime(2026, 11, 22, 9, 0), True),
        *((0, i, at_8, None, None, False) for i in range(4, 12)),
    ]
    # One parse of each record (a filter would be pushed below it and parse it again).
    assert found._jdf.queryExecution().optimizedPlan().toString().count("from_json(") == 1


def test_the_first_copy_of_an_event_is_the_valid_one_with_smallest_coordinates(spark: Any) -> None:
    values = [json.dumps(event(event_id=e)).encode() for e in ("a", "b", "a", "a")]
    # An invalid copy of "b" (seq out of range) comes first but cannot be the original.
    values.insert(0, json.dumps(event(event_id="b", seq=-1)).encode())
    nothing = WrittenOffsets({})  # the lake holds none of these messages
    writer = IngestBatchWriter("unused-lake", "test", seen=SeenEvents(HORIZON_US),
                               held=(nothing, nothing))  # fmt: skip
    marked = writer.mark_new_events(parse_events(spark.createDataFrame(raw_rows(values), RAW_DDL)))
    flags = sorted((r.event_id, r.offset, r.is_new) for r in marked.rows.collect())
    assert flags == [("a", 1, True), ("a", 3, False), ("a", 4, False), ("b", 0, None),
                     ("b", 2, True)]  # fmt: skip
    # Two events for telemetry; the invalid row and the two copies for quarantine.
    assert (marked.new, marked.rejected) == (2, 3)


def test_firmware_updates_are_one_json_object_of_strings(spark: Any) -> None:
    from pipeline.firmware import parse_firmware_updates

    update = {"update_id": "u-1", "device_id": "dev-1", "firmware": "2.0.0",
              "authorized_at": "2026-11-22T08:00:00Z"}  # fmt: skip
    text = json.dumps(update)
    cases = [
        (text, None),
        (text + "garbage", c.REASON_INVALID_JSON),
        (text + text, c.REASON_INVALID_JSON),
        ("   ", c.REASON_INVALID_JSON),
        ('["dev-1", "2.0.0"]', c.REASON_INVALID_JSON),
        (json.dumps({**update, "device_id": 12345}), c.REASON_WRONG_TYPE),
        (json.dumps({**update, "firmware": {"v": 2}}), c.REASON_WRONG_TYPE),
        (json.dumps({**update, "update_id": 7}), c.REASON_WRONG_TYPE),
        (json.dumps({**update, "firmware": None}), c.REASON_MISSING_FIELD),
        (json.dumps({k: v for k, v in update.items() if k != "device_id"}),
         c.REASON_MISSING_FIELD),
        (json.dumps({**update, "authorized_at": "yesterday"}), c.REASON_BAD_TIMESTAMP),
    ]  # fmt: skip
    raw = spark.createDataFrame(raw_rows([v.encode() for v, _ in cases]), RAW_DDL)
    rows = parse_firmware_updates(raw).orderBy("offset").collect()
    assert [r.reason for r in rows] == [reason for _, reason in cases]
    assert (rows[0].update_id, rows[0].device_id, rows[0].firmware) == ("u-1", "dev-1", "2.0.0")
    assert rows[5].detail == "device_id is not a string"


@pytest.mark.parametrize("store", ["default", "rocksdb"])
def test_copies_are_dropped_and_an_event_is_forgotten_once_the_watermark_passes_it(
    spark: Any, tmp_path: Any, store: str
) -> None:
    """Three batches through the real stateful dedup, with a 10-minute watermark.

    The dedup state must hold only events the watermark has not passed: an event at 08:00 is
    forgotten once the watermark reaches 08:10 (a later copy is late anyway). Keeping it for a
    further 10 minutes, as ``dropDuplicatesWithinWatermark`` does, doubles the state.
    """
    from infra.spark import ROCKSDB_PROVIDER
    from pipeline.transforms import first_copies

    if store == "rocksdb":
        spark.conf.set("spark.sql.streaming.stateStore.providerClass", ROCKSDB_PROVIDER)
    source, checkpoint = tmp_path / "in", tmp_path / "checkpoint"
    source.mkdir()
    batches = [
        [("a", "08:00"), ("a", "08:00"), ("b", "08:05")],  # the watermark ends at 07:55
        [("a", "08:00"), ("c", "08:20")],  # a's copy is within it: the state drops it; 08:10
        [("b", "08:05"), ("d", "08:12")],  # b's copy is late; a and b leave the state
    ]
    kept: list[str] = []
    query = None
    try:
        stream = first_copies(
            spark.readStream.schema("event_id string, event_time timestamp")
            .option("maxFilesPerTrigger", 1)
            .json(str(source)),
            "10 minutes",
        )
        for i, batch in enumerate(batches):
            lines = [
                json.dumps({"event_id": e, "event_time": f"2026-11-22T{t}:00Z"}) for e, t in batch
            ]
            (source / f"{i}.json").write_text("\n".join(lines) + "\n")
            if query is None:
                query = (
                    stream.writeStream.option("checkpointLocation", str(checkpoint))
                    .foreachBatch(lambda df, _: kept.extend(r.event_id for r in df.collect()))
                    .start()
                )
            query.processAllAvailable()
        assert query is not None
        # Keys added less keys evicted: the session's RocksDB does not count the rows it holds.
        states = [json.loads(p.json)["stateOperators"][0] for p in query.recentProgress]
        held = sum(s["numRowsUpdated"] - s["numRowsRemoved"] for s in states)
    finally:
        if query is not None:
            query.stop()
        spark.conf.unset("spark.sql.streaming.stateStore.providerClass")
    assert sorted(kept) == ["a", "b", "c", "d"]
    assert held == 2  # c and d
    state_files = {p.suffix for p in (checkpoint / "state").rglob("*") if p.is_file()}
    rocksdb = store == "rocksdb"  # the store asked for did keep the state
    assert (".zip" in state_files, ".delta" in state_files) == (rocksdb, not rocksdb)
