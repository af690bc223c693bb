"""``iotfraud stack up | status | down | jars`` (also ``python -m infra ...``)."""

from __future__ import annotations

import logging

import click

from infra import stack
from infra.commandline import group, run
from infra.processes import Stopped, stop_signals
from infra.settings import CommonSettings, StackSettings, load_settings

log = logging.getLogger(__name__)


@group("stack")
def cli() -> None:
    """The local stack: the Kafka broker, the jars, the lake folder and the MLflow store."""


def report(status: stack.StackStatus) -> int:
    click.echo("\n".join(status.lines()))
    click.echo("stack healthy" if status.healthy else "stack NOT healthy")
    return 0 if status.healthy else 1


@cli.command()
def up() -> int:
    """Resolve jars, start the Kafka broker, create the lake and the MLflow store."""
    settings, common = load_settings(StackSettings), load_settings(CommonSettings)
    try:
        # A stop signal while the broker starts stops it again (the start cleans up).
        with stop_signals():
            status = stack.up(settings, common)
    except Stopped as stopped:
        raise click.ClickException(
            f"stopped by {stopped}; the broker it started is stopped"
        ) from None
    return report(status)


@cli.command()
def status() -> int:
    """Report what runs and what is cached (exit status 1 when something is down)."""
    return report(stack.status(load_settings(StackSettings), load_settings(CommonSettings)))


@cli.command()
def down() -> None:
    """Stop the broker this stack started."""
    stopped = stack.down(load_settings(StackSettings))
    click.echo("broker stopped" if stopped else "no broker of this stack was running")


@cli.command()
def jars() -> None:
    """Resolve the Kafka broker and Spark connector jars into the cache."""
    settings = load_settings(StackSettings)
    stack.resolve_jars(settings)
    click.echo(f"jars cached under {settings.cache_dir / 'jars'}")


def main(argv: list[str] | None = None) -> int:
    return run(cli, argv, prog="iotfraud stack")
