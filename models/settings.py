"""Training settings (prefix ``IOT_MODEL_``), built at the edges (CLI, tests) and passed down."""

from __future__ import annotations

from datetime import datetime, timezone

from pydantic import Field, field_validator
from pydantic_settings import SettingsConfigDict

from infra.settings import CommonSettings


class ModelSettings(CommonSettings):
    """What history to train on, how the alert threshold is chosen, and where the model goes."""

    model_config = SettingsConfigDict(
        env_prefix="IOT_MODEL_", extra="ignore", populate_by_name=True
    )

    name: str = Field(
        default="iot-fraud", validation_alias="IOT_MODEL_NAME", description="Registered model name"
    )
    experiment: str = Field(default="iot-fraud", description="MLflow experiment of training runs")
    devices: int = Field(default=400, ge=10, description="Fleet size of the simulated history")
    hours: float = Field(default=6.0, gt=0, description="Simulated hours of history to train on")
    seed: int = Field(default=7, description="Seed of the training fleet and telemetry")
    holdout_seed: int = Field(
        default=1007, description="Seed of the held-out fleet that candidates are compared on"
    )
    holdout_hours: float = Field(default=4.0, gt=0, description="Simulated hours held out")
    scenario_rate: float = Field(
        default=60.0,
        gt=0,
        description="Injections of each fraud scenario per simulated hour per 1,000 devices",
    )
    start_time: datetime = Field(
        default=datetime(2026, 1, 5, tzinfo=timezone.utc),
        description="Simulated clock start of the history (fixed, so runs are reproducible)",
    )
    validation_fraction: float = Field(
        default=0.3, gt=0, lt=1, description="Share of training devices kept to pick the threshold"
    )
    max_false_alert_rate: float = Field(
        default=1e-4,
        gt=0,
        lt=1,
        description="False alerts allowed per clean device-window when the threshold is chosen",
    )
    min_overlap_s: float = Field(
        default=300.0,
        ge=0,
        description="Seconds a window must overlap an injection to be a positive training row",
    )
    workdir: str = Field(
        default=".iotfraud/training",
        description="Folder for the simulated history (JSON lines, registry) of training runs",
    )

    @field_validator("start_time")
    @classmethod
    def _utc(cls, value: datetime) -> datetime:
        return value if value.tzinfo else value.replace(tzinfo=timezone.utc)
