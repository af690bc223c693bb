"""``iotfraud <subcommand> ...``: dispatches to each component's own ``cli.main``, or to the
module of this package that wires components together (``iotfraud train``: simulator -> models).

Components are imported lazily so that, for example, the dashboard does not pull in Spark.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable

from infra.errors import SetupError

# subcommand -> (module with main(argv), arguments prepended, one-line help)
COMMANDS: dict[str, tuple[str, list[str], str]] = {
    "stack": ("infra.cli", [], "local stack: up | status | down | jars"),
    "simulate": (
        "simulator.cli",
        ["simulate"],
        "generate telemetry with injected fraud into Kafka",
    ),
    "replay": ("simulator.cli", ["replay"], "send recorded telemetry (JSON lines or CSV) to Kafka"),
    "registry": ("simulator.cli", ["registry"], "create or change the device registry"),
    "firmware": (
        "simulator.cli",
        ["firmware"],
        "firmware authorize DEVICE FIRMWARE: publish an authorized update",
    ),
    "pipeline": ("pipeline.cli", [], "the Spark Structured Streaming job"),
    "maintain": ("pipeline.cli", ["maintain"], "compact and VACUUM the lake's tables"),
    "train": (
        "iotfraud.training",
        ["train"],
        "train the detector on simulated history; register it",
    ),
    "models": (
        "models.cli",
        ["models"],
        "registered models: list | promote VERSION | rollback | sign VERSION",
    ),
    "eval": ("models.cli", ["eval"], "score the live alerts against the ground truth"),
    "dashboard": ("dashboard.cli", [], "the Streamlit dashboard"),
    "sql": ("iotfraud.sql", [], 'Spark SQL over the lake\'s tables: iotfraud sql "SELECT ..."'),
    "config": ("iotfraud.config", [], "print every setting with its variable and default"),
    "demo": ("iotfraud.demo", [], "run the whole demo"),
}


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [f"  {name:<{width}}  {help_}" for name, (_, _, help_) in COMMANDS.items()]
    return "usage: iotfraud <command> [options]\n\ncommands:\n" + "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    command, rest = args[0], args[1:]
    if command not in COMMANDS:
        print(f"iotfraud: unknown command {command!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module_name, prefix, _ = COMMANDS[command]
    module = importlib.import_module(module_name)
    entry: Callable[[list[str]], int] = module.main
    try:
        return entry(prefix + rest)
    except SetupError as exc:
        print(f"iotfraud {command}: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # Whoever read our output has gone (`iotfraud demo | head`); the command's `finally`
        # blocks have stopped its children. Nothing more to print, and nowhere to print it.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
