"""Bring the local stack up, report on it, bring it down.

The stack is: the Kafka broker process, the Spark connector jars in the cache, the MLflow SQLite
store and the lake folder. Only the broker is a process.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from infra import lake
from infra.errors import ConfigError
from infra.jars import COMPLETE_MARKER, KAFKA_BUNDLE, SPARK_BUNDLE, bundle_dir, resolve
from infra.kafka import SCRAM_MECHANISMS, KafkaBroker, SaslUser
from infra.mlflow_store import ensure_local_store, local_tracking_uri
from infra.settings import CommonSettings, StackSettings

log = logging.getLogger(__name__)


def local_broker(stack: StackSettings, common: CommonSettings | None = None) -> KafkaBroker:
    """The stack's broker; ``common`` gives the SCRAM user, needed to start it secured."""
    secured = stack.kafka_security == "sasl_ssl"
    return KafkaBroker(
        home=stack.state_dir / "kafka",
        cache_dir=stack.cache_dir,
        host=stack.kafka_host,
        port=stack.kafka_port,
        controller_port=stack.kafka_controller_port,
        heap=stack.kafka_heap,
        secure_port=stack.kafka_secure_port if secured else None,
        sasl_user=broker_user(common) if secured and common is not None else None,
    )


def broker_user(common: CommonSettings) -> SaslUser:
    """The SCRAM user of the secured listener: the one the clients log in with."""
    if not common.kafka_sasl_username or not common.kafka_sasl_password:
        raise ConfigError(
            "IOT_STACK_KAFKA_SECURITY=sasl_ssl needs the user the broker creates: set "
            "IOT_KAFKA_SASL_USERNAME and IOT_KAFKA_SASL_PASSWORD_FILE (a file holding the "
            "password) or IOT_KAFKA_SASL_PASSWORD."
        )
    if common.kafka_sasl_mechanism not in SCRAM_MECHANISMS:
        raise ConfigError(
            f"The local broker offers {' and '.join(SCRAM_MECHANISMS)}, not "
            f"{common.kafka_sasl_mechanism}: set IOT_KAFKA_SASL_MECHANISM to one of them."
        )
    return SaslUser(common.kafka_sasl_username, common.kafka_sasl_password.get_secret_value())


@dataclass(frozen=True)
class StackStatus:
    broker_running: bool
    bootstrap_servers: str
    spark_jars_cached: bool
    kafka_jars_cached: bool
    mlflow_tracking_uri: str
    lake_root: str
    secure_bootstrap_servers: str | None = None
    ca_location: str = ""

    @property
    def healthy(self) -> bool:
        return self.broker_running and self.spark_jars_cached and self.kafka_jars_cached

    def lines(self) -> list[str]:
        def mark(ok: bool) -> str:
            return "ok  " if ok else "DOWN"

        kafka = [f"[{mark(self.broker_running)}] kafka broker   {self.bootstrap_servers}"]
        if self.secure_bootstrap_servers:
            kafka.append(
                f"[{mark(self.broker_running)}] kafka sasl_ssl {self.secure_bootstrap_servers} "
                f"(CA {self.ca_location})"
            )
        return [
            *kafka,
            f"[{mark(self.kafka_jars_cached)}] kafka jars     cached",
            f"[{mark(self.spark_jars_cached)}] spark jars     kafka connector + delta cached",
            f"[ok  ] mlflow store   {self.mlflow_tracking_uri}",
            f"[ok  ] lake           {self.lake_root}",
        ]


def resolve_jars(stack: StackSettings) -> None:
    """Fetch every jar the stack needs into the cache (no-op when cached)."""
    resolve(KAFKA_BUNDLE, stack.cache_dir)
    resolve(SPARK_BUNDLE, stack.cache_dir)


def up(
    stack: StackSettings, common: CommonSettings, *, die_with_parent: bool = False
) -> StackStatus:
    """Resolve jars, create the lake and MLflow store, start the broker and wait for it (killed
    with this process if ``die_with_parent``; else it runs until ``down``)."""
    broker = local_broker(stack, common)
    resolve_jars(stack)
    lake.ensure_lake(common.lake_root)
    ensure_local_store(stack.state_dir)
    broker.start(timeout_s=stack.start_timeout_s, die_with_parent=die_with_parent)
    return status(stack, common)


def status(stack: StackSettings, common: CommonSettings) -> StackStatus:
    broker = local_broker(stack)
    return StackStatus(
        broker_running=broker.is_running(),
        bootstrap_servers=broker.bootstrap_servers,
        secure_bootstrap_servers=broker.secure_bootstrap_servers,
        ca_location=str(broker.tls.ca_pem) if broker.secure_port else "",
        spark_jars_cached=(bundle_dir(SPARK_BUNDLE, stack.cache_dir) / COMPLETE_MARKER).exists(),
        kafka_jars_cached=(bundle_dir(KAFKA_BUNDLE, stack.cache_dir) / COMPLETE_MARKER).exists(),
        mlflow_tracking_uri=common.mlflow_tracking_uri or local_tracking_uri(stack.state_dir),
        lake_root=common.lake_root,
    )


def down(stack: StackSettings) -> bool:
    """Stop the broker this stack started. Returns whether one was running."""
    return local_broker(stack).stop()
