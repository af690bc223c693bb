"""``iotfraud <command> ...``: one Click tree over the components' commands.

Each command lives with its component (``simulator.cli``, ``pipeline.cli``, ...) or, when it wires
components together, in this package (``iotfraud train``: simulator -> models). They are imported
only when run, so that, for example, the dashboard does not pull in Spark. Global options, the
settings file, error messages and exit codes: ``infra.commandline``.
"""

from __future__ import annotations

import importlib
import sys

import click

from infra.commandline import PROG, Group, Invocation, run

# command -> (module:attribute of its Click command, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "stack": ("infra.cli:cli", "local stack: up | status | down | jars"),
    "simulate": ("simulator.cli:simulate", "generate telemetry with injected fraud into Kafka"),
    "replay": ("simulator.cli:replay", "send recorded telemetry (JSON lines or CSV) to Kafka"),
    "registry": ("simulator.cli:registry", "create or change the device registry"),
    "firmware": (
        "simulator.cli:firmware",
        "firmware authorize DEVICE FIRMWARE: publish an authorized update",
    ),
    "pipeline": ("pipeline.cli:cli", "the Spark Structured Streaming job: run | maintain"),
    "maintain": ("pipeline.cli:maintain", "compact and VACUUM the lake's tables"),
    "train": ("iotfraud.training:train", "train the detector on simulated history; register it"),
    "models": (
        "models.cli:models",
        "registered models: list | promote VERSION | rollback | sign VERSION",
    ),
    "eval": ("models.cli:evaluate", "score the live alerts against the ground truth"),
    "dashboard": ("dashboard.cli:cli", "the Streamlit dashboard"),
    "sql": ("iotfraud.sql:sql", 'Spark SQL over the lake\'s tables: iotfraud sql "SELECT ..."'),
    "config": ("iotfraud.config:config", "print every setting with its variable and default"),
    "demo": ("iotfraud.demo:demo", "run the whole demo"),
}


class LazyGroup(Group):
    """The root: its commands are imported when one runs (or shows its help)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return None
        module, _, attribute = COMMANDS[cmd_name][0].partition(":")
        found: click.Command = getattr(importlib.import_module(module), attribute)
        return found

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # From the table: listing the commands imports none of them.
        with formatter.section("Commands"):
            formatter.write_dl([(name, help_) for name, (_, help_) in COMMANDS.items()])


@click.group(PROG, cls=LazyGroup)
def cli() -> None:
    """IoT fraud detection: simulator -> Kafka -> Spark pipeline -> Delta lake -> dashboard.

    Settings come from the environment and from ./.env (`iotfraud config` lists them); the
    environment wins. Exit status: 0 ok, 1 the command failed, 2 a usage error or a bad setting.
    """


def parse(args: list[str]) -> click.Context:
    """The context of the command that ``iotfraud *args`` runs, its options parsed and checked,
    without running it (for command lines written elsewhere: compose, spark-submit). The
    subcommand names come first, as in ``registry create --devices 10``.

    Raises:
        click.UsageError: the command line is refused.
    """
    cmd: click.Command = cli
    ctx = click.Context(cli, info_name=PROG, obj=Invocation())
    name, rest = PROG, list(args)
    while isinstance(cmd, click.Group) and rest and not rest[0].startswith("-"):
        name, rest = rest[0], rest[1:]
        found = cmd.get_command(ctx, name)
        if found is None:
            raise click.UsageError(f"No such command {name!r}.", ctx)
        cmd = found
        ctx = click.Context(cmd, info_name=name, parent=ctx)
    return cmd.make_context(name, rest, parent=ctx.parent)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    return run(cli, ["--help"] if not args or args == ["help"] else args)
