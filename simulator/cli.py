"""``iotfraud simulate | replay | registry | firmware`` (also ``python -m simulator ...``).

Options override the ``IOT_SIM_*`` environment; a bad value stops with a message naming it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TypeVar

import click

from infra import contract as c
from infra.commandline import PROG, command, error, group, run, setting, settings_from
from infra.errors import ConfigError
from infra.kafka_client import ensure_topic
from simulator import registry as reg
from simulator.producer import (
    RunStats,
    Sender,
    admin_config,
    check_producer_options,
    default_start,
    producer_config,
    run_simulation,
    runs_ahead_of_wall_clock,
)
from simulator.settings import SimulatorSettings
from simulator.telemetry import Simulation, write_jsonl

log = logging.getLogger(__name__)

_KAFKA_ONLY_REASONS = (c.REASON_KEY_MISMATCH, c.REASON_INVALID_UTF8)

F = TypeVar("F", bound=Callable[..., Any])


def kafka_options(func: F) -> F:
    """The Kafka options of the commands that produce."""
    for decorator in reversed((
        setting(SimulatorSettings, "bootstrap_servers"),
        setting(SimulatorSettings, "topic"),
        click.option("--kafka-option", multiple=True, metavar="KEY=VALUE",
                     help="librdkafka option, repeatable (e.g. security.protocol=SASL_SSL); "
                     "wins over IOT_SIM_KAFKA_OPTIONS."),
        setting(SimulatorSettings, "partitions"),
    )):  # fmt: skip
        func = decorator(func)
    return func


def _pairs(items: Sequence[str], what: str) -> dict[str, str]:
    result: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise click.BadParameter(f"expects KEY=VALUE, got {item!r}", param_hint=what)
        result[key.strip()] = value.strip()
    return result


def simulator_settings(**overrides: Any) -> SimulatorSettings:
    """Environment settings with the command-line options on top (and ``--kafka-option``)."""
    settings = settings_from(SimulatorSettings, **overrides)
    given = click.get_current_context().params.get("kafka_option")
    if given:
        options = {**settings.kafka_options, **_pairs(given, "--kafka-option")}
        settings = settings.model_copy(update={"kafka_options": options})
    return settings


def load_or_create_registry(settings: SimulatorSettings) -> Any:
    table = reg.read_registry(settings.lake_root)
    if table is None:
        table = reg.build_registry(settings.devices, settings.seed)
        reg.write_registry(table, settings.lake_root)
        print(f"registry: {table.num_rows:,} devices created under {settings.lake_root}")
    return table


@contextmanager
def stop_on_signals() -> Iterator[threading.Event]:
    """An event set by SIGINT or SIGTERM, so the loop can flush and exit cleanly."""
    stop = threading.Event()
    previous = {}

    def handler(signum: int, _frame: Any) -> None:
        log.info("received %s: stopping after a final flush", signal.Signals(signum).name)
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        previous[sig] = signal.signal(sig, handler)
    try:
        yield stop
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _progress(stats: RunStats, sim: Simulation, final: bool) -> None:
    line = (
        f"sent {stats.sent:,} | {stats.rate:,.0f} msg/s | failures {stats.failures:,} | "
        f"queued {stats.queued:,} | sim {sim.now:%Y-%m-%d %H:%M:%S}Z"
    )
    if sys.stderr.isatty():
        sys.stderr.write("\r" + line + ("\n" if final else ""))
    elif not final:
        sys.stderr.write(line + "\n")
    sys.stderr.flush()


@command(epilog="Other settings: the IOT_SIM_* variables (iotfraud config).")
@setting(SimulatorSettings, "devices")
@setting(SimulatorSettings, "seed")
@setting(SimulatorSettings, "rate")
@setting(SimulatorSettings, "accelerate")
@setting(SimulatorSettings, "duration")
@setting(SimulatorSettings, "count")
@setting(SimulatorSettings, "start_time")
@setting(SimulatorSettings, "scenarios")
@click.option("--no-scenarios", is_flag=True, help="Clean telemetry only.")
@setting(SimulatorSettings, "scenario_rate")
@click.option("--rate-of", multiple=True, metavar="SCENARIO=R",
              help="Injections per simulated hour of one scenario, repeatable.")  # fmt: skip
@setting(SimulatorSettings, "run_id")
@click.option("--out", type=click.Path(path_type=Path),
              help="Write JSON-lines files to this folder instead of Kafka (offline).")  # fmt: skip
@click.option("--sim-seconds", type=click.FloatRange(min=0, min_open=True), default=3600.0,
              show_default=True, help="With --out: simulated seconds to generate.")  # fmt: skip
@click.option("--no-ground-truth", is_flag=True, help="Do not write ground_truth.")
@click.option("--no-progress", is_flag=True, help="No progress line on stderr.")
@kafka_options
def simulate(
    *,
    no_scenarios: bool,
    rate_of: tuple[str, ...],
    out: Path | None,
    sim_seconds: float,
    no_ground_truth: bool,
    no_progress: bool,
    **_settings: object,
) -> int:
    """Generate telemetry with injected scenarios into Kafka (or files, with --out)."""
    overrides: dict[str, Any] = {}
    if no_scenarios:
        overrides["scenarios"] = []
    if rate_of:
        rates = _pairs(rate_of, "--rate-of")
        try:
            overrides["scenario_rates"] = {k: float(v) for k, v in rates.items()}
        except ValueError:
            raise click.BadParameter(
                f"expects SCENARIO=NUMBER, got {list(rate_of)}", param_hint="--rate-of"
            ) from None
    if no_ground_truth:
        overrides["write_ground_truth"] = False
    settings = simulator_settings(**overrides)
    registry = load_or_create_registry(settings)
    if out is not None:
        # Files carry no key, and a text reader replaces invalid UTF-8: those two kinds of
        # malformed message would arrive as valid events there.
        reasons = [r for r in settings.malformed_reasons if r not in _KAFKA_ONLY_REASONS]
        settings = settings.model_copy(update={"malformed_reasons": reasons})
        sim = Simulation(settings, registry, start_time=settings.start_time)
        files = write_jsonl(sim.batches(sim_seconds=sim_seconds, count=settings.count or None),
                            out)  # fmt: skip
        rows = sim.finish(sim.cut_at)
        if settings.write_ground_truth:
            from simulator.scenarios import write_ground_truth

            write_ground_truth(rows, settings.lake_root)
        click.echo(f"wrote {len(files)} JSON-lines files to {out}; {len(rows)} injections")
        return 0
    check_producer_options(settings)
    ensure_topic(admin_config(settings), settings.topic, settings.partitions,
                 settings.replication_factor)  # fmt: skip
    if settings.firmware_topic:
        # The pipeline joins telemetry with the authorized updates published there.
        ensure_topic(admin_config(settings), settings.firmware_topic, 1,
                     settings.replication_factor)  # fmt: skip
    probe = Simulation(settings, registry, start_time=datetime(2000, 1, 1, tzinfo=timezone.utc))
    start = default_start(settings, probe.natural_rate, datetime.now(timezone.utc))
    if runs_ahead_of_wall_clock(settings, probe.natural_rate):
        log.warning(
            "the simulated clock runs faster than real time from now: event times ahead of the "
            "send time are quarantined by the pipeline; give --count or --start-time (or "
            "--duration with --rate or --accelerate)"
        )
    sim = Simulation(settings, registry, start_time=start)
    with stop_on_signals() as stop:
        stats = run_simulation(
            settings, sim, stop=stop, progress=None if no_progress else _progress
        )
    click.echo(stats.line())
    if stats.first_error:
        error(f"first delivery error: {stats.first_error}")
    return 0 if stats.failures == 0 and stats.queued == 0 else 1


@command(epilog="Other settings: the IOT_SIM_* variables (iotfraud config).")
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@click.option("--map", "mappings", multiple=True, metavar="FIELD=COLUMN,...",
              help="Contract field = source column, e.g. device_id=dev,event_time=ts.")  # fmt: skip
@click.option("--speed", type=click.FloatRange(min=0), default=0.0, show_default=True,
              help="Speed factor on event-time gaps; 0 = max speed.")  # fmt: skip
@click.option("--register", is_flag=True, help="Add replayed device ids to the registry.")
@kafka_options
def replay(file: str, mappings: tuple[str, ...], speed: float, register: bool,
           **_settings: object) -> int:  # fmt: skip
    """Send recorded telemetry to Kafka: FILE is .jsonl/.json (one event a line) or .csv."""
    from simulator.replay import guess_device_type, parse_mapping
    from simulator.replay import replay as send_file

    settings = simulator_settings()
    try:
        mapping = parse_mapping(list(mappings))
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--map") from None
    check_producer_options(settings)
    ensure_topic(admin_config(settings), settings.topic, settings.partitions,
                 settings.replication_factor)  # fmt: skip
    stats = RunStats()
    sender = Sender(producer_config(settings), settings.topic, stats)
    with stop_on_signals() as stop:
        report = send_file(
            file,
            lambda key, value: sender.send([key], [value]),
            mapping=mapping,
            speed=speed,
            stop=stop.is_set,
        )
    sender.flush()
    click.echo(f"replayed {report.sent:,} events from {file}; rejected {report.rejected:,} rows")
    for row in report.examples:
        click.echo(f"  line {row.line}: {row.reason}: {row.raw}", err=True)
    if register and report.devices:
        known = reg.read_registry(settings.lake_root)
        known_ids = set(known.column("device_id").to_pylist()) if known is not None else set()
        now = datetime.now(timezone.utc)
        rows = [
            reg.unknown_device_row(
                device_id, device_type=guess_device_type(event), lat=event["lat"],
                lon=event["lon"], firmware=event["firmware"], now=now,
            )
            for device_id, event in report.devices.items() if device_id not in known_ids
        ]  # fmt: skip
        reg.register_devices(settings.lake_root, rows)
        click.echo(f"registered {len(rows)} new devices")
    if stats.failures or stats.queued:
        error(f"delivery failures: {stats.failures}, undelivered: {stats.queued}")
        return 1
    return 1 if report.rejected else 0


@group()
def registry() -> None:
    """Create or change the device registry."""


@registry.command()
@setting(SimulatorSettings, "devices")
@setting(SimulatorSettings, "seed")
def create(**_settings: object) -> None:
    """Write a new Faker fleet to the devices table."""
    settings = simulator_settings()
    table = reg.build_registry(settings.devices, settings.seed)
    reg.write_registry(table, settings.lake_root)
    click.echo(f"registry: {table.num_rows:,} devices written under {settings.lake_root}")


@registry.command()
@click.option("--count", type=click.IntRange(min=1), default=10, show_default=True,
              help="Devices to change.")  # fmt: skip
@click.option("--seed", type=int, help="Seed of the changes (default: random).")
def change(count: int, seed: int | None) -> None:
    """New owner, moved site or retired for some devices (a new version of the registry)."""
    settings = simulator_settings()
    seed = seed if seed is not None else int(datetime.now().timestamp())
    try:
        changed = reg.change_devices(settings.lake_root, count, seed)
    except FileNotFoundError as exc:
        raise ConfigError(str(exc)) from None
    click.echo(f"registry: {changed.num_rows} devices changed")
    for row in changed.select(["device_id", "owner", "status", "site_address"]).to_pylist():
        click.echo("  " + json.dumps(row))


def firmware_update(device_id: str, firmware: str, at: datetime) -> bytes:
    """An authorized-update message (``infra.contract.FIRMWARE_UPDATE_FIELDS``)."""
    authorized_at = at.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")
    update_id = hashlib.sha256(f"{device_id}|{firmware}|{authorized_at}".encode()).hexdigest()
    body = {"update_id": update_id[:32], "device_id": device_id, "firmware": firmware,
            "authorized_at": authorized_at}  # fmt: skip
    return json.dumps(body).encode()


@group()
def firmware() -> None:
    """Publish authorized firmware updates."""


@firmware.command()
@click.argument("device_id")
@click.argument("firmware_version", metavar="FIRMWARE")
@click.option("--at", metavar="ISO-8601",
              help="Authorization time (default: now; UTC without an offset).")  # fmt: skip
@kafka_options
def authorize(device_id: str, firmware_version: str, at: str | None,
              **_settings: object) -> None:  # fmt: skip
    """Authorize FIRMWARE on DEVICE_ID (published to IOT_FIRMWARE_TOPIC)."""
    from confluent_kafka import Producer

    settings = simulator_settings()
    if not settings.firmware_topic:
        raise ConfigError("IOT_FIRMWARE_TOPIC is empty: set it to the topic of authorized updates")
    try:
        when = datetime.fromisoformat(at) if at else datetime.now(timezone.utc)
    except ValueError:
        raise click.BadParameter(
            f"expects an ISO-8601 time, got {at!r}", param_hint="--at"
        ) from None
    when = when if when.tzinfo else when.replace(tzinfo=timezone.utc)
    check_producer_options(settings)
    ensure_topic(admin_config(settings), settings.firmware_topic, 1, settings.replication_factor)
    producer = Producer(producer_config(settings))
    producer.produce(settings.firmware_topic, key=device_id.encode(),
                     value=firmware_update(device_id, firmware_version, when))  # fmt: skip
    if producer.flush(30):
        raise click.ClickException(f"the update was not delivered to {settings.bootstrap_servers}")
    click.echo(f"authorized firmware {firmware_version} on {device_id} at {when.isoformat()}")


@group(PROG)
def cli() -> None:
    """The telemetry simulator (``python -m simulator``; the same commands as ``iotfraud``)."""


for _command in (simulate, replay, registry, firmware):
    cli.add_command(_command)


def main(argv: list[str] | None = None) -> int:
    return run(cli, argv)
