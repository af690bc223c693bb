"""Bring the local stack up, report on it, bring it down.

The stack is: the Kafka broker process, the Spark connector jars in the cache, the MLflow SQLite
store and the lake folder. Only the broker is a process.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from infra import lake
from infra.jars import COMPLETE_MARKER, KAFKA_BUNDLE, SPARK_BUNDLE, bundle_dir, resolve
from infra.kafka import KafkaBroker
from infra.mlflow_store import ensure_local_store, local_tracking_uri
from infra.settings import CommonSettings, StackSettings

log = logging.getLogger(__name__)


def local_broker(stack: StackSettings) -> KafkaBroker:
    return KafkaBroker(
        home=stack.state_dir / "kafka",
        cache_dir=stack.cache_dir,
        host=stack.kafka_host,
        port=stack.kafka_port,
        controller_port=stack.kafka_controller_port,
        heap=stack.kafka_heap,
    )


@dataclass(frozen=True)
class StackStatus:
    broker_running: bool
    bootstrap_servers: str
    spark_jars_cached: bool
    kafka_jars_cached: bool
    mlflow_tracking_uri: str
    lake_root: str

    @property
    def healthy(self) -> bool:
        return self.broker_running and self.spark_jars_cached and self.kafka_jars_cached

    def lines(self) -> list[str]:
        def mark(ok: bool) -> str:
            return "ok  " if ok else "DOWN"

        return [
            f"[{mark(self.broker_running)}] kafka broker   {self.bootstrap_servers}",
            f"[{mark(self.kafka_jars_cached)}] kafka jars     cached",
            f"[{mark(self.spark_jars_cached)}] spark jars     kafka connector + delta cached",
            f"[ok  ] mlflow store   {self.mlflow_tracking_uri}",
            f"[ok  ] lake           {self.lake_root}",
        ]


def resolve_jars(stack: StackSettings) -> None:
    """Fetch every jar the stack needs into the cache (no-op when cached)."""
    resolve(KAFKA_BUNDLE, stack.cache_dir)
    resolve(SPARK_BUNDLE, stack.cache_dir)


def up(stack: StackSettings, common: CommonSettings) -> StackStatus:
    """Resolve jars, create the lake and MLflow store, start the broker and wait for it."""
    resolve_jars(stack)
    lake.ensure_lake(common.lake_root)
    ensure_local_store(stack.state_dir)
    local_broker(stack).start(timeout_s=stack.start_timeout_s)
    return status(stack, common)


def status(stack: StackSettings, common: CommonSettings) -> StackStatus:
    broker = local_broker(stack)
    return StackStatus(
        broker_running=broker.is_running(),
        bootstrap_servers=broker.bootstrap_servers,
        spark_jars_cached=(bundle_dir(SPARK_BUNDLE, stack.cache_dir) / COMPLETE_MARKER).exists(),
        kafka_jars_cached=(bundle_dir(KAFKA_BUNDLE, stack.cache_dir) / COMPLETE_MARKER).exists(),
        mlflow_tracking_uri=common.mlflow_tracking_uri or local_tracking_uri(stack.state_dir),
        lake_root=common.lake_root,
    )


def down(stack: StackSettings) -> bool:
    """Stop the broker this stack started. Returns whether one was running."""
    return local_broker(stack).stop()
