"""The local stack on real parts: Kafka broker, Spark with the Kafka source and Delta, MLflow."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from infra.jars import SPARK_BUNDLE, bundle_dir
from infra.settings import StackSettings

pytestmark = pytest.mark.integration


def test_produce_and_consume_multi_partition_topic(
    bootstrap: str, make_topic: Callable[..., str]
) -> None:
    from confluent_kafka import Consumer, Producer

    topic = make_topic(partitions=3)
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    sent = {f"dev-{i % 7}": [] for i in range(7)}  # type: dict[str, list[int]]
    for i in range(300):
        key = f"dev-{i % 7}"
        sent[key].append(i)
        producer.produce(topic, key=key, value=json.dumps({"i": i}).encode())
    assert producer.flush(30) == 0

    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": topic, "auto.offset.reset": "earliest"}
    )
    consumer.subscribe([topic])
    received: dict[str, list[int]] = {}
    partitions_of_key: dict[str, set[int]] = {}
    try:
        while sum(map(len, received.values())) < 300:
            msg = consumer.poll(10)
            assert msg is not None, "timed out waiting for messages"
            assert msg.error() is None
            key = msg.key().decode()
            received.setdefault(key, []).append(json.loads(msg.value())["i"])
            partitions_of_key.setdefault(key, set()).add(msg.partition())
    finally:
        consumer.close()

    assert received == sent  # every message, in order per key
    assert all(len(parts) == 1 for parts in partitions_of_key.values())
    used = Counter(p for parts in partitions_of_key.values() for p in parts)
    assert len(used) > 1, "keys should spread over several partitions"


def test_spark_reads_kafka_writes_delta_and_deltalake_reads_it(
    spark, bootstrap: str, make_topic: Callable[..., str], tmp_path: Path
) -> None:
    from confluent_kafka import Producer
    from deltalake import DeltaTable

    topic = make_topic(partitions=2)
    producer = Producer({"bootstrap.servers": bootstrap})
    for i in range(50):
        producer.produce(topic, key=f"k{i % 5}", value=json.dumps({"n": i}).encode())
    assert producer.flush(30) == 0

    table = str(tmp_path / "events")
    stream = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .load()
        .selectExpr("CAST(key AS STRING) AS key", "CAST(value AS STRING) AS value", "partition")
    )
    query = (
        stream.writeStream.format("delta")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start(table)
    )
    try:
        query.awaitTermination(120)
    finally:
        query.stop()

    assert spark.read.format("delta").load(table).count() == 50
    rows = DeltaTable(table).to_pyarrow_table().to_pylist()
    assert sorted(json.loads(r["value"])["n"] for r in rows) == list(range(50))
    assert {r["partition"] for r in rows} == {0, 1}


def test_model_registered_in_sqlite_store_loads_by_alias_in_spark_udf(
    spark, mlflow_uri: str, tmp_path: Path
) -> None:
    import mlflow
    import pandas as pd
    from mlflow.models import infer_signature

    class Doubler(mlflow.pyfunc.PythonModel):  # type: ignore[misc]
        def predict(self, context, model_input, params=None):  # type: ignore[no-untyped-def]
            return model_input["x"] * 2.0

    mlflow.set_tracking_uri(mlflow_uri)
    mlflow.set_registry_uri(mlflow_uri)
    experiment = mlflow.create_experiment(
        "stack-test", artifact_location=(tmp_path / "art").as_uri()
    )
    example = pd.DataFrame({"x": [1.0, 2.0]})
    with mlflow.start_run(experiment_id=experiment):
        mlflow.pyfunc.log_model(
            name="model",
            python_model=Doubler(),
            signature=infer_signature(example, Doubler().predict(None, example)),
            input_example=example,
            registered_model_name="doubler",
        )
    mlflow.MlflowClient().set_registered_model_alias("doubler", "champion", "1")

    predict = mlflow.pyfunc.spark_udf(
        spark, "models:/doubler@champion", result_type="double", env_manager="local"
    )
    df = spark.createDataFrame([(1.5,), (4.0,)], "x double")
    assert [r.y for r in df.select(predict("x").alias("y")).collect()] == [3.0, 8.0]


def test_second_resolution_needs_no_network(stack_settings: StackSettings, tmp_path: Path) -> None:
    """With the Ivy cache warm, the Spark bundle resolves again with the network made unusable."""
    assert (bundle_dir(SPARK_BUNDLE, stack_settings.cache_dir) / ".complete").exists()
    offline_cache = tmp_path / "cache"
    offline_cache.mkdir()
    # Reuse the Ivy metadata cache but retrieve into a fresh folder, through a dead proxy.
    (offline_cache / "ivy").symlink_to(stack_settings.cache_dir / "ivy")
    dead_proxy = " ".join(
        f"-D{scheme}.proxyHost=127.0.0.1 -D{scheme}.proxyPort=9" for scheme in ("http", "https")
    )
    env = {**os.environ, "JAVA_TOOL_OPTIONS": dead_proxy}
    code = (
        "from pathlib import Path; from infra.jars import SPARK_BUNDLE, resolve; "
        f"print(len(resolve(SPARK_BUNDLE, Path({str(offline_cache)!r}))))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert int(result.stdout.strip().splitlines()[-1]) >= 5
