"""The dashboard's settings and the command that starts the Streamlit server."""

from __future__ import annotations

import sys

import pytest

from dashboard import cli
from dashboard.settings import DashboardSettings
from infra.errors import ConfigError
from infra.settings import load_settings


def test_settings_read_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IOT_DASH_PORT", "8600")
    monkeypatch.setenv("IOT_MODEL_NAME", "other-model")
    monkeypatch.setenv("IOT_LAKE_ROOT", "/data/lake")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow:5000")
    settings = load_settings(DashboardSettings)
    assert (settings.port, settings.model_name, settings.lake_root) == (
        8600,
        "other-model",
        "/data/lake",
    )
    assert settings.tracking_uri() == "http://mlflow:5000"


def test_empty_tracking_uri_means_the_local_store(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("IOT_STACK_STATE_DIR", "/srv/state")
    assert (
        load_settings(DashboardSettings).tracking_uri() == "sqlite:////srv/state/mlflow/mlflow.db"
    )


@pytest.mark.parametrize(
    ("variable", "value"),
    [("IOT_DASH_PORT", "0"), ("IOT_DASH_REFRESH_SECONDS", "x"), ("IOT_DASH_MAP_STYLE", "mapbox")],
)
def test_bad_settings_name_the_variable(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError, match=variable):
        load_settings(DashboardSettings)


def test_every_setting_is_described() -> None:
    assert all(field.description for field in DashboardSettings.model_fields.values())


def test_server_command_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IOT_DASH_PORT", "8600")
    settings = load_settings(DashboardSettings, lake_root="/tmp/lake", port=8700)
    command = cli.server_command(settings)
    assert command[:4] == [sys.executable, "-m", "streamlit", "run"]
    assert command[4].endswith("dashboard/app.py")
    assert command[command.index("--server.port") + 1] == "8700"
    assert command[command.index("--server.headless") + 1] == "true"
    env = cli.server_env(settings)
    assert (env["IOT_LAKE_ROOT"], env["IOT_DASH_PORT"]) == ("/tmp/lake", "8700")
    # The app reads back exactly what the command was given.
    monkeypatch.setattr("os.environ", env)
    assert load_settings(DashboardSettings) == settings


def test_main_runs_streamlit_with_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[list[str], dict[str, str]]] = []

    def fake_call(command: list[str], env: dict[str, str]) -> int:
        calls.append((command, env))
        return 0

    monkeypatch.setattr("subprocess.call", fake_call)
    assert cli.main(["--port", "8123", "--lake-root", "/x/lake"]) == 0
    command, env = calls[0]
    assert command[command.index("--server.port") + 1] == "8123"
    assert env["IOT_LAKE_ROOT"] == "/x/lake"


def test_main_reports_bad_configuration(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("IOT_DASH_REFRESH_SECONDS", "0")
    assert cli.main([]) == 2
    assert "IOT_DASH_REFRESH_SECONDS" in capsys.readouterr().err
