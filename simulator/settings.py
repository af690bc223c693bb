"""Simulator settings (prefix ``IOT_SIM_``), built at the edges (CLI, benchmark) and passed down.

Lists accept a comma-separated string (``IOT_SIM_SCENARIOS=tampering,flood``) or JSON; dicts are
JSON (``IOT_SIM_KAFKA_OPTIONS='{"security.protocol": "SASL_SSL"}'``).
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Annotated, Any

from pydantic import Field, field_validator, model_validator
from pydantic_settings import NoDecode, SettingsConfigDict

from infra import contract as c
from infra.settings import CommonSettings

# Substrings of librdkafka keys whose values are secrets and must never reach a log line.
_SECRET_MARKERS = ("password", "secret", "jaas", "token", "key.pem", "private")
MALFORMED_REASONS = (
    c.REASON_INVALID_JSON, c.REASON_MISSING_FIELD, c.REASON_WRONG_TYPE, c.REASON_BAD_TIMESTAMP,
    c.REASON_OUT_OF_RANGE, c.REASON_OVERSIZE, c.REASON_INVALID_UTF8, c.REASON_KEY_MISMATCH,
)  # fmt: skip


def _split(value: Any) -> Any:
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            return json.loads(text)
        return [part.strip() for part in text.split(",") if part.strip()]
    return value


def redact(options: dict[str, str]) -> dict[str, str]:
    """Kafka options safe to log: values of credential keys replaced by ``***``."""
    return {
        key: "***" if any(marker in key.lower() for marker in _SECRET_MARKERS) else value
        for key, value in options.items()
    }


class SimulatorSettings(CommonSettings):
    """Fleet size, clock, scenarios and Kafka producer options of the simulator."""

    model_config = SettingsConfigDict(env_prefix="IOT_SIM_", extra="ignore", populate_by_name=True)

    devices: int = Field(
        default=1000, ge=1, le=1_000_000, description="Number of devices in the registry"
    )
    seed: int = Field(default=42, description="Seed of the registry and of the telemetry")
    rate: float = Field(
        default=0.0,
        ge=0,
        description="Target events/s sent (token bucket); 0 lets the clock (accelerate) set it",
    )
    accelerate: float = Field(
        default=1.0,
        ge=0,
        description="Simulated seconds per wall second (1 = real time, 3600 = an hour a second, "
        "0 = as fast as possible); ignored when rate is set",
    )
    duration: float = Field(
        default=0.0, ge=0, description="Stop after this many wall seconds; 0 = no limit"
    )
    count: int = Field(default=0, ge=0, description="Stop after this many messages; 0 = no limit")
    start_time: datetime | None = Field(
        default=None,
        description="Simulated clock start (ISO-8601, UTC if no offset); empty = now, or so that "
        "an accelerated run with a known duration or count reaches the wall clock as it ends",
    )
    partitions: int = Field(
        default=6, ge=1, description="Partitions of the topic when the simulator creates it"
    )
    replication_factor: int = Field(
        default=1, ge=1, description="Replication factor of the topic when the simulator creates it"
    )
    interval_min_s: float = Field(
        default=10.0, gt=0, description="Shortest steady reporting interval of a device (s)"
    )
    interval_max_s: float = Field(
        default=30.0, gt=0, description="Longest steady reporting interval of a device (s)"
    )
    scenarios: Annotated[list[str], NoDecode] = Field(
        default_factory=lambda: list(c.SCENARIOS),
        description="Scenarios switched on (comma-separated); empty = clean telemetry only",
    )
    scenario_rate: float = Field(
        default=6.0,
        ge=0,
        description="Injections of each scenario per simulated hour (per 1,000 devices)",
    )
    scenario_rates: dict[str, float] = Field(
        default_factory=dict,
        description='Per-scenario injections per simulated hour, JSON, e.g. {"flood": 20}',
    )
    scenario_min_s: float = Field(
        default=720.0, gt=0, description="Shortest scenario window (simulated seconds)"
    )
    scenario_max_s: float = Field(
        default=1200.0, gt=0, description="Longest scenario window (simulated seconds)"
    )
    scenario_warmup_s: float = Field(
        default=0.0,
        ge=0,
        description="No scenario that changes or withholds a device's readings (tampering, "
        "spike, dip, stuck_sensor, drift, silence, store_and_forward) starts in a run's first N "
        "simulated seconds: the pipeline learns each device's own normal and reporting interval "
        "first",
    )
    silence_min_s: float = Field(
        default=300.0, gt=0, description="Shortest silence of a device (simulated seconds)"
    )
    silence_max_s: float = Field(
        default=3600.0,
        gt=0,
        description="Longest silence of a device (simulated seconds); the span is drawn "
        "log-uniformly between silence_min_s and this",
    )
    silence_resume_probability: float = Field(
        default=0.75,
        ge=0,
        le=1,
        description="Probability that a silent device reports again after its silence; one that "
        "does not stays silent to the run's end",
    )
    quiet_tail_s: float = Field(
        default=0.0,
        ge=0,
        description="No scenario starts in a bounded run's last N simulated seconds, so the "
        "pipeline's windows over every injection close before the run ends",
    )
    malformed_reasons: Annotated[list[str], NoDecode] = Field(
        default_factory=lambda: list(MALFORMED_REASONS),
        description="Kinds of malformed message (quarantine reason codes) the malformed scenario "
        "sends; drop key_mismatch and invalid_utf8 for JSON-lines files",
    )
    batch_events: int = Field(
        default=20_000, ge=100, description="Events generated per vectorised batch"
    )
    run_id: str = Field(default="", description="Run id written to ground_truth; empty = random")
    write_ground_truth: bool = Field(
        default=True, description="Append injected scenarios to the ground_truth Delta table"
    )
    kafka_options: dict[str, str] = Field(
        default_factory=dict,
        repr=False,
        description='librdkafka producer options as JSON, e.g. {"security.protocol": "SASL_SSL", '
        '"sasl.mechanism": "PLAIN"}; they win over IOT_KAFKA_*; secrets are never logged',
    )
    progress_interval_s: float = Field(
        default=1.0, gt=0, description="Seconds between progress lines on stderr"
    )

    @field_validator("scenarios", "malformed_reasons", mode="before")
    @classmethod
    def _comma_list(cls, value: Any) -> Any:
        return _split(value)

    @field_validator("scenarios")
    @classmethod
    def _known_scenarios(cls, value: list[str]) -> list[str]:
        unknown = sorted(set(value) - set(c.SCENARIOS))
        if unknown:
            raise ValueError(f"unknown scenarios {unknown}; known: {', '.join(c.SCENARIOS)}")
        return value

    @field_validator("scenario_rates")
    @classmethod
    def _known_rates(cls, value: dict[str, float]) -> dict[str, float]:
        unknown = sorted(set(value) - set(c.SCENARIOS))
        if unknown:
            raise ValueError(f"unknown scenarios {unknown}; known: {', '.join(c.SCENARIOS)}")
        if any(rate < 0 for rate in value.values()):
            raise ValueError("scenario rates must be >= 0")
        return value

    @field_validator("malformed_reasons")
    @classmethod
    def _known_reasons(cls, value: list[str]) -> list[str]:
        unknown = sorted(set(value) - set(MALFORMED_REASONS))
        if unknown:
            raise ValueError(f"unknown reasons {unknown}; known: {', '.join(MALFORMED_REASONS)}")
        return value

    @field_validator("start_time")
    @classmethod
    def _utc(cls, value: datetime | None) -> datetime | None:
        if value is not None and value.tzinfo is None:
            return value.replace(tzinfo=timezone.utc)
        return value

    @model_validator(mode="after")
    def _ordered_bounds(self) -> SimulatorSettings:
        if self.interval_min_s > self.interval_max_s:
            raise ValueError("interval_min_s must be <= interval_max_s")
        if self.scenario_min_s > self.scenario_max_s:
            raise ValueError("scenario_min_s must be <= scenario_max_s")
        if self.silence_min_s > self.silence_max_s:
            raise ValueError("silence_min_s must be <= silence_max_s")
        return self

    def rate_of(self, scenario: str) -> float:
        """Injections per simulated hour of ``scenario`` (0 when switched off)."""
        if scenario not in self.scenarios:
            return 0.0
        return self.scenario_rates.get(scenario, self.scenario_rate)
