"""Session-scoped real parts: one Kafka broker and one SparkSession for the whole run (for each
worker, under ``pytest -n``).

Each test gets its own topic, lake folder and checkpoint folder.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from infra.kafka import KafkaBroker
from infra.ports import free_port
from infra.settings import SparkSettings, StackSettings

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def pytest_configure(config: pytest.Config) -> None:
    """The stack's state (log file, broker folders) of every command a test runs goes to a
    temporary folder unless the test names one: never into the checkout's ``.iotfraud``, where a
    user's own runs keep theirs."""
    os.environ.setdefault("IOT_STACK_STATE_DIR", tempfile.mkdtemp(prefix="iotfraud-tests-"))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The longest tests first: those with a longer time limit than the default (the longest
    limit first), then the others marked slow. Under ``make test``'s two workers, a long test
    left for the end would run there alone while the other worker idles."""

    def length(item: pytest.Item) -> tuple[float, bool]:
        marker = item.get_closest_marker("timeout")
        limit = float(marker.args[0]) if marker and marker.args else 0.0
        return limit, item.get_closest_marker("slow") is not None

    items.sort(key=length, reverse=True)  # stable: the rest keep their order


@pytest.fixture(scope="session")
def stack_settings(tmp_path_factory: pytest.TempPathFactory) -> StackSettings:
    """Stack state in a temporary folder; the jar cache is the user-level one."""
    return StackSettings(state_dir=tmp_path_factory.mktemp("stack"))


@pytest.fixture(scope="session")
def kafka_broker(stack_settings: StackSettings) -> Iterator[KafkaBroker]:
    """A real Apache Kafka broker on free ports, started once for the session."""
    broker = KafkaBroker(
        home=stack_settings.state_dir / "kafka",
        cache_dir=stack_settings.cache_dir,
        port=free_port(),
        controller_port=free_port(),
    )
    broker.start(timeout_s=90)
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture(scope="session")
def bootstrap(kafka_broker: KafkaBroker) -> str:
    return kafka_broker.bootstrap_servers


@pytest.fixture
def make_topic(bootstrap: str) -> Callable[..., str]:
    """Create a uniquely named topic: ``make_topic(partitions=3)`` returns its name."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})

    def create(partitions: int = 3, prefix: str = "test") -> str:
        name = f"{prefix}.{uuid.uuid4().hex[:10]}"
        futures = admin.create_topics([NewTopic(name, num_partitions=partitions)])
        futures[name].result(timeout=30)
        return name

    return create


@pytest.fixture(scope="session")
def spark(stack_settings: StackSettings) -> Iterator[SparkSession]:
    """One SparkSession (local[2], Kafka source and Delta) for the whole run."""
    from infra.spark import build_spark_session

    session = build_spark_session(
        "iotfraud-tests",
        SparkSettings(master="local[2]", shuffle_partitions=2, driver_memory="2g"),
        stack_settings,
    )
    yield session
    session.stop()


@pytest.fixture
def lake(tmp_path: Path) -> str:
    root = tmp_path / "lake"
    root.mkdir()
    return str(root)


@pytest.fixture
def mlflow_uri(tmp_path: Path) -> str:
    """A fresh MLflow SQLite tracking and registry store."""
    return f"sqlite:///{tmp_path / 'mlflow.db'}"
