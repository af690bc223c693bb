"""``iotfraud dashboard``: run the Streamlit app with the dashboard's settings.

Settings reach the app through the environment (the app reads them with ``DashboardSettings``),
so options given here override the environment for the server process only.
"""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
from pathlib import Path

from dashboard.settings import DashboardSettings
from infra.errors import ConfigError
from infra.logs import configure_logging
from infra.settings import load_settings

log = logging.getLogger(__name__)

APP = Path(__file__).with_name("app.py")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="iotfraud dashboard",
        description="Run the Streamlit dashboard on the Delta lake. Other settings: IOT_DASH_*.",
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
        }
    )
    return env


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
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
        "dashboard on http://%s:%d (lake %s)", settings.address, settings.port, settings.lake_root
    )
    try:
        return subprocess.call(server_command(settings), env=server_env(settings))
    except KeyboardInterrupt:
        # Ctrl-C reaches streamlit too; it shuts down on its own.
        return 0
