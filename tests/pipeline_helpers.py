"""Builders shared by the pipeline tests: hand-made events, a registry, produce to Kafka."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterable
from datetime import date, datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

from infra import contract as c
from infra import lake

if TYPE_CHECKING:
    from pipeline.job import Pipeline


def make_event(
    device_id: str, seq: int, at: datetime, *, event_id: str | None = None, **fields: Any
) -> dict[str, Any]:
    metrics = {"voltage_v": 230.0, "current_a": 2.0, "power_w": 414.0, "temperature_c": 21.5}
    metrics.update(fields.pop("metrics", {}))
    return {
        "event_id": event_id or str(uuid.uuid4()),
        "device_id": device_id,
        "event_time": at.astimezone(timezone.utc).isoformat().replace("+00:00", "Z"),
        "seq": seq,
        "firmware": fields.pop("firmware", "1.0.0"),
        "lat": fields.pop("lat", 52.52),
        "lon": fields.pop("lon", 13.40),
        "metrics": metrics,
        **fields,
    }


def normal_metrics(i: int) -> dict[str, float]:
    """A smart meter's readings with a little deterministic noise (power factor 0.9)."""
    voltage, current = 230.0 + (i % 7) * 0.3, 2.0 + (i % 5) * 0.01
    return {"voltage_v": voltage, "current_a": current, "power_w": voltage * current * 0.9,
            "temperature_c": 21.0 + (i % 3) * 0.1, "signal_dbm": -70.0 - (i % 4)}  # fmt: skip


def device_series(
    device_id: str, start: datetime, count: int, every_s: float = 30, **fields: Any
) -> list[dict[str, Any]]:
    """``count`` readings ``every_s`` seconds apart; ``metrics`` entries override the noise."""
    overrides = fields.pop("metrics", {})
    return [
        make_event(
            device_id, i, start + timedelta(seconds=i * every_s),
            metrics={**normal_metrics(i), **overrides}, **fields,
        )
        for i in range(count)
    ]  # fmt: skip


def write_registry(lake_root: str, device_ids: Iterable[str], mode: str = "overwrite") -> None:
    """A registry of smart meters at the default site, written with deltalake (no JVM)."""
    import pyarrow as pa
    from deltalake import write_deltalake

    now = datetime.now(timezone.utc)
    rows = [
        {"device_id": d, "device_type": "smart_meter", "owner": "Test Owner",
         "site_address": "1 Test Street", "site_lat": 52.52, "site_lon": 13.40,
         "expected_firmware": "1.0.0", "plan": "basic", "install_date": date(2024, 1, 1),
         "status": "active", "updated_at": now}
        for d in device_ids
    ]  # fmt: skip
    table = pa.Table.from_pylist(rows, schema=c.arrow_schema(c.DEVICES_COLUMNS))
    write_deltalake(lake.table_path(lake_root, lake.DEVICES), table, mode=mode)  # type: ignore[arg-type]


def register_and_wait(
    pipeline: Pipeline,
    lake_root: str,
    device_ids: Iterable[str],
    mode: str = "overwrite",
    timeout_s: float = 30.0,
) -> None:
    """``write_registry``, then wait (bounded) until the running ``pipeline`` has cached the new
    version: it looks every second (``pipeline.registry``), and only the batches planned after
    that see the new devices. Fails when the version does not move by exactly one."""
    registry = pipeline.registry
    assert registry is not None, "the pipeline has no registry cached: start its joins"
    before = registry.version
    write_registry(lake_root, device_ids, mode=mode)
    deadline = time.monotonic() + timeout_s
    while registry.version == before and time.monotonic() < deadline:
        time.sleep(0.2)
    assert registry.version == before + 1, (
        f"registry version {registry.version} after {timeout_s:.0f} s, expected {before + 1}"
    )


def produce(bootstrap: str, topic: str, messages: Iterable[tuple[str | None, bytes]]) -> int:
    return len(produce_at(bootstrap, topic, messages))


def produce_at(
    bootstrap: str,
    topic: str,
    messages: Iterable[tuple[str | None, bytes | None]],
    timestamp: datetime | None = None,
) -> list[tuple[int, int]]:
    """Produce ``messages`` in order, stamped ``timestamp`` (default: now); the Kafka
    (partition, offset) of each one, in that order."""
    from confluent_kafka import KafkaError, Message, Producer

    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    coordinates: list[tuple[int, int]] = []
    for index, (key, value) in enumerate(messages):
        coordinates.append((-1, -1))

        def delivered(err: KafkaError | None, msg: Message, index: int = index) -> None:
            assert err is None, err
            coordinates[index] = (msg.partition(), msg.offset())

        producer.produce(
            topic, key=key.encode() if key else None, value=value, on_delivery=delivered,
            timestamp=0 if timestamp is None else int(timestamp.timestamp() * 1000),
        )  # fmt: skip
    assert producer.flush(30) == 0
    assert (-1, -1) not in coordinates
    return coordinates


def encoded(events: Iterable[dict[str, Any]]) -> list[tuple[str | None, bytes]]:
    return [(e["device_id"], json.dumps(e).encode()) for e in events]


def topic_messages(bootstrap: str, topic: str) -> list[Any]:
    """Every message in ``topic`` now, in offset order per partition."""
    from infra.kafka_client import read_topic

    return read_topic({"bootstrap.servers": bootstrap}, topic)


def latest_alerts(bootstrap: str, topic: str) -> dict[str, dict[str, Any]]:
    """The alerts topic as a consumer keeping each alert's latest windowed message sees it (the
    fast path's are left out), without ``path``; every message keyed by its alert's device."""
    from pipeline.publish import PATH, WINDOWED, read_alert_message

    latest: dict[str, dict[str, Any]] = {}
    for message in topic_messages(bootstrap, topic):
        record = read_alert_message(message.value())
        assert message.key().decode() == record["device_id"]
        if record.pop(PATH) == WINDOWED:
            latest[record["alert_id"]] = record
    return latest


def table_alerts(lake_root: str) -> dict[str, dict[str, Any]]:
    """The ``alerts`` table's rows by ``alert_id``, as ``latest_alerts`` gives them."""
    from deltalake import DeltaTable

    rows = DeltaTable(lake.table_path(lake_root, lake.ALERTS)).to_pyarrow_table().to_pylist()

    def value(cell: Any) -> Any:
        if isinstance(cell, datetime) and cell.tzinfo is None:
            return cell.replace(tzinfo=timezone.utc)
        return cell

    return {r["alert_id"]: {k: value(v) for k, v in r.items()} for r in rows}


def query_stage_pools(spark: Any, query: Any) -> dict[str, int]:
    """The fair scheduler pools the stages of ``query`` (a running or stopped StreamingQuery of
    ``spark``) ran in, with how many stages each: from Spark's status store, which keeps the
    pool of every stage (what the UI's Stages page shows) whether or not the UI is on."""
    context = spark.sparkContext
    store = context._jsc.sc().statusStore()
    stages = store.stageList(None, False, False, context._gateway.new_array(context._jvm.double, 0),
                             None)  # fmt: skip
    # A streaming query's jobs, foreachBatch's included, are described with its run id.
    run = f"runId = {query.runId}"
    pools: dict[str, int] = {}
    for i in range(stages.size()):
        stage, description = stages.apply(i), stages.apply(i).description()
        if description.isDefined() and run in description.get():
            pools[stage.schedulingPool()] = pools.get(stage.schedulingPool(), 0) + 1
    return pools
