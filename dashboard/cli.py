"""``iotfraud dashboard``: run the Streamlit app with the dashboard's settings.

Settings reach the app through the environment (the app reads them with ``DashboardSettings``),
so options given here override the environment for the server process only.

``iotfraud dashboard hash-password NAME`` prints a ``NAME:hash`` line for the user file
(``IOT_DASH_AUTH_FILE``); the password is read from the terminal or stdin, never from the
command line (which other users of the machine can see).
"""

from __future__ import annotations

import getpass
import ipaddress
import logging
import os
import sys
from pathlib import Path
from typing import TextIO

import click

from dashboard import auth
from dashboard.settings import DashboardSettings
from infra.commandline import group, run, setting, settings_from
from infra.processes import Children, Stopped, stop_signals

log = logging.getLogger(__name__)

APP = Path(__file__).with_name("app.py")


def server_command(settings: DashboardSettings) -> list[str]:
    """The ``streamlit run`` command line, with the current interpreter."""
    return [
        sys.executable, "-m", "streamlit", "run", str(APP),
        "--server.port", str(settings.port),
        "--server.address", settings.address,
        "--server.headless", "true",
        "--browser.gatherUsageStats", "false",
        # The app's code does not change while it serves; watching files only costs CPU.
        "--server.fileWatcherType", "none",
        "--client.toolbarMode", "viewer",
    ]  # fmt: skip


def server_env(settings: DashboardSettings) -> dict[str, str]:
    """The environment of the server: this one plus the settings, under their own names."""
    env = dict(os.environ)
    env.update(
        {
            "IOT_LAKE_ROOT": settings.lake_root,
            "MLFLOW_TRACKING_URI": settings.mlflow_tracking_uri,
            "IOT_MODEL_NAME": settings.model_name,
            "IOT_STACK_STATE_DIR": str(settings.state_dir),
            "IOT_DASH_PORT": str(settings.port),
            "IOT_DASH_ADDRESS": settings.address,
            "IOT_DASH_REFRESH_SECONDS": str(settings.refresh_seconds),
            "IOT_DASH_LOOKBACK_HOURS": str(settings.lookback_hours),
            "IOT_DASH_MAX_ROWS": str(settings.max_rows),
            "IOT_DASH_INGEST_QUERY": settings.ingest_query,
            "IOT_DASH_MAP_STYLE": settings.map_style,
            "IOT_DASH_ANALYST": settings.analyst,
            "IOT_DASH_AUTH_FILE": str(settings.auth_file or ""),
        }
    )
    return env


def is_loopback(address: str) -> bool:
    """True if only this machine can reach ``address``."""
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:  # a host name: it may resolve to anything
        return False


def read_password(stdin: TextIO) -> str:
    """The new password: typed twice on a terminal, else the first line of stdin."""
    if stdin.isatty():
        password = getpass.getpass("Password: ")
        if getpass.getpass("Repeat it: ") != password:
            raise ValueError("the two passwords differ")
    else:
        password = stdin.readline().removesuffix("\n").removesuffix("\r")
    if len(password) < auth.MIN_PASSWORD_CHARS:
        raise ValueError(f"the password must have at least {auth.MIN_PASSWORD_CHARS} characters")
    return password


@group(
    "dashboard",
    invoke_without_command=True,
    epilog="Other settings: the IOT_DASH_* variables (iotfraud config). "
    "`iotfraud dashboard hash-password NAME` makes a line for the user file (IOT_DASH_AUTH_FILE) "
    "that turns sign-in on.",
)
@setting(DashboardSettings, "port")
@setting(DashboardSettings, "address")
@setting(DashboardSettings, "refresh_seconds")
@click.pass_context
def cli(ctx: click.Context, /, **_settings: object) -> int | None:
    """Run the Streamlit dashboard on the Delta lake."""
    if ctx.invoked_subcommand is not None:
        return None
    return serve(settings_from(DashboardSettings))


def serve(settings: DashboardSettings) -> int:
    """Run the Streamlit server until it ends or a stop signal; its exit status."""
    log.info(
        "dashboard on http://%s:%d (lake %s, sign-in %s)",
        settings.address,
        settings.port,
        settings.lake_root,
        "off" if settings.auth_file is None else f"with the users of {settings.auth_file}",
    )
    if settings.auth_file is None and not is_loopback(settings.address):
        log.warning(
            "the dashboard listens on %s without sign-in: whoever reaches it reads the alerts and "
            "can record verdicts; set IOT_DASH_AUTH_FILE or put it behind an authenticating proxy "
            "(README: Dashboard authentication)",
            settings.address,
        )
    children = Children()
    try:
        with stop_signals():
            server = children.start("dashboard server", server_command(settings),
                                    server_env(settings))  # fmt: skip
            return server.wait()
    except Stopped as stopped:
        log.info("%s: stopping the dashboard", stopped)
        return 0
    finally:
        children.stop(timeout_s=10)


@cli.command(
    "hash-password",
    epilog="example: iotfraud dashboard hash-password ana >> /etc/iotfraud/dashboard-users",
)
@click.argument("name")
def hash_password(name: str) -> None:
    """Print NAME:hash for the dashboard's user file (IOT_DASH_AUTH_FILE).

    NAME is the analyst's user name (also recorded with their verdicts). The password is asked
    for twice on a terminal, or read from the first line of stdin.
    """
    try:
        name = auth.check_name(name)
        password = read_password(sys.stdin)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    click.echo(f"{name}:{auth.hash_password(password)}")


def main(argv: list[str] | None = None) -> int:
    return run(cli, argv, prog="iotfraud dashboard")
