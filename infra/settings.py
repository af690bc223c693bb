"""Settings of the local stack and of the Spark session, read from the environment at the edges."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, TypeVar

from pydantic import Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from infra.errors import ConfigError


def default_cache_dir() -> Path:
    """User-level cache for jars and Ivy metadata, shared by every clone of the project."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "iotfraud"


class CommonSettings(BaseSettings):
    """Settings every component shares, under the ecosystem's own variable names."""

    model_config = SettingsConfigDict(extra="ignore", populate_by_name=True)

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
        default=0, ge=0, description="spark.sql.shuffle.partitions; 0 sizes it to the cores"
    )
    driver_memory: str = Field(default="2g", description="spark.driver.memory (local mode)")
    resolve_jars: bool = Field(
        default=True,
        description="Resolve the Kafka and Delta jars; false when spark-submit provides them",
    )
    state_store: str = Field(
        default="default", description="Streaming state store: default or rocksdb"
    )
    ui_enabled: bool = Field(default=False, description="Start the Spark web UI")

    @field_validator("state_store")
    @classmethod
    def _known_store(cls, value: str) -> str:
        if value not in ("default", "rocksdb"):
            raise ValueError(f"state_store must be 'default' or 'rocksdb', got {value!r}")
        return value


S = TypeVar("S", bound=BaseSettings)


def load_settings(cls: type[S], **overrides: Any) -> S:
    """Build a settings object; a bad value raises ConfigError naming the variable to fix."""
    try:
        return cls(**overrides)
    except ValidationError as exc:
        prefix = str(cls.model_config.get("env_prefix", ""))
        problems = []
        for error in exc.errors():
            if not error["loc"]:  # a check across several settings
                problems.append(f"  {error['msg']}")
                continue
            name = str(error["loc"][0])
            field = cls.model_fields.get(name)
            alias = field.validation_alias if field is not None else None
            variable = alias if isinstance(alias, str) else f"{prefix}{name}".upper()
            problems.append(f"  {variable}: {error['msg']} (got {error.get('input')!r})")
        raise ConfigError(
            f"Invalid configuration in {cls.__name__}:\n" + "\n".join(problems)
        ) from None
