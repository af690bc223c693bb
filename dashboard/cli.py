"""``iotfraud dashboard``: run the Streamlit app with the dashboard's settings.

Settings reach the app through the environment (the app reads them with ``DashboardSettings``),
so options given here override the environment for the server process only.

``iotfraud dashboard hash-password NAME`` prints a ``NAME:hash`` line for the user file
(``IOT_DASH_AUTH_FILE``); the password is read from the terminal or stdin, never from the
command line (which other users of the machine can see).
"""

from __future__ import annotations

import argparse
import getpass
import ipaddress
import logging
import os
import sys
from pathlib import Path
from typing import TextIO

from dashboard import auth
from dashboard.settings import DashboardSettings
from infra.errors import ConfigError
from infra.logs import configure_logging
from infra.processes import Children, Stopped, stop_signals
from infra.settings import load_settings

log = logging.getLogger(__name__)

APP = Path(__file__).with_name("app.py")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="iotfraud dashboard",
        description="Run the Streamlit dashboard on the Delta lake. Other settings: IOT_DASH_*.",
        epilog="iotfraud dashboard hash-password NAME: a line for the user file "
        "(IOT_DASH_AUTH_FILE) that turns sign-in on.",
    )
    parser.add_argument("--port", type=int, help="server port (IOT_DASH_PORT, default 8501)")
    parser.add_argument("--address", help="address to bind (IOT_DASH_ADDRESS)")
    parser.add_argument("--lake-root", help="root of the Delta tables (IOT_LAKE_ROOT)")
    parser.add_argument("--refresh-seconds", type=float, help="IOT_DASH_REFRESH_SECONDS")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    return parser.parse_args(argv)


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


def hash_password_main(argv: list[str], stdin: TextIO | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="iotfraud dashboard hash-password",
        description="Print NAME:hash for the dashboard's user file (IOT_DASH_AUTH_FILE). The "
        "password is asked for twice on a terminal, or read from the first line of stdin.",
        epilog="example: iotfraud dashboard hash-password ana >> /etc/iotfraud/dashboard-users",
    )
    parser.add_argument("name", help="the analyst's user name (also recorded with their verdicts)")
    args = parser.parse_args(argv)
    try:
        name = auth.check_name(args.name)
        password = read_password(stdin or sys.stdin)
    except ValueError as exc:
        print(f"iotfraud dashboard hash-password: {exc}", file=sys.stderr)
        return 2
    print(f"{name}:{auth.hash_password(password)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["hash-password"]:
        return hash_password_main(argv[1:])
    args = parse_args(argv)
    configure_logging(args.verbose)
    overrides = {
        name: value
        for name, value in (
            ("port", args.port),
            ("address", args.address),
            ("lake_root", args.lake_root),
            ("refresh_seconds", args.refresh_seconds),
        )
        if value is not None
    }
    try:
        settings = load_settings(DashboardSettings, **overrides)
    except ConfigError as exc:
        print(f"iotfraud dashboard: {exc}", file=sys.stderr)
        return 2
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
