"""The local broker secured with SASL_SSL (SCRAM over TLS), as a user runs it.

One secured stack for the module (``iotfraud stack up`` with ``IOT_STACK_KAFKA_SECURITY=sasl_ssl``);
the simulator and Spark's Kafka source log in with credentials from a secret file; clients without
them, or with a wrong password, are refused; the password never shows in any output or file.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import NewTopic

from infra.errors import ConfigError, KafkaAccessError
from infra.kafka_client import connect
from infra.ports import free_port
from infra.settings import load_settings
from pipeline.settings import PipelineSettings
from pipeline.sources import kafka_connection_options

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.integration

USER = "iot-it"
# Quote and backslash: the Java client's JAAS line must escape them.
PASSWORD = f'it-{secrets.token_urlsafe(12)}"\\x'
EVENTS = 3000


@dataclass(frozen=True)
class SecuredStack:
    state_dir: Path
    plain: str
    secure: str
    ca: Path
    password_file: Path
    outputs: list[str]

    def client_env(self, **extra: str) -> dict[str, str]:
        """What a simulator or pipeline user exports to reach the secured listener."""
        return {
            "KAFKA_BOOTSTRAP_SERVERS": self.secure,
            "IOT_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
            "IOT_KAFKA_SASL_USERNAME": USER,
            "IOT_KAFKA_SASL_PASSWORD_FILE": str(self.password_file),
            "IOT_KAFKA_SSL_CA_LOCATION": str(self.ca),
            **extra,
        }

    def librdkafka(self, **extra: Any) -> dict[str, Any]:
        return {
            "bootstrap.servers": self.secure,
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.username": USER,
            "sasl.password": PASSWORD,
            "ssl.ca.location": str(self.ca),
            **extra,
        }


def iotfraud(
    args: list[str], env: dict[str, str], timeout: float = 180
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "iotfraud", *args],
        check=False, env={**os.environ, **env}, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredStack]:
    root = tmp_path_factory.mktemp("secured")
    password_file = root / "kafka-password"
    password_file.write_text(PASSWORD + "\n")
    password_file.chmod(0o600)
    plain, controller, secure = free_port(), free_port(), free_port()
    env = {
        "IOT_STACK_STATE_DIR": str(root / "state"),
        "IOT_STACK_KAFKA_PORT": str(plain),
        "IOT_STACK_KAFKA_CONTROLLER_PORT": str(controller),
        "IOT_STACK_KAFKA_SECURE_PORT": str(secure),
        "IOT_STACK_KAFKA_SECURITY": "sasl_ssl",
        "IOT_KAFKA_SASL_USERNAME": USER,
        "IOT_KAFKA_SASL_PASSWORD_FILE": str(password_file),
        "IOT_LAKE_ROOT": str(root / "lake"),
    }
    up = iotfraud(["stack", "-v", "up"], env)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        assert f"[ok  ] kafka sasl_ssl 127.0.0.1:{secure}" in up.stdout
        yield SecuredStack(
            state_dir=root / "state",
            plain=f"127.0.0.1:{plain}",
            secure=f"127.0.0.1:{secure}",
            ca=root / "state" / "kafka" / "tls" / "ca.pem",
            password_file=password_file,
            outputs=[up.stdout, up.stderr],
        )
    finally:
        down = iotfraud(["stack", "down"], env)
        assert down.returncode == 0 and "broker stopped" in down.stdout


@pytest.fixture(scope="module")
def delivered(secured: SecuredStack) -> str:
    """A topic the simulator filled with ``EVENTS`` events over SASL_SSL (it creates the topic)."""
    topic = f"secure.{uuid.uuid4().hex[:8]}"
    env = secured.client_env(
        IOT_TOPIC=topic,
        IOT_FIRMWARE_TOPIC=f"{topic}.firmware",
        IOT_LAKE_ROOT=str(secured.state_dir / "lake"),
        IOT_SIM_PROGRESS_INTERVAL_S="0.1",
    )
    run = subprocess.run(
        [sys.executable, "-m", "simulator", "-v", "simulate", "--devices", "200",
         "--count", str(EVENTS), "--accelerate", "0", "--start-time", "2026-01-05T08:00:00Z"],
        check=False, env={**os.environ, **env}, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    secured.outputs.extend([run.stdout, run.stderr])
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"delivered {EVENTS:,} | failures 0" in run.stdout
    assert f"(SASL_SSL as {USER})" in run.stderr  # the verbose log did run
    return topic


def test_authenticated_simulator_delivers_every_event(
    secured: SecuredStack, delivered: str
) -> None:
    consumer = Consumer(
        secured.librdkafka(**{"group.id": f"it-{uuid.uuid4().hex[:6]}",
                              "auto.offset.reset": "earliest", "enable.auto.commit": False})
    )  # fmt: skip
    consumer.subscribe([delivered])
    seen = 0
    deadline = time.monotonic() + 60
    try:
        while seen < EVENTS and time.monotonic() < deadline:
            for msg in consumer.consume(num_messages=1000, timeout=0.5):
                assert msg.error() is None, msg.error()
                seen += 1
    finally:
        consumer.close()
    assert seen == EVENTS


def test_clients_without_credentials_are_refused(secured: SecuredStack) -> None:
    admin, _ = connect(secured.librdkafka())
    topic = f"secure.refused.{uuid.uuid4().hex[:8]}"
    admin.create_topics([NewTopic(topic, num_partitions=1)])[topic].result(timeout=30)
    anonymous = {
        "plaintext": {"bootstrap.servers": secured.secure},
        "tls without login": {
            "bootstrap.servers": secured.secure,
            "security.protocol": "SSL",
            "ssl.ca.location": str(secured.ca),
        },
    }
    for what, conf in anonymous.items():
        started = time.monotonic()
        with pytest.raises(ConfigError, match="did not answer within 5s"):
            connect({**conf, "log_level": 0}, timeout_s=5)
        assert time.monotonic() - started < 15, what
        producer = Producer({**conf, "log_level": 0, "message.timeout.ms": 4000})
        producer.produce(topic, b"sneaked in")
        assert producer.flush(10) == 0  # the message failed, it is not still queued
    consumer = Consumer(secured.librdkafka(**{"group.id": "it-check"}))
    try:
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=30)
    finally:
        consumer.close()
    assert (low, high) == (0, 0), "an unauthenticated message reached the topic"


def test_wrong_password_fails_fast_with_the_reason(secured: SecuredStack) -> None:
    wrong = f"wrong-{secrets.token_hex(6)}"
    started = time.monotonic()
    with pytest.raises(KafkaAccessError, match="Authentication failed") as refused:
        connect(secured.librdkafka(**{"sasl.password": wrong}), timeout_s=60)
    assert time.monotonic() - started < 15
    assert wrong not in str(refused.value)

    wrong_file = secured.password_file.with_name("wrong-password")
    wrong_file.write_text(wrong)
    env = secured.client_env(IOT_KAFKA_SASL_PASSWORD_FILE=str(wrong_file), IOT_TOPIC="secure.x")
    run = subprocess.run(
        [sys.executable, "-m", "simulator", "simulate", "--count", "10", "--no-progress"],
        check=False, env={**os.environ, **env}, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 2, run.stdout + run.stderr
    assert "refused the connection" in run.stderr and "Authentication failed" in run.stderr
    assert wrong not in run.stdout + run.stderr


def test_secured_stack_without_credentials_stops_at_start(tmp_path: Path) -> None:
    env = {
        "IOT_STACK_STATE_DIR": str(tmp_path),
        "IOT_STACK_KAFKA_SECURITY": "sasl_ssl",
        "IOT_KAFKA_SASL_USERNAME": "",
        "IOT_KAFKA_SASL_PASSWORD_FILE": "",
    }
    result = iotfraud(["stack", "up"], env, timeout=60)
    assert result.returncode == 2
    assert "IOT_KAFKA_SASL_USERNAME" in result.stderr
    assert "IOT_KAFKA_SASL_PASSWORD_FILE" in result.stderr
    assert not (tmp_path / "kafka").exists()


def test_spark_kafka_source_reads_over_sasl_ssl(
    spark: SparkSession,
    secured: SecuredStack,
    delivered: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pyspark.sql import functions as F

    for name, value in secured.client_env(IOT_TOPIC=delivered).items():
        monkeypatch.setenv(name, value)
    settings = load_settings(PipelineSettings)
    assert PASSWORD not in repr(settings)
    frame = (
        spark.read.format("kafka")
        .options(**kafka_connection_options(settings))
        .option("subscribe", settings.topic)
        .option("startingOffsets", "earliest")
        .option("endingOffsets", "latest")
        .load()
    )
    counts = frame.agg(
        F.count("*").alias("rows"),
        F.countDistinct(F.col("key").cast("string")).alias("devices"),
    ).first()
    assert counts is not None and counts["rows"] == EVENTS and counts["devices"] > 100
    plan = frame._jdf.queryExecution().toString()
    assert PASSWORD not in plan

    wrong_file = secured.password_file.with_name("wrong-spark-password")
    wrong_file.write_text("not-the-password")
    monkeypatch.setenv("IOT_KAFKA_SASL_PASSWORD_FILE", str(wrong_file))
    wrong = kafka_connection_options(load_settings(PipelineSettings))
    with pytest.raises(Exception, match="Authentication failed") as refused:
        spark.read.format("kafka").options(**wrong).option("subscribe", delivered).load().count()
    assert "not-the-password" not in str(refused.value)


def test_password_is_in_no_output_and_no_file(secured: SecuredStack, delivered: str) -> None:
    assert delivered
    for text in secured.outputs:
        assert PASSWORD not in text
    for path in (secured.state_dir / "kafka").rglob("*"):
        if path.is_file():
            assert PASSWORD.encode() not in path.read_bytes(), path
    keystore_password = (secured.state_dir / "kafka" / "tls" / "keystore.password").read_text()
    assert keystore_password not in (secured.state_dir / "kafka" / "broker.log").read_text()


def machine_address() -> str:
    """This machine's address on its network (the one its default route leaves from)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(("10.255.255.255", 1))  # UDP: nothing is sent
        address = str(probe.getsockname()[0])
    assert not address.startswith("127."), "the test needs a non-loopback IPv4 address"
    return address


def test_with_sasl_on_no_plaintext_listener_answers_beyond_loopback(tmp_path: Path) -> None:
    address = machine_address()
    password_file = tmp_path / "kafka-password"
    password_file.write_text(PASSWORD)
    plain, secure = free_port(), free_port()
    env = {
        "IOT_STACK_STATE_DIR": str(tmp_path / "state"),
        "IOT_STACK_KAFKA_HOST": address,
        "IOT_STACK_KAFKA_PORT": str(plain),
        "IOT_STACK_KAFKA_CONTROLLER_PORT": str(free_port()),
        "IOT_STACK_KAFKA_SECURE_PORT": str(secure),
        "IOT_STACK_KAFKA_SECURITY": "sasl_ssl",
        "IOT_KAFKA_SASL_USERNAME": USER,
        "IOT_KAFKA_SASL_PASSWORD_FILE": str(password_file),
        "IOT_LAKE_ROOT": str(tmp_path / "lake"),
    }
    up = iotfraud(["stack", "up"], env)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        # With credentials, on the address: served.
        connect({"bootstrap.servers": f"{address}:{secure}", "security.protocol": "SASL_SSL",
                 "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": USER,
                 "sasl.password": PASSWORD,
                 "ssl.ca.location": str(tmp_path / "state" / "kafka" / "tls" / "ca.pem")},
                timeout_s=30)  # fmt: skip
        # Without, on the address: nothing listens, for the broker or for its controller.
        config = (tmp_path / "state" / "kafka" / "server.properties").read_text()
        controller = int(env["IOT_STACK_KAFKA_CONTROLLER_PORT"])
        for port in (plain, controller):
            with socket.socket() as sock:
                sock.settimeout(5)
                assert sock.connect_ex((address, port)) != 0, f"{address}:{port} accepts\n{config}"
        # The local tools keep their plaintext listener on loopback.
        connect({"bootstrap.servers": f"127.0.0.1:{plain}"}, timeout_s=30)
    finally:
        down = iotfraud(["stack", "down"], env)
        assert down.returncode == 0 and "broker stopped" in down.stdout


def test_the_live_pipeline_runs_over_sasl_ssl(secured: SecuredStack, tmp_path: Path) -> None:
    from confluent_kafka.admin import AdminClient

    from tests.pipeline_helpers import device_series, encoded, write_registry

    topic = f"secure.live.{uuid.uuid4().hex[:8]}"
    admin = AdminClient(secured.librdkafka())  # held until the topics exist
    futures = admin.create_topics(
        [NewTopic(topic, num_partitions=2), NewTopic(f"{topic}.firmware", num_partitions=1)]
    )
    for future in futures.values():
        future.result(timeout=30)
    lake = tmp_path / "lake"
    write_registry(str(lake), ["dev-1"])
    start = datetime.now(timezone.utc) - timedelta(minutes=20)
    messages = encoded(device_series("dev-1", start, 20) + device_series("dev-9", start, 5))
    producer = Producer(secured.librdkafka())
    for key, value in messages:
        producer.produce(topic, key=key, value=value)
    assert producer.flush(30) == 0

    env = secured.client_env(
        IOT_TOPIC=topic, IOT_FIRMWARE_TOPIC=f"{topic}.firmware", IOT_LAKE_ROOT=str(lake),
        IOT_PIPELINE_CHECKPOINT_ROOT=str(tmp_path / "checkpoints"),
        MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path / 'none.db'}", IOT_SPARK_DRIVER_MEMORY="1g",
        IOT_SPARK_MASTER="local[2]", IOT_SPARK_SHUFFLE_PARTITIONS="2",
    )  # fmt: skip
    log = tmp_path / "pipeline.log"
    with log.open("wb") as out:
        pipeline = subprocess.Popen([sys.executable, "-m", "iotfraud", "pipeline", "run"],
                                    env={**os.environ, **env}, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 240
        while not {("rogue_device", "dev-9")} <= alerts(lake):
            assert pipeline.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "no alert over SASL_SSL\n" + log.read_text()[-3000:]
            time.sleep(2)
        pipeline.send_signal(signal.SIGTERM)
        assert pipeline.wait(120) == 0, log.read_text()[-3000:]
    finally:
        if pipeline.poll() is None:
            os.killpg(pipeline.pid, signal.SIGKILL)
    assert rows(lake, "telemetry") == len(messages)
    assert PASSWORD not in log.read_text()


def rows(lake: Path, table: str) -> int:
    from deltalake import DeltaTable

    return int(DeltaTable(str(lake / table)).to_pyarrow_table(columns=[]).num_rows)


def alerts(lake: Path) -> set[tuple[str, str]]:
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        table = DeltaTable(str(lake / "alerts")).to_pyarrow_table(
            columns=["alert_type", "device_id"]
        )
    except TableNotFoundError:
        return set()
    return {(r["alert_type"], r["device_id"]) for r in table.to_pylist()}
