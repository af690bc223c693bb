"""``iotfraud stack up | status | down | jars``."""

from __future__ import annotations

import argparse
import logging
import sys

from infra import stack
from infra.errors import SetupError
from infra.logs import configure_logging
from infra.processes import Stopped, stop_signals
from infra.settings import CommonSettings, StackSettings, load_settings

log = logging.getLogger(__name__)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="iotfraud stack", description="The local stack.")
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="action", required=True)
    sub.add_parser("up", help="resolve jars, start the Kafka broker, create lake and MLflow store")
    sub.add_parser("status", help="report what runs and what is cached")
    sub.add_parser("down", help="stop the broker this stack started")
    sub.add_parser("jars", help="resolve the Kafka broker and Spark connector jars into the cache")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure_logging(args.verbose)
    try:
        stack_settings = load_settings(StackSettings)
        common = load_settings(CommonSettings)
        if args.action == "jars":
            stack.resolve_jars(stack_settings)
            print(f"jars cached under {stack_settings.cache_dir / 'jars'}")
            return 0
        if args.action == "down":
            stopped = stack.down(stack_settings)
            print("broker stopped" if stopped else "no broker of this stack was running")
            return 0
        if args.action == "up":
            # A stop signal while the broker starts stops it again (the start cleans up).
            with stop_signals():
                status = stack.up(stack_settings, common)
        else:
            status = stack.status(stack_settings, common)
    except SetupError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except Stopped as stopped:
        print(f"stack up stopped by {stopped}; the broker it started is stopped", file=sys.stderr)
        return 1
    print("\n".join(status.lines()))
    print("stack healthy" if status.healthy else "stack NOT healthy")
    return 0 if status.healthy else 1
