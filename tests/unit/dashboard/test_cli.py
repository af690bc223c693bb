"""The dashboard's settings and the command that starts the Streamlit server."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest

from dashboard import auth, cli
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
    [
        ("IOT_DASH_PORT", "0"),
        ("IOT_DASH_REFRESH_SECONDS", "x"),
        ("IOT_DASH_MAP_STYLE", "mapbox"),
        ("IOT_DASH_SESSION_IDLE_MINUTES", "0"),
        ("IOT_DASH_SESSION_IDLE_MINUTES", "inf"),
        ("IOT_DASH_SESSION_IDLE_MINUTES", "half an hour"),
        ("IOT_DASH_SIGN_IN_GLOBAL_MAX_FAILURES", "x"),
    ],
)
def test_bad_settings_name_the_variable(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError, match=variable):
        load_settings(DashboardSettings)


def test_sessions_expire_and_sign_ins_are_capped_by_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("IOT_DASH_SESSION_IDLE_MINUTES", raising=False)
    monkeypatch.delenv("IOT_DASH_SIGN_IN_GLOBAL_MAX_FAILURES", raising=False)
    settings = load_settings(DashboardSettings)
    assert (settings.session_idle_minutes, settings.sign_in_global_max_failures) == (30.0, 100)
    monkeypatch.setenv("IOT_DASH_SESSION_IDLE_MINUTES", "480")
    assert load_settings(DashboardSettings).session_idle_minutes == 480.0


def test_a_global_cap_one_client_could_reach_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IOT_DASH_SIGN_IN_GLOBAL_MAX_FAILURES", str(auth.CLIENT_MAX_FAILURES))
    with pytest.raises(ConfigError, match=r"IOT_DASH_SIGN_IN_GLOBAL_MAX_FAILURES: .*more than 20"):
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


class ExitedServer:
    """Stands in for the Streamlit server process: it has already exited with 0."""

    returncode = 0

    def wait(self, timeout: float | None = None) -> int:
        return 0

    def poll(self) -> int:
        return 0


def test_main_runs_streamlit_with_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[list[str], dict[str, str]]] = []

    def fake_start(command: list[str], env: dict[str, str]) -> ExitedServer:
        calls.append((command, env))
        return ExitedServer()

    monkeypatch.setattr("infra.processes.start_child", fake_start)
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


@pytest.fixture
def user_file(tmp_path: Path) -> Path:
    path = tmp_path / "dashboard-users"
    path.write_text(f"ana:{auth.hash_password('password-a', n=2**10, p=1)}\n")
    return path


def test_sign_in_is_off_by_default_and_on_with_a_user_file(
    monkeypatch: pytest.MonkeyPatch, user_file: Path
) -> None:
    monkeypatch.delenv("IOT_DASH_AUTH_FILE", raising=False)
    assert load_settings(DashboardSettings).auth_file is None
    monkeypatch.setenv("IOT_DASH_AUTH_FILE", "")
    assert load_settings(DashboardSettings).auth_file is None
    monkeypatch.setenv("IOT_DASH_AUTH_FILE", str(user_file))
    settings = load_settings(DashboardSettings)
    assert settings.auth_file == user_file
    # The server process gets the same file.
    monkeypatch.setattr("os.environ", cli.server_env(settings))
    assert load_settings(DashboardSettings) == settings


@pytest.mark.parametrize(
    ("content", "message"),
    [(None, "cannot read the user file"), ("", "lists no user"), ("ana:x\n", "line 1")],
)
def test_a_bad_user_file_stops_the_dashboard_at_start(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    content: str | None,
    message: str,
) -> None:
    path = tmp_path / "users"
    if content is not None:
        path.write_text(content)
    monkeypatch.setenv("IOT_DASH_AUTH_FILE", str(path))
    monkeypatch.setattr("infra.processes.start_child", lambda *a: pytest.fail("server started"))
    assert cli.main([]) == 2
    err = capsys.readouterr().err
    assert "IOT_DASH_AUTH_FILE" in err
    assert message in err


@pytest.mark.parametrize(
    ("address", "signed_in", "warned"),
    [
        ("127.0.0.1", False, False),
        ("localhost", False, False),
        ("::1", False, False),
        ("0.0.0.0", False, True),
        ("dashboard.internal", False, True),
        ("0.0.0.0", True, False),
    ],
)
def test_listening_beyond_loopback_without_sign_in_is_warned_about(
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    user_file: Path,
    address: str,
    signed_in: bool,
    warned: bool,
) -> None:
    monkeypatch.setenv("IOT_DASH_AUTH_FILE", str(user_file) if signed_in else "")
    monkeypatch.setattr("infra.processes.start_child", lambda *a: ExitedServer())
    monkeypatch.setattr("infra.commandline.configure_logging", lambda verbose: None)
    with caplog.at_level("INFO", logger="dashboard.cli"):
        assert cli.main(["--address", address]) == 0
    warnings = [r for r in caplog.records if r.levelname == "WARNING"]
    assert bool(warnings) == warned
    if warned:
        assert "IOT_DASH_AUTH_FILE" in warnings[0].getMessage()


def test_hash_password_reads_stdin_and_prints_a_user_file_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("correct horse battery\n"))
    assert cli.main(["hash-password", "ana"]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1
    assert "correct horse" not in out
    users = auth.parse_users(out)
    assert auth.authenticate(users, "ana", "correct horse battery")
    assert not auth.authenticate(users, "ana", "correct horse battery\n")


def test_hash_password_asks_twice_on_a_terminal(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    answers = iter(["first password", "other password"])
    monkeypatch.setattr("getpass.getpass", lambda prompt: next(answers))
    monkeypatch.setattr("sys.stdin", Terminal())
    assert cli.main(["hash-password", "ana"]) == 2
    assert "differ" in capsys.readouterr().err
    answers = iter(["same password", "same password"])
    assert cli.main(["hash-password", "ana"]) == 0
    users = auth.parse_users(capsys.readouterr().out)
    assert auth.authenticate(users, "ana", "same password")


@pytest.mark.parametrize(
    ("argv", "stdin", "message"),
    [
        (["ana"], "short\n", "at least 8 characters"),
        (["ana"], "", "at least 8 characters"),
        (["ana smith"], "correct horse\n", "user name"),
        (["ana:admin"], "correct horse\n", "user name"),
    ],
)
def test_hash_password_refuses_bad_input(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    stdin: str,
    message: str,
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
    assert cli.main(["hash-password", *argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert message in captured.err


def test_hash_password_is_a_dashboard_subcommand(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("correct horse\n"))
    assert cli.main(["hash-password", "kim"]) == 0
    assert capsys.readouterr().out.startswith("kim:scrypt$")
