"""Pure DataFrame transforms of the ingest stage: parse, split valid from quarantined, and what
makes two rows copies of one event.

Every function takes and returns a DataFrame, reads no environment and does no I/O, so each runs
the same on a stream, in ``foreachBatch`` and on static test data.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.window import Window

from infra import contract as c
from pipeline import columns as col

_RAW_MAP = "map<string,string>"
_KNOWN_FIELDS = [name for name, _ in c.EVENT_FIELDS]
_CORRUPT = "_corrupt_record"
# Fields that must be JSON strings. Into a string field Spark's parser writes a number, a boolean
# or an object as its JSON text (12345 would pass for "12345"); a variant keeps the JSON type.
_STRING_FIELDS = ("event_id", "device_id", "firmware")
# Every other known field as its JSON text (a string value unquoted, anything else as written), so
# a wrong type is seen by the casts below rather than hidden by the parser. A struct is parsed
# faster than a map (docs/PERFORMANCE.md), and its fields are read without a key search.
_RAW_EVENT = ", ".join(
    f"`{name}`: {'variant' if name in _STRING_FIELDS else 'string'}" for name in _KNOWN_FIELDS
)
# Spark's parser reads the first JSON value of a text and ignores the rest, so "{...}garbage" or
# two events in one message would pass as the first event. The value is parsed as the first member
# of a wrapper object instead: anything after it is a syntax error, or ends the wrapper before its
# last member.
_WRAPPER = ('{"event":', ',"end":true}')
_RAW_STRUCT = f"`event` struct<{_RAW_EVENT}>, `end` boolean, `{_CORRUPT}` string"
_RAW_METRICS = ", ".join(f"`{name}` string" for name in c.METRICS)
# The same event read straight into the contract's types: what nearly every message is, read
# without writing each number back as text and parsing it again. A value of another type (a
# number sent as text, a list for a number) fails this read, and the record is read again as
# above.
_TYPED_KINDS = {
    **dict(c.EVENT_FIELDS),
    **{name: "variant" for name in _STRING_FIELDS},
    "event_time": "string",  # its own checks read the text
    "metrics": "struct<" + ", ".join(f"`{m}`: double" for m in c.METRICS) + ">",
}
_TYPED_STRUCT = (
    "`event` struct<" + ", ".join(f"`{name}`: {_TYPED_KINDS[name]}" for name in _KNOWN_FIELDS)
    + f">, `end` boolean, `{_CORRUPT}` string"
)  # fmt: skip
# Into a string field Spark's parser writes a number a double cannot hold (NaN, Infinity, 1e400)
# quoted: unquoted, it is an impossible value for the range check, as it is among the metrics.
_QUOTED_NON_FINITE = ('"NaN"', '"Infinity"', '"-Infinity"')
MIN_EVENT_TIME = "2000-01-01 00:00:00"
# An ISO-8601 time that ends with its zone: Z or an offset (+02:00, +0200, -05). Without one the
# device's local time would be read as UTC, hours off.
_ZONED_TIME = r"\d:\d\d(:\d\d(\.\d+)?)?(Z|[+-]\d\d(:?\d\d)?)$"


def now() -> Column:
    """The time now, read for each row as Spark evaluates it.

    Not ``current_timestamp()``: Spark replaces that with a literal of the query's (or the
    micro-batch's) start, and a literal is part of the code Spark generates and compiles for the
    query. Every micro-batch of every query that parses would then be new code, compiled again
    before it could run (the parse is thousands of lines of Java), which no cache of compiled
    code can save. A Real-time Mode batch lasts minutes, so the fast path needs each event's own
    time anyway.
    """
    millis = F.expr("reflect('java.lang.System', 'currentTimeMillis')").cast("long")
    return F.timestamp_millis(millis)


def _number_text(raw: Column) -> Column:
    """A number field's JSON text, with a number a double cannot hold unquoted."""
    return F.when(raw.isin(*_QUOTED_NON_FINITE), F.btrim(raw, F.lit('"'))).otherwise(raw)


def _id_length_ok(id_text: Column) -> Column:
    """An id of the contract's length: not empty, at most ``MAX_ID_LENGTH`` (null for a null
    id: a missing id is a reason of its own)."""
    return F.length(id_text).between(1, c.MAX_ID_LENGTH)


def _not_before_min_time(event_time: Column) -> Column:
    """An event time the contract accepts: not before ``MIN_EVENT_TIME``."""
    return event_time >= F.lit(MIN_EVENT_TIME).cast("timestamp")


def _zoned(text: Column) -> Column:
    """An event time's text ends with its zone (``_ZONED_TIME``)."""
    return text.rlike(_ZONED_TIME)


def _key_matches(device_id: Column) -> Column:
    """The record's Kafka key, if it has one, names ``device_id``."""
    return F.col(col.KEY).isNull() | (F.col(col.KEY) == device_id)


def _range_check(value: Column, field: str) -> Column:
    """True when ``value`` is null or finite and inside the contract's valid range."""
    low, high = c.VALID_RANGES[field]
    finite = ~F.isnan(value) if field != "seq" else F.lit(True)
    return value.isNull() | (finite & value.between(low, high))


def parse_events(
    raw: DataFrame,
    *,
    max_bytes: int = c.MAX_MESSAGE_BYTES,
    max_clock_ahead: str = "1 minute",
    typed_first: bool = True,
) -> DataFrame:
    """Parse raw records into typed event columns plus a quarantine ``reason`` (null when valid).

    Input columns: key (string), value (binary), topic, partition, offset, timestamp (the Kafka
    source's shape). Output: the input columns, every contract event column (event_time as a
    timestamp, metrics flattened), ``extra`` (unknown fields as a map), ``ingest_time``,
    ``reason`` and ``detail``. Stateless; safe on a stream.

    The value must be one JSON object and nothing after it; event_id, device_id and firmware JSON
    strings; event_time an ISO-8601 time with its zone (Z or an offset).

    An event_time more than ``max_clock_ahead`` after the message's own timestamp (the time it
    was produced) comes from a clock running ahead: accepted, it would move the watermark and
    make every on-time event of every other device late. Comparing with the message timestamp
    rather than the clock keeps the decision the same when a batch is replayed.

    Each value is read first straight into the contract's types (event_time as text, the string
    fields as variants: their checks need more). A record that read fails (bad JSON, a value of
    another type) is read again, each field as its JSON text, for its reason or for the values
    the contract also accepts (a number sent as a string). ``typed_first=False`` reads every
    record the second way: the same result, which the tests check.
    """
    # Each stage materialises its columns once: referenced many times below, a from_json inside
    # the reason chain would otherwise be evaluated again for every branch. A filter
    # on the reason pushed below the stages would do the same (the unit tests check the plan).
    text = F.col(col.VALUE).cast("string")
    wrapped = F.concat(F.lit(_WRAPPER[0]), text, F.lit(_WRAPPER[1]))
    corrupt = {"columnNameOfCorruptRecord": _CORRUPT}
    typed_read = raw.select(
        "*",
        (F.from_json(wrapped, _TYPED_STRUCT, corrupt) if typed_first
         else F.lit(None).cast(f"struct<{_TYPED_STRUCT}>")).alias("_typed"),
        # Keys only (values skipped): unknown fields are rare, their map is parsed only then.
        F.json_object_keys(text).alias("_keys"),
    )  # fmt: skip
    read_typed = F.coalesce(
        F.col(f"_typed.{_CORRUPT}").isNull()
        & F.col("_typed.end").isNotNull()
        & F.col("_typed.event").isNotNull(),
        F.lit(False),
    )
    decoded = typed_read.select(
        "*",
        read_typed.alias("_ok"),
        F.when(~read_typed, F.from_json(wrapped, _RAW_STRUCT, corrupt)).alias("_json"),
    ).select(
        "*",
        F.col("_json.event").alias("_fields"),
        F.from_json(F.col("_json.event.metrics"), _RAW_METRICS).alias("_metrics"),
        F.when(
            F.exists("_keys", lambda k: ~k.isin(_KNOWN_FIELDS)),
            F.map_filter(F.from_json(text, _RAW_MAP), lambda k, _: ~k.isin(_KNOWN_FIELDS)),
        ).alias("extra"),
    )
    ok = F.col("_ok")
    not_object = ~ok & (
        F.col("_fields").isNull()
        | F.col(f"_json.{_CORRUPT}").isNotNull()
        | F.col("_json.end").isNull()
    )

    def field(name: str) -> Column:
        """A string field (a variant) or event_time (text) from the read that succeeded: the
        same type in both."""
        return F.when(ok, F.col("_typed.event")[name]).otherwise(F.col("_fields")[name])

    def string(name: str) -> Column:
        """The field's value if it is a JSON string, else null."""
        return F.when(F.schema_of_variant(field(name)) == "STRING", field(name).cast("string"))

    def number(name: str, kind: str) -> Column:
        typed_value = F.col("_typed.event")[name]
        return F.when(ok, typed_value).otherwise(
            _number_text(F.col("_fields")[name]).try_cast(kind)
        )

    typed: dict[str, Column] = {
        "event_id": string("event_id"),
        "device_id": string("device_id"),
        "event_time": F.try_to_timestamp(field("event_time")),
        "seq": number("seq", "bigint"),
        "firmware": string("firmware"),
        "lat": number("lat", "double"),
        "lon": number("lon", "double"),
        **{
            m: F.when(ok, F.col("_typed.event.metrics")[m]).otherwise(
                F.col("_metrics")[m].try_cast("double")
            )
            for m in c.METRICS
        },
    }
    typed_df = decoded.select(
        "*",
        *(expr.alias(name) for name, expr in typed.items()),
        now().alias("ingest_time"),
    )

    def absent(name: str) -> Column:
        """Not in the message, or JSON null."""
        if name in _STRING_FIELDS:
            return field(name).isNull() | F.is_variant_null(field(name))
        if name == "event_time":
            return field(name).isNull()
        return F.when(ok, F.col("_typed.event")[name].isNull()).otherwise(
            F.col("_fields")[name].isNull()
        )

    def wrong_type(name: str, sent: Column) -> Column:
        """Sent, but not convertible to the contract's type (the string "null" included)."""
        return sent & F.col(name).isNull()

    missing = [F.when(absent(f), F.lit(f)) for f in c.REQUIRED_FIELDS]
    # Where the typed read succeeded only a string field can hold another type (a variant takes
    # any): the other fields are of theirs.
    wrong_string = [F.when(wrong_type(f, ~absent(f)), F.lit(f)) for f in _STRING_FIELDS]
    wrong_other = [
        F.when(wrong_type(name, F.col("_fields")[name].isNotNull()), F.lit(name))
        for name in ("seq", "lat", "lon")
    ]
    wrong_other += [
        F.when(wrong_type(m, F.col("_metrics")[m].isNotNull()), F.lit(f"metrics.{m}"))
        for m in c.METRICS
    ]
    wrong = F.when(ok, F.coalesce(*wrong_string)).otherwise(F.coalesce(*wrong_string, *wrong_other))
    # The parser writes an object's text back starting with "{"; a list or a scalar is no object.
    # Where the typed read succeeded, metrics was an object or null.
    raw_metrics = F.col("_fields.metrics")
    metrics_not_object = ~ok & raw_metrics.isNotNull() & ~raw_metrics.startswith("{")
    out_of_range = [
        F.when(~_range_check(F.col(name), name), F.lit(name))
        for name in ("seq", "lat", "lon", *c.METRICS)
    ]
    event_ok, device_ok = (_id_length_ok(F.col(f)) for f in ("event_id", "device_id"))
    # Null when an id is missing and the other's length is fine (coalesced to False below: the
    # missing id is its own reason); True when either length is wrong.
    bad_id = ~(event_ok & device_ok)
    checks = typed_df.select(
        "*",
        (F.length(F.col(col.VALUE)) > max_bytes).alias("_oversize"),
        (~F.is_valid_utf8(F.col(col.VALUE))).alias("_not_utf8"),
        F.coalesce(*missing).alias("_missing"),
        wrong.alias("_wrong"),
        metrics_not_object.alias("_metrics_not_object"),
        F.coalesce(bad_id, F.lit(False)).alias("_bad_id"),
        (F.col("event_time").isNull() | ~_not_before_min_time(F.col("event_time"))).alias(
            "_bad_time"
        ),
        (F.col("event_time").isNotNull() & ~_zoned(field("event_time"))).alias("_no_zone"),
        clock_ahead(F.col("event_time"), max_clock_ahead).alias("_ahead"),
        F.coalesce(*out_of_range).alias("_out_of_range"),
    )
    reason = (
        F.when(F.col("_oversize"), F.lit(c.REASON_OVERSIZE))
        .when(F.col("_not_utf8"), F.lit(c.REASON_INVALID_UTF8))
        .when(not_object, F.lit(c.REASON_INVALID_JSON))
        .when(F.col("_missing").isNotNull(), F.lit(c.REASON_MISSING_FIELD))
        .when(F.col("_wrong").isNotNull() | F.col("_metrics_not_object") | F.col("_bad_id"),
              F.lit(c.REASON_WRONG_TYPE))
        .when(F.col("_bad_time") | F.col("_no_zone"), F.lit(c.REASON_BAD_TIMESTAMP))
        .when(F.col("_ahead"), F.lit(c.REASON_CLOCK_AHEAD))
        .when(F.col("_out_of_range").isNotNull(), F.lit(c.REASON_OUT_OF_RANGE))
        .when(~_key_matches(F.col("device_id")), F.lit(c.REASON_KEY_MISMATCH))
    )  # fmt: skip
    detail = (
        F.when(F.col("_oversize"),
               F.format_string("%d bytes > %d", F.length(F.col(col.VALUE)), F.lit(max_bytes)))
        .when(F.col("_not_utf8"), F.lit("value is not valid UTF-8"))
        .when(not_object, F.lit("value is not a JSON object"))
        .when(F.col("_missing").isNotNull(), F.concat(F.lit("missing "), F.col("_missing")))
        .when(F.col("_metrics_not_object"), F.lit("metrics is not an object"))
        .when(F.col("_bad_id"), F.lit("empty or over-long event_id/device_id"))
        .when(F.col("_wrong").isNotNull(), F.concat(F.lit("wrong type: "), F.col("_wrong")))
        .when(F.col("_bad_time"),
              F.concat(F.lit("event_time: "), F.substring(field("event_time"), 1, 64)))
        .when(F.col("_no_zone"),
              F.concat(F.lit("event_time without a time zone: "),
                       F.substring(field("event_time"), 1, 64)))
        .when(F.col("_ahead"),
              F.concat(F.lit(f"event_time more than {max_clock_ahead} ahead of the message: "),
                       F.substring(field("event_time"), 1, 64)))
        .when(F.col("_out_of_range").isNotNull(),
              F.concat(F.lit("out of range: "), F.col("_out_of_range")))
        .when(~_key_matches(F.col("device_id")), F.lit("Kafka key differs from device_id"))
    )  # fmt: skip
    helpers = [name for name in checks.columns if name.startswith("_")]
    return checks.select("*", reason.alias(col.REASON), detail.alias(col.DETAIL)).drop(*helpers)


def clock_ahead(event_time: Column, max_clock_ahead: str) -> Column:
    """``event_time`` is more than ``max_clock_ahead`` after its raw record's Kafka timestamp
    (``parse_events``: the time it was produced): the device's clock runs ahead."""
    sent = F.coalesce(F.col(col.TIMESTAMP), now())
    return event_time > sent + F.expr(f"INTERVAL {max_clock_ahead}")


# What ``senders`` reads of a record: who sent it and when.
_SENDER = "`device_id` string, `event_time` string"


def senders(raw: DataFrame, *, max_clock_ahead: str = "1 minute") -> DataFrame:
    """Who sent each raw record, and when: for what needs only to know that a device is alive
    (the silence query), at a fraction of the cost of ``parse_events``.

    Input: raw records (``parse_events``). Output, one row per record: ``kafka_partition``,
    ``kafka_offset``, ``kafka_timestamp``, ``device_id``, ``event_time`` and ``clock_ahead``
    (the event time is more than ``max_clock_ahead`` after the record's Kafka timestamp: the
    time is wrong, not the device's being alive). ``device_id`` and ``event_time`` are null
    unless the record is a JSON object with a non-empty ``device_id`` and an ``event_time`` the
    contract accepts (ISO-8601 with its zone, not before 2000), and its Kafka key, if any, is
    that device. Such a record says its device sent it then, whatever the rest of it holds: one
    quarantined for its content (a reading out of range, a missing metric) counts. Read more
    leniently than by ``parse_events``, whose quarantine reasons these are: a number for the
    device id is read as its text, text after the object is ignored. Stateless; safe on a
    stream.

    Not a filter: Spark would push it below the parse and parse every record once more for it.
    """
    read = raw.select(
        F.col(col.PARTITION).alias("kafka_partition"),
        F.col(col.OFFSET).alias("kafka_offset"),
        F.col(col.TIMESTAMP),
        F.col(col.KEY),
        F.from_json(F.col(col.VALUE).cast("string"), _SENDER).alias("_sender"),
    ).select(
        "*",
        F.col("_sender.device_id").alias("_device"),
        F.try_to_timestamp(F.col("_sender.event_time")).alias("_time"),
    )
    device, time = F.col("_device"), F.col("_time")
    sound = F.coalesce(
        _id_length_ok(device)
        & _key_matches(device)
        & _not_before_min_time(time)
        & _zoned(F.col("_sender.event_time")),
        F.lit(False),
    )
    return read.select(
        "kafka_partition",
        "kafka_offset",
        F.col(col.TIMESTAMP).alias("kafka_timestamp"),
        F.when(sound, device).alias("device_id"),
        F.when(sound, time).alias("event_time"),
        (sound & clock_ahead(time, max_clock_ahead)).alias("clock_ahead"),
    )


def valid_events(parsed: DataFrame) -> DataFrame:
    """Rows of ``parse_events`` that passed every check, in the bronze ``telemetry`` shape."""
    return parsed.where(F.col(col.REASON).isNull()).select(*_bronze_columns())


def events_and_flagged(parsed: DataFrame) -> DataFrame:
    """Rows of ``parse_events`` that passed every check, and those quarantined for a reason
    that flags their device (``infra.contract.QUARANTINE_ALERT_TYPES``: a reading out of its
    physical range, a clock ahead), in the bronze shape plus ``reason`` (null when valid). Those
    reasons come after the checks of presence, type and time: their typed fields are sound."""
    reason = F.col(col.REASON)
    flags = list(c.QUARANTINE_ALERT_TYPES)
    return parsed.where(reason.isNull() | reason.isin(flags)).select(*_bronze_columns(), reason)


def _bronze_columns() -> list[Column]:
    bookkeeping = {
        "kafka_topic",
        "kafka_partition",
        "kafka_offset",
        "kafka_timestamp",
        "ingest_time",
    }
    event_columns = [n for n in c.column_names(c.TELEMETRY_COLUMNS) if n not in bookkeeping]
    return [*(F.col(name) for name in event_columns), *_source_columns()]


def quarantined(parsed: DataFrame) -> DataFrame:
    """Rows of ``parse_events`` that failed a check, in the ``quarantine`` shape."""
    return parsed.where(F.col(col.REASON).isNotNull()).select(*_quarantine_columns())


def _quarantine_columns() -> list[Column]:
    return [
        F.col(col.VALUE).alias("raw_value"),
        F.col(col.KEY).alias("raw_key"),
        F.col(col.REASON).alias("reason"),
        F.col(col.DETAIL).alias("detail"),
        F.col("device_id"),
        F.col("event_id"),
        F.col("event_time"),
        *_source_columns(),
    ]


def _source_columns() -> list[Column]:
    """Where a row came from, as bronze and quarantine name it, and when it was read."""
    return [
        F.col(col.TOPIC).alias("kafka_topic"),
        F.col(col.PARTITION).alias("kafka_partition"),
        F.col(col.OFFSET).alias("kafka_offset"),
        F.col(col.TIMESTAMP).alias("kafka_timestamp"),
        F.col("ingest_time"),
    ]


def copy_rank(coordinates: Sequence[str], *among: Column) -> Column:
    """A row's place among the copies of its event (same event_id and event_time, and the same
    values of ``among``), in order of its source ``coordinates``: 1 is the original."""
    order = Window.partitionBy("event_id", "event_time", *among).orderBy(*coordinates)
    return F.row_number().over(order)


def event_key(event_id: Column, event_time: Column) -> Column:
    """The 64-bit hash that identifies an event: copies share event_id and event_time."""
    return F.xxhash64(event_id, event_time)


def first_copies(events: DataFrame, watermark: str) -> DataFrame:
    """A stream of valid events with the copies of an event dropped while its event time is
    within the watermark (later ones are late for every window anyway).

    The ingest makes the same call for bronze (``pipeline.dedup``: its horizon is at least the
    watermark plus the allowed clock lead, see ``PipelineSettings``); the copies it sends to
    quarantine reach the features from there, as duplicates. Stateful (one key per event within
    the watermark); adds the watermark on ``event_time``.

    ``event_time`` is part of the key so that Spark forgets an event once the watermark passes
    its time: any later copy is late and dropped before it reaches the state.
    ``dropDuplicatesWithinWatermark`` gives the same rows but keeps each key for a further
    watermark delay, twice the state, which Spark scans in full on every batch to evict.
    """
    key = "_event_key"
    return (
        events.withWatermark("event_time", watermark)
        .withColumn(key, event_key(F.col("event_id"), F.col("event_time")))
        .dropDuplicates([key, "event_time"])
        .drop(key)
    )
