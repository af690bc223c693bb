"""Kafka credentials: from the environment or a secret file, into client options, never echoed."""

from __future__ import annotations

from pathlib import Path

import pytest

from infra.errors import ConfigError
from infra.kafka import server_properties
from infra.kafka_client import jaas_config, java_client_options, librdkafka_options
from infra.kafka_tls import TlsFiles, subject_alt_names
from infra.settings import CommonSettings, StackSettings, load_settings
from infra.stack import broker_user, local_broker
from pipeline.settings import PipelineSettings
from pipeline.sources import kafka_connection_options
from simulator.producer import admin_config, producer_config
from simulator.settings import SimulatorSettings

PASSWORD = 'unit-pw"with\\odd chars'


@pytest.fixture
def secured_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """SASL_SSL with the password in a secret file (with the newline ``echo`` leaves)."""
    secret = tmp_path / "kafka-password"
    secret.write_text(PASSWORD + "\n")
    monkeypatch.setenv("IOT_KAFKA_SECURITY_PROTOCOL", "sasl_ssl")
    monkeypatch.setenv("IOT_KAFKA_SASL_USERNAME", "iot-app")
    monkeypatch.setenv("IOT_KAFKA_SASL_PASSWORD_FILE", str(secret))
    monkeypatch.setenv("IOT_KAFKA_SSL_CA_LOCATION", "/etc/iot/ca.pem")
    return secret


@pytest.mark.usefixtures("secured_env")
def test_simulator_gets_librdkafka_login_from_the_secret_file() -> None:
    settings = load_settings(SimulatorSettings)
    expected = {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "iot-app",
        "sasl.password": PASSWORD,
        "ssl.ca.location": "/etc/iot/ca.pem",
    }
    assert librdkafka_options(settings) == expected
    assert expected.items() <= producer_config(settings).items()
    assert expected.items() <= admin_config(settings).items()
    assert PASSWORD not in repr(settings) and PASSWORD not in str(settings)


@pytest.mark.usefixtures("secured_env")
def test_pipeline_gets_java_client_options_and_explicit_options_win(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("IOT_PIPELINE_KAFKA_OPTIONS", '{"kafka.ssl.truststore.location": "/x.pem"}')
    settings = load_settings(PipelineSettings, bootstrap_servers="broker:9094")
    options = kafka_connection_options(settings)
    assert options == {
        "kafka.bootstrap.servers": "broker:9094",
        "kafka.security.protocol": "SASL_SSL",
        "kafka.sasl.mechanism": "SCRAM-SHA-512",
        "kafka.sasl.jaas.config": "org.apache.kafka.common.security.scram.ScramLoginModule "
        'required username="iot-app" password="unit-pw\\"with\\\\odd chars";',
        "kafka.ssl.truststore.type": "PEM",
        "kafka.ssl.truststore.location": "/x.pem",
    }
    assert PASSWORD not in repr(settings) and PASSWORD not in str(settings)


def test_plaintext_adds_no_option() -> None:
    settings = CommonSettings()
    assert librdkafka_options(settings) == {} and java_client_options(settings) == {}
    assert PipelineSettings().kafka_options == {}


def test_plain_mechanism_uses_the_plain_login_module() -> None:
    assert jaas_config("PLAIN", "u", "p") == (
        'org.apache.kafka.common.security.plain.PlainLoginModule required username="u" '
        'password="p";'
    )


def test_sasl_ssl_without_credentials_names_the_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IOT_KAFKA_SECURITY_PROTOCOL", "SASL_SSL")
    monkeypatch.setenv("IOT_KAFKA_SASL_USERNAME", "iot-app")
    with pytest.raises(ConfigError, match="IOT_KAFKA_SASL_PASSWORD_FILE"):
        load_settings(SimulatorSettings)


def test_bad_secret_settings_never_echo_the_secret(
    monkeypatch: pytest.MonkeyPatch, secured_env: Path
) -> None:
    monkeypatch.setenv("IOT_KAFKA_SASL_PASSWORD", PASSWORD)
    with pytest.raises(ConfigError, match="not both") as both:
        load_settings(PipelineSettings)
    assert PASSWORD not in str(both.value)

    monkeypatch.delenv("IOT_KAFKA_SASL_PASSWORD")
    monkeypatch.setenv("IOT_KAFKA_SASL_PASSWORD_FILE", str(secured_env.with_name("missing")))
    with pytest.raises(ConfigError, match="IOT_KAFKA_SASL_PASSWORD_FILE: cannot read"):
        load_settings(SimulatorSettings)

    monkeypatch.setenv("IOT_KAFKA_SASL_PASSWORD_FILE", str(secured_env))
    monkeypatch.setenv("IOT_PIPELINE_KAFKA_OPTIONS", f'{{"sasl.password": "{PASSWORD[:7]}"}}')
    with pytest.raises(ConfigError, match="IOT_PIPELINE_KAFKA_OPTIONS") as unprefixed:
        load_settings(PipelineSettings)
    assert PASSWORD[:7] not in str(unprefixed.value)


def test_secured_stack_without_user_says_what_to_set(tmp_path: Path) -> None:
    stack = StackSettings(state_dir=tmp_path, kafka_security="sasl_ssl")
    with pytest.raises(ConfigError, match=r"IOT_KAFKA_SASL_USERNAME.*IOT_KAFKA_SASL_PASSWORD_FILE"):
        local_broker(stack, CommonSettings())
    plain = CommonSettings(
        kafka_sasl_username="u", kafka_sasl_password="p", kafka_sasl_mechanism="PLAIN"
    )
    with pytest.raises(ConfigError, match="IOT_KAFKA_SASL_MECHANISM"):
        broker_user(plain)
    # Status and stop need no credentials.
    assert local_broker(stack).secure_bootstrap_servers == "127.0.0.1:9094"


@pytest.mark.usefixtures("secured_env")
def test_secured_broker_config_has_the_listener_and_no_login_password(tmp_path: Path) -> None:
    broker = local_broker(StackSettings(state_dir=tmp_path, kafka_security="sasl_ssl"),
                          load_settings(CommonSettings))  # fmt: skip
    assert broker.sasl_user is not None and PASSWORD not in repr(broker)
    tls = TlsFiles(tmp_path / "tls")
    tls.folder.mkdir()
    tls.password_file.write_text("keystore-pw")
    text = server_properties("127.0.0.1", 9092, 9093, tmp_path / "data", secure_port=9094, tls=tls)
    assert (
        "listeners=PLAINTEXT://127.0.0.1:9092,CONTROLLER://127.0.0.1:9093,SASL_SSL://127.0.0.1:9094"
        in text
    )
    assert "listener.name.sasl_ssl.sasl.enabled.mechanisms=SCRAM-SHA-512,SCRAM-SHA-256" in text
    assert PASSWORD not in text


def test_with_sasl_the_plaintext_and_controller_listeners_bind_loopback_only(
    tmp_path: Path,
) -> None:
    tls = TlsFiles(tmp_path / "tls")
    tls.folder.mkdir()
    tls.password_file.write_text("keystore-pw")
    secured = server_properties("192.0.2.7", 9092, 9093, tmp_path, secure_port=9094, tls=tls)
    assert (
        "listeners=PLAINTEXT://127.0.0.1:9092,CONTROLLER://127.0.0.1:9093,SASL_SSL://192.0.2.7:9094"
        in secured
    )
    assert "advertised.listeners=PLAINTEXT://127.0.0.1:9092,SASL_SSL://192.0.2.7:9094" in secured
    assert "controller.quorum.voters=1@127.0.0.1:9093" in secured
    # Without SASL the operator chose a plaintext broker on that address.
    plain = server_properties("192.0.2.7", 9092, 9093, tmp_path)
    assert "listeners=PLAINTEXT://192.0.2.7:9092,CONTROLLER://192.0.2.7:9093\n" in plain


def test_certificate_names_cover_the_listen_host() -> None:
    assert subject_alt_names("127.0.0.1") == "dns:localhost,ip:127.0.0.1"
    assert subject_alt_names("kafka.lan") == "dns:localhost,ip:127.0.0.1,dns:kafka.lan"
    assert subject_alt_names("0.0.0.0") == "dns:localhost,ip:127.0.0.1"
