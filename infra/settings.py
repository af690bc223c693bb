"""Settings of the local stack and of the Spark session, read from the environment at the edges."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, SettingsConfigDict, SettingsError

from infra.errors import ConfigError


def default_cache_dir() -> Path:
    """User-level cache for jars and Ivy metadata, shared by every clone of the project."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "iotfraud"


class CommonSettings(BaseSettings):
    """Settings every component shares, under the ecosystem's own variable names."""

    # Inputs can hold passwords: a validation error must not echo them.
    model_config = SettingsConfigDict(
        extra="ignore", populate_by_name=True, hide_input_in_errors=True
    )

    lake_root: str = Field(
        default=".iotfraud/lake",
        validation_alias="IOT_LAKE_ROOT",
        description="Root of the Delta tables: a folder, s3a://..., abfss://...",
    )
    bootstrap_servers: str = Field(
        default="127.0.0.1:9092",
        validation_alias="KAFKA_BOOTSTRAP_SERVERS",
        description="Kafka bootstrap servers",
    )
    topic: str = Field(
        default="iot.telemetry", validation_alias="IOT_TOPIC", description="Telemetry topic"
    )
    firmware_topic: str = Field(
        default="iot.firmware_updates",
        validation_alias="IOT_FIRMWARE_TOPIC",
        description="Topic of authorized firmware updates; empty switches the pipeline's "
        "firmware tamper check off",
    )
    mlflow_tracking_uri: str = Field(
        default="",
        validation_alias="MLFLOW_TRACKING_URI",
        description="MLflow tracking and registry URI; empty means the local SQLite store",
    )
    kafka_security_protocol: Literal["PLAINTEXT", "SASL_SSL"] = Field(
        default="PLAINTEXT",
        validation_alias="IOT_KAFKA_SECURITY_PROTOCOL",
        description="PLAINTEXT, or SASL_SSL: log in with the IOT_KAFKA_SASL_* user over TLS "
        "(simulator and pipeline)",
    )
    kafka_sasl_mechanism: Literal["SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN"] = Field(
        default="SCRAM-SHA-512",
        validation_alias="IOT_KAFKA_SASL_MECHANISM",
        description="SASL mechanism with SASL_SSL: SCRAM-SHA-512, SCRAM-SHA-256 or PLAIN",
    )
    kafka_sasl_username: str = Field(
        default="",
        validation_alias="IOT_KAFKA_SASL_USERNAME",
        description="SASL user; the local broker creates it when IOT_STACK_KAFKA_SECURITY=sasl_ssl",
    )
    kafka_sasl_password: SecretStr | None = Field(
        default=None,
        validation_alias="IOT_KAFKA_SASL_PASSWORD",
        description="SASL password (never logged); prefer IOT_KAFKA_SASL_PASSWORD_FILE",
    )
    kafka_sasl_password_file: Path | None = Field(
        default=None,
        validation_alias="IOT_KAFKA_SASL_PASSWORD_FILE",
        description="File holding the SASL password (a mounted secret), read at start",
    )
    model_signing_key: SecretStr | None = Field(
        default=None,
        validation_alias="IOT_MODEL_SIGNING_KEY",
        description="Key that signs registered models (iotfraud train) and that the pipeline "
        "checks before loading one; empty = a plain SHA-256 digest (README: Model trust); "
        "prefer IOT_MODEL_SIGNING_KEY_FILE",
    )
    model_signing_key_file: Path | None = Field(
        default=None,
        validation_alias="IOT_MODEL_SIGNING_KEY_FILE",
        description="File holding the model signing key (a mounted secret), read at start",
    )
    kafka_ssl_ca_location: str = Field(
        default="",
        validation_alias="IOT_KAFKA_SSL_CA_LOCATION",
        description="PEM file of the CA that signed the broker certificate; empty = the system's "
        "trusted CAs (the local broker's is <state dir>/kafka/tls/ca.pem)",
    )

    @field_validator("kafka_security_protocol", "kafka_sasl_mechanism", mode="before")
    @classmethod
    def _upper(cls, value: Any) -> Any:
        return value.strip().upper() if isinstance(value, str) else value

    @field_validator(
        "kafka_sasl_password", "kafka_sasl_password_file", "model_signing_key",
        "model_signing_key_file", mode="before",
    )  # fmt: skip
    @classmethod
    def _empty_is_unset(cls, value: Any) -> Any:
        return None if value == "" else value

    @model_validator(mode="after")
    def _credentials(self) -> CommonSettings:
        self.kafka_sasl_password = secret_or_file(
            self.kafka_sasl_password, self.kafka_sasl_password_file, "IOT_KAFKA_SASL_PASSWORD"
        )
        self.model_signing_key = secret_or_file(
            self.model_signing_key, self.model_signing_key_file, "IOT_MODEL_SIGNING_KEY"
        )
        if self.kafka_security_protocol == "SASL_SSL" and not (
            self.kafka_sasl_username and self.kafka_sasl_password
        ):
            raise ValueError(
                "IOT_KAFKA_SECURITY_PROTOCOL=SASL_SSL needs IOT_KAFKA_SASL_USERNAME and "
                "IOT_KAFKA_SASL_PASSWORD_FILE (or IOT_KAFKA_SASL_PASSWORD)"
            )
        return self

    def signing_key(self) -> str | None:
        """The model signing key, or None for plain digests."""
        return self.model_signing_key.get_secret_value() if self.model_signing_key else None


def secret_or_file(secret: SecretStr | None, path: Path | None, variable: str) -> SecretStr | None:
    """The secret given in ``variable`` or read from the file in ``{variable}_FILE``; both set
    is an error (ValueError naming them)."""
    if path is None:
        return secret
    if secret:
        raise ValueError(f"set {variable} or {variable}_FILE, not both")
    return SecretStr(read_secret_file(path, f"{variable}_FILE"))


def read_secret_file(path: Path, variable: str) -> str:
    """The secret in ``path`` without its trailing newline (files written by ``echo`` have one).

    Raises:
        ValueError: the file cannot be read or is empty; the message names ``variable``.
    """
    try:
        secret = path.read_text().rstrip("\r\n")
    except OSError as exc:
        raise ValueError(f"{variable}: cannot read {path}: {exc.strerror}") from None
    if not secret:
        raise ValueError(f"{variable}: {path} is empty")
    return secret


class StackSettings(BaseSettings):
    """Where the local stack keeps its state and which ports it uses (prefix ``IOT_STACK_``)."""

    model_config = SettingsConfigDict(env_prefix="IOT_STACK_", extra="ignore")

    state_dir: Path = Field(
        default=Path(".iotfraud"),
        description="Project-local folder: broker data, logs, pids, lake, MLflow store",
    )
    cache_dir: Path = Field(
        default_factory=default_cache_dir, description="Folder for resolved jars (reused offline)"
    )
    kafka_host: str = Field(default="127.0.0.1", description="Address the local broker listens on")
    kafka_port: int = Field(default=9092, ge=1, le=65535, description="Local broker client port")
    kafka_controller_port: int = Field(
        default=9093, ge=1, le=65535, description="Local broker KRaft controller port"
    )
    kafka_heap: str = Field(default="512m", description="Java heap of the local broker")
    kafka_security: Literal["none", "sasl_ssl"] = Field(
        default="none",
        description="sasl_ssl adds a SASL_SSL listener (SCRAM, TLS with a generated CA) for the "
        "user IOT_KAFKA_SASL_USERNAME; the plaintext listener stays for local tools",
    )
    kafka_secure_port: int = Field(
        default=9094, ge=1, le=65535, description="Local broker SASL_SSL port (kafka_security)"
    )
    start_timeout_s: float = Field(
        default=60.0, gt=0, description="How long to wait for the broker"
    )

    @field_validator("kafka_heap")
    @classmethod
    def _heap_is_java_size(cls, value: str) -> str:
        if not value[:-1].isdigit() or value[-1].lower() not in "kmg":
            raise ValueError(f"kafka_heap must look like 512m or 1g, got {value!r}")
        return value


class SparkSettings(BaseSettings):
    """How the one SparkSession is built (prefix ``IOT_SPARK_``)."""

    model_config = SettingsConfigDict(env_prefix="IOT_SPARK_", extra="ignore")

    master: str = Field(default="local[*]", description="Spark master URL")
    shuffle_partitions: int = Field(
        default=0, ge=0, description="spark.sql.shuffle.partitions; 0: half the cores, at least 1"
    )
    driver_memory: str = Field(default="2g", description="spark.driver.memory (local mode)")
    resolve_jars: bool = Field(
        default=True,
        description="Resolve the Kafka and Delta jars; false when spark-submit provides them",
    )
    state_store: str = Field(
        default="default", description="Streaming state store: default or rocksdb"
    )
    rocksdb_count_rows: bool = Field(
        default=False,
        description="Count the rows RocksDB state holds (pipeline_metrics.state_rows, the "
        "dashboard's chart): a second read of every key a batch writes or removes",
    )
    ui_enabled: bool = Field(default=False, description="Start the Spark web UI")

    @field_validator("state_store")
    @classmethod
    def _known_store(cls, value: str) -> str:
        if value not in ("default", "rocksdb"):
            raise ValueError(f"state_store must be 'default' or 'rocksdb', got {value!r}")
        return value


S = TypeVar("S", bound=BaseSettings)

# Settings whose values may carry credentials (client option maps included): never echoed.
_SECRET_FIELD_MARKERS = ("password", "secret", "token", "options", "url")


def _may_hold_secrets(name: str) -> bool:
    return any(marker in name.lower() for marker in _SECRET_FIELD_MARKERS)


def load_settings(cls: type[S], **overrides: Any) -> S:
    """Build a settings object; a bad value raises ConfigError naming the variable to fix."""
    try:
        return cls(**overrides)
    except SettingsError as exc:
        # A list or map setting whose variable is not valid JSON; the value is not echoed
        # (option maps may hold credentials).
        found = re.search(r'field "(\w+)"', str(exc))
        name = found.group(1) if found else "?"
        raise ConfigError(
            f"Invalid configuration in {cls.__name__}:\n  {variable_name(cls, name)}: "
            f"not valid JSON ({exc.__cause__ or exc}); give a JSON list or object, for "
            """example '["a", "b"]' or '{"key": "value"}'"""
        ) from None
    except ValidationError as exc:
        raise config_error(exc, cls) from None


def config_error(exc: ValidationError, cls: type[BaseSettings] | None = None) -> ConfigError:
    """A ConfigError with one line per problem, each naming the variable to fix (when ``cls``,
    the settings class that failed, is known)."""
    problems = []
    for error in exc.errors():
        if not error["loc"]:  # a check across several settings
            problems.append(f"  {error['msg']}")
            continue
        name = str(error["loc"][0])
        where = variable_name(cls, name) if cls is not None else name
        got = "" if _may_hold_secrets(name) else f" (got {error.get('input')!r})"
        problems.append(f"  {where}: {error['msg']}{got}")
    return ConfigError(f"Invalid configuration in {exc.title}:\n" + "\n".join(problems))


def variable_name(cls: type[BaseSettings], name: str) -> str:
    """The environment variable that sets field ``name`` of ``cls`` (``name`` may be the
    variable already: validation errors name an aliased field by its alias)."""
    field = cls.model_fields.get(name)
    if field is None:
        aliases = {f.validation_alias for f in cls.model_fields.values()}
        if name in aliases:
            return name
    alias = field.validation_alias if field is not None else None
    if isinstance(alias, str):
        return alias
    return f"{cls.model_config.get('env_prefix', '')}{name}".upper()


def default_text(field: FieldInfo) -> str:
    """A field's default as the configuration table and the options' help show it."""
    factory: Any = field.default_factory
    if factory is not None:
        try:
            value = factory()
        except TypeError:  # a factory of the other fields' values
            value = "(computed)"
    else:
        value = field.default
    text = str(value) if value not in ("", None) else "(empty)"
    text = text.replace(str(Path.home()), "~")
    if isinstance(value, dict) and not value:
        text = "{}"
    return text


def read_env_file(path: Path) -> dict[str, str]:
    """The variables a ``.env`` file sets (compose's syntax: ``KEY=value`` lines, comments,
    quotes, ``${OTHER}`` references).

    Raises:
        ConfigError: the file cannot be read.
    """
    from dotenv import dotenv_values

    try:
        values = dotenv_values(path)
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read the settings file {path}: {exc}") from None
    return {name: value for name, value in values.items() if value is not None}
