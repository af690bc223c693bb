"""How clients connect to Kafka: the security options built from the ``IOT_KAFKA_*`` settings, for
librdkafka (simulator, admin tools) and for the Java client (Spark's Kafka source), and a metadata
probe that fails at once, with the broker's reason, when the login or the TLS handshake is refused.

The options returned here carry the password: pass them to a client, never to a log line.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from infra.errors import ConfigError, KafkaAccessError
from infra.settings import CommonSettings

if TYPE_CHECKING:
    from confluent_kafka import KafkaError
    from confluent_kafka.admin import AdminClient, ClusterMetadata  # type: ignore[attr-defined]

log = logging.getLogger(__name__)

_LOGIN_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}


def _password(settings: CommonSettings) -> str:
    if not settings.kafka_sasl_password:
        raise ConfigError("no SASL password: set IOT_KAFKA_SASL_PASSWORD_FILE")
    return settings.kafka_sasl_password.get_secret_value()


def librdkafka_options(settings: CommonSettings) -> dict[str, str]:
    """``security.protocol``, ``sasl.*`` and ``ssl.ca.location``; empty for PLAINTEXT."""
    if settings.kafka_security_protocol == "PLAINTEXT":
        return {}
    options = {
        "security.protocol": settings.kafka_security_protocol,
        "sasl.mechanism": settings.kafka_sasl_mechanism,
        "sasl.username": settings.kafka_sasl_username,
        "sasl.password": _password(settings),
    }
    if settings.kafka_ssl_ca_location:
        options["ssl.ca.location"] = settings.kafka_ssl_ca_location
    return options


def java_client_options(settings: CommonSettings) -> dict[str, str]:
    """The same for the Java Kafka client (Spark's Kafka source takes them prefixed ``kafka.``)."""
    if settings.kafka_security_protocol == "PLAINTEXT":
        return {}
    mechanism, username = settings.kafka_sasl_mechanism, settings.kafka_sasl_username
    options = {
        "security.protocol": settings.kafka_security_protocol,
        "sasl.mechanism": mechanism,
        "sasl.jaas.config": jaas_config(mechanism, username, _password(settings)),
    }
    if settings.kafka_ssl_ca_location:
        options["ssl.truststore.type"] = "PEM"
        options["ssl.truststore.location"] = settings.kafka_ssl_ca_location
    return options


def jaas_config(mechanism: str, username: str, password: str) -> str:
    """A ``sasl.jaas.config`` value; quotes and backslashes in the values are escaped."""

    def quoted(value: str) -> str:
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'

    module = _LOGIN_MODULES[mechanism]
    return f"{module} required username={quoted(username)} password={quoted(password)};"


def connect(conf: dict[str, Any], timeout_s: float = 30.0) -> tuple[AdminClient, ClusterMetadata]:
    """An admin client and the cluster metadata.

    Raises:
        KafkaAccessError: at the first refused login or TLS handshake, with librdkafka's reason.
        ConfigError: no answer within ``timeout_s``.
    """
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient

    bootstrap = conf.get("bootstrap.servers", "")
    refused: list[KafkaError] = []
    last: list[KafkaError] = []

    def on_error(error: KafkaError) -> None:
        last[:] = [error]
        if error.code() in (KafkaError._AUTHENTICATION, KafkaError._SSL):
            refused.append(error)

    client_conf: dict[str, Any] = {"log_level": 0, **conf, "error_cb": on_error}
    admin = AdminClient(client_conf)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return admin, admin.list_topics(timeout=max(0.1, min(1.0, deadline - time.monotonic())))
        except KafkaException as exc:
            admin.poll(0)  # serves error_cb
            if refused:
                raise KafkaAccessError(
                    f"Kafka at {bootstrap} refused the connection: {refused[0].str()}. Check "
                    "IOT_KAFKA_SASL_USERNAME, the password (IOT_KAFKA_SASL_PASSWORD_FILE), "
                    "IOT_KAFKA_SASL_MECHANISM and IOT_KAFKA_SSL_CA_LOCATION."
                ) from None
            if time.monotonic() >= deadline:
                reason = last[0].str() if last else str(exc)
                raise ConfigError(
                    f"Kafka at {bootstrap} did not answer within {timeout_s:.0f}s ({reason}). "
                    "Check KAFKA_BOOTSTRAP_SERVERS and IOT_KAFKA_SECURITY_PROTOCOL."
                ) from None
            log.debug("Kafka at %s not answering yet: %s", bootstrap, exc)


def ensure_topic(
    conf: dict[str, Any], topic: str, partitions: int, replication: int = 1, timeout_s: float = 30
) -> bool:
    """Create ``topic`` with ``partitions`` if absent; True when this call created it.

    Raises:
        KafkaAccessError: the broker refused the login or the TLS handshake.
    """
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import NewTopic  # type: ignore[attr-defined]

    admin, metadata = connect(conf, timeout_s)
    if topic in metadata.topics and metadata.topics[topic].error is None:
        return False
    futures = admin.create_topics([NewTopic(topic, num_partitions=partitions,
                                            replication_factor=replication)])  # fmt: skip
    try:
        futures[topic].result(timeout=timeout_s)
    except KafkaException as exc:
        if exc.args and exc.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS:
            return False
        raise
    log.info("topic %s created with %d partitions", topic, partitions)
    return True


def read_topic(conf: dict[str, Any], topic: str, timeout_s: float = 60.0) -> list[Any]:
    """Every message ``topic`` holds now (up to its end offsets when called), in offset order
    per partition; for summaries and tests, not for streams.

    Raises:
        TimeoutError: the end was not reached within ``timeout_s``.
    """
    import uuid

    from confluent_kafka import Consumer, KafkaException, TopicPartition

    consumer = Consumer({**conf, "group.id": f"iotfraud-read-{uuid.uuid4()}",
                         "enable.auto.commit": False})  # fmt: skip
    try:
        deadline = time.monotonic() + timeout_s
        partitions = consumer.list_topics(topic, timeout=timeout_s).topics[topic].partitions
        # From the oldest offset retention kept to the end.
        marks = {p: _watermarks(consumer, TopicPartition(topic, p), deadline) for p in partitions}
        ends = {p: high for p, (_, high) in marks.items()}
        consumer.assign([TopicPartition(topic, p, low) for p, (low, _) in marks.items()])
        found: list[Any] = []
        read = {p: low for p, (low, _) in marks.items()}
        while any(read[p] < ends[p] for p in partitions):
            if time.monotonic() > deadline:
                raise TimeoutError(f"topic {topic}: read to offsets {read} of {ends}")
            message = consumer.poll(1.0)
            if message is None:
                continue
            if message.error() is not None:
                raise KafkaException(message.error())
            found.append(message)
            read[message.partition()] = (message.offset() or 0) + 1
        return found
    finally:
        consumer.close()


def _watermarks(consumer: Any, partition: Any, deadline: float) -> tuple[int, int]:
    """(low, high) offsets of ``partition``. A client that has just started may not know the
    partition yet (``_UNKNOWN_PARTITION``, seen on a loaded machine): asked again until
    ``deadline``."""
    from confluent_kafka import KafkaError, KafkaException

    while True:
        try:
            low, high = consumer.get_watermark_offsets(
                partition, timeout=max(1.0, deadline - time.monotonic())
            )
            return int(low), int(high)
        except KafkaException as exc:
            unknown = exc.args[0].code() == KafkaError._UNKNOWN_PARTITION
            if not unknown or time.monotonic() > deadline:
                raise
            time.sleep(0.5)
