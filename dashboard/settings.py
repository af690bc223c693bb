"""Dashboard settings (prefix ``IOT_DASH_``), read from the environment at the edges."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator
from pydantic_settings import SettingsConfigDict

from dashboard import auth
from infra.mlflow_store import local_tracking_uri
from infra.settings import CommonSettings, StackSettings

log = logging.getLogger(__name__)

MAP_STYLES = ("carto", "none")


class DashboardSettings(CommonSettings):
    """Where the app listens, how often it refreshes and what it shows."""

    model_config = SettingsConfigDict(env_prefix="IOT_DASH_", extra="ignore", populate_by_name=True)

    port: int = Field(default=8501, ge=1, le=65535, description="Port the Streamlit server uses")
    address: str = Field(default="127.0.0.1", description="Address the Streamlit server binds")
    refresh_seconds: float = Field(
        default=10.0,
        ge=1.0,
        description="How often each page reloads its data (no full rerun); each read of the "
        "lake is shared by all open tabs for this long",
    )
    lookback_hours: float = Field(
        default=24.0, gt=0, description="Default time range of the pages, ending now"
    )
    max_rows: int = Field(default=5000, ge=10, description="Most rows a table shows (newest first)")
    model_name: str = Field(
        default="iot-fraud",
        validation_alias="IOT_MODEL_NAME",
        description="Registered MLflow model whose champion the Model page shows",
    )
    ingest_query: str = Field(
        default="ingest",
        description="Name of the streaming query that reads Kafka (its rate is events/s)",
    )
    map_style: str = Field(
        default="carto",
        description="Map basemap: 'carto' (no API key, needs internet) or 'none' (offline); "
        "the bundled country borders are drawn with either",
    )
    analyst: str = Field(
        default="",
        description="Default analyst name on the feedback form (with sign-in, the signed-in name)",
    )
    auth_file: Path | None = Field(
        default=None,
        description="File of analysts' name:hash lines (iotfraud dashboard hash-password NAME); "
        "set, every page asks for a sign-in first; empty = no sign-in",
    )
    session_idle_minutes: float = Field(
        default=30.0,
        gt=0,
        allow_inf_nan=False,
        description="With sign-in on, minutes without interaction after which an analyst is "
        "signed out",
    )
    sign_in_global_max_failures: int = Field(
        default=auth.GLOBAL_MAX_FAILURES,
        description="With sign-in on, failed sign-ins from all clients within "
        f"{auth.WINDOW_S / 60:g} minutes after which every sign-in is refused until the window "
        f"passes (above {auth.CLIENT_MAX_FAILURES}, what one client may fail)",
    )
    state_dir: Path = Field(
        default_factory=lambda: StackSettings().state_dir,
        validation_alias="IOT_STACK_STATE_DIR",
        description="Local stack state folder, home of the default MLflow SQLite store",
    )

    @field_validator("map_style")
    @classmethod
    def _known_style(cls, value: str) -> str:
        if value not in MAP_STYLES:
            raise ValueError(f"map_style must be one of {', '.join(MAP_STYLES)}, got {value!r}")
        return value

    @field_validator("auth_file", mode="before")
    @classmethod
    def _empty_is_off(cls, value: Any) -> Any:
        return None if value == "" else value

    @field_validator("auth_file")
    @classmethod
    def _valid_user_file(cls, value: Path | None) -> Path | None:
        # Read now, so that a missing or malformed file stops the dashboard at start.
        if value is not None:
            auth.read_users(value)
        return value

    @field_validator("sign_in_global_max_failures")
    @classmethod
    def _above_one_client(cls, value: int) -> int:
        if value <= auth.CLIENT_MAX_FAILURES:
            raise ValueError(
                f"must be more than {auth.CLIENT_MAX_FAILURES} (the failed sign-ins one client "
                "may make), so that one client cannot lock everyone out"
            )
        return value

    def tracking_uri(self) -> str:
        """The MLflow URI to read the registry from: the configured one or the local store."""
        return self.mlflow_tracking_uri or local_tracking_uri(self.state_dir)
