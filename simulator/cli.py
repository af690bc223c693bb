"""``iotfraud simulate | replay | registry`` (also ``python -m simulator ...``).

Options override the ``IOT_SIM_*`` environment; a bad value stops with a message naming it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Any

from infra import contract as c
from infra.errors import ConfigError, SetupError
from infra.kafka_client import ensure_topic
from infra.logs import configure_logging
from infra.settings import load_settings
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


def _kafka_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bootstrap-servers", help="Kafka bootstrap servers")
    parser.add_argument("--topic", help="telemetry topic")
    parser.add_argument(
        "--kafka-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="librdkafka option, repeatable (e.g. security.protocol=SASL_SSL)",
    )
    parser.add_argument("--partitions", type=int, help="partitions if the topic is created")
    parser.add_argument("--lake-root", help="root of the Delta tables")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="iotfraud", description="The telemetry simulator.")
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)

    sim = sub.add_parser("simulate", help="generate telemetry with injected scenarios into Kafka")
    sim.add_argument("--devices", type=int, help="fleet size (default 1000)")
    sim.add_argument("--seed", type=int, help="seed of the fleet and the telemetry")
    sim.add_argument("--rate", type=float, help="events/s to send (token bucket)")
    sim.add_argument(
        "--accelerate", type=float, help="simulated seconds per wall second; 0 = max speed"
    )
    sim.add_argument("--duration", type=float, help="stop after this many wall seconds")
    sim.add_argument("--count", type=int, help="stop after this many messages")
    sim.add_argument("--start-time", help="simulated clock start, ISO-8601 (default: auto)")
    sim.add_argument("--scenarios", help="comma-separated scenarios to switch on (default all)")
    sim.add_argument("--no-scenarios", action="store_true", help="clean telemetry only")
    sim.add_argument(
        "--scenario-rate", type=float, help="injections of each scenario per simulated hour"
    )
    sim.add_argument(
        "--rate-of",
        action="append",
        default=[],
        metavar="SCENARIO=R",
        help="injections per simulated hour of one scenario, repeatable",
    )
    sim.add_argument("--run-id", help="run id in ground_truth")
    sim.add_argument(
        "--out", help="write JSON-lines files to this folder instead of Kafka (offline)"
    )
    sim.add_argument("--sim-seconds", type=float, help="with --out: simulated seconds to generate")
    sim.add_argument("--no-ground-truth", action="store_true", help="do not write ground_truth")
    sim.add_argument("--no-progress", action="store_true", help="no progress line on stderr")
    _kafka_args(sim)

    rep = sub.add_parser("replay", help="send recorded telemetry (JSON lines or CSV) to Kafka")
    rep.add_argument("file", help="a .jsonl/.json file (one event a line) or a .csv file")
    rep.add_argument(
        "--map",
        action="append",
        default=[],
        metavar="FIELD=COLUMN,...",
        help="contract field = source column, e.g. device_id=dev,event_time=ts",
    )
    rep.add_argument(
        "--speed", type=float, default=0.0, help="speed factor on event-time gaps; 0 = max speed"
    )
    rep.add_argument(
        "--register", action="store_true", help="add replayed device ids to the registry"
    )
    _kafka_args(rep)

    regp = sub.add_parser("registry", help="create or change the device registry")
    regsub = regp.add_subparsers(dest="action", required=True)
    create = regsub.add_parser("create", help="write a new Faker fleet to the devices table")
    create.add_argument("--devices", type=int, help="fleet size")
    create.add_argument("--seed", type=int, help="seed")
    create.add_argument("--lake-root", help="root of the Delta tables")
    change = regsub.add_parser(
        "change", help="new owner, moved site or retired for some devices (a new version)"
    )
    change.add_argument("--count", type=int, default=10, help="devices to change")
    change.add_argument("--seed", type=int, help="seed of the changes (default: random)")
    change.add_argument("--lake-root", help="root of the Delta tables")

    fw = sub.add_parser("firmware", help="publish an authorized firmware update")
    fwsub = fw.add_subparsers(dest="action", required=True)
    authorize = fwsub.add_parser(
        "authorize", help="authorize FIRMWARE on DEVICE_ID (topic IOT_FIRMWARE_TOPIC)"
    )
    authorize.add_argument("device_id")
    authorize.add_argument("firmware")
    authorize.add_argument("--at", help="authorization time, ISO-8601 (default: now)")
    _kafka_args(authorize)
    return parser


def _pairs(items: list[str], what: str) -> dict[str, str]:
    result: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"{what} expects KEY=VALUE, got {item!r}")
        result[key.strip()] = value.strip()
    return result


def settings_from(args: argparse.Namespace) -> SimulatorSettings:
    """Environment settings with the command-line options on top."""
    names = {
        "devices": "devices", "seed": "seed", "rate": "rate", "accelerate": "accelerate",
        "duration": "duration", "count": "count", "start_time": "start_time",
        "scenarios": "scenarios", "scenario_rate": "scenario_rate", "run_id": "run_id",
        "bootstrap_servers": "bootstrap_servers", "topic": "topic", "partitions": "partitions",
        "lake_root": "lake_root",
    }  # fmt: skip
    overrides: dict[str, Any] = {
        field: getattr(args, arg) for arg, field in names.items()
        if getattr(args, arg, None) is not None
    }  # fmt: skip
    if getattr(args, "no_scenarios", False):
        overrides["scenarios"] = []
    if getattr(args, "rate_of", None):
        rates = _pairs(args.rate_of, "--rate-of")
        try:
            overrides["scenario_rates"] = {k: float(v) for k, v in rates.items()}
        except ValueError:
            raise ConfigError(f"--rate-of expects SCENARIO=NUMBER, got {args.rate_of}") from None
    if getattr(args, "no_ground_truth", False):
        overrides["write_ground_truth"] = False
    settings = load_settings(SimulatorSettings, **overrides)
    if getattr(args, "kafka_option", None):
        options = {**settings.kafka_options, **_pairs(args.kafka_option, "--kafka-option")}
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


def cmd_simulate(args: argparse.Namespace) -> int:
    settings = settings_from(args)
    registry = load_or_create_registry(settings)
    if args.out:
        # Files carry no key, and a text reader replaces invalid UTF-8: those two kinds of
        # malformed message would arrive as valid events there.
        reasons = [r for r in settings.malformed_reasons if r not in _KAFKA_ONLY_REASONS]
        settings = settings.model_copy(update={"malformed_reasons": reasons})
        sim = Simulation(settings, registry, start_time=settings.start_time)
        seconds = args.sim_seconds or 3600.0
        files = write_jsonl(sim.batches(sim_seconds=seconds, count=settings.count or None),
                            args.out)  # fmt: skip
        rows = sim.finish(sim.cut_at)
        if settings.write_ground_truth:
            from simulator.scenarios import write_ground_truth

            write_ground_truth(rows, settings.lake_root)
        print(f"wrote {len(files)} JSON-lines files to {args.out}; {len(rows)} injections")
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
            settings, sim, stop=stop, progress=None if args.no_progress else _progress
        )
    print(stats.line(), flush=True)
    if stats.first_error:
        print(f"first delivery error: {stats.first_error}", file=sys.stderr)
    return 0 if stats.failures == 0 and stats.queued == 0 else 1


def cmd_replay(args: argparse.Namespace) -> int:
    from simulator.replay import guess_device_type, parse_mapping, replay

    settings = settings_from(args)
    try:
        mapping = parse_mapping(args.map)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    check_producer_options(settings)
    ensure_topic(admin_config(settings), settings.topic, settings.partitions,
                 settings.replication_factor)  # fmt: skip
    stats = RunStats()
    sender = Sender(producer_config(settings), settings.topic, stats)
    with stop_on_signals() as stop:
        report = replay(
            args.file,
            lambda key, value: sender.send([key], [value]),
            mapping=mapping,
            speed=args.speed,
            stop=stop.is_set,
        )
    sender.flush()
    print(f"replayed {report.sent:,} events from {args.file}; rejected {report.rejected:,} rows")
    for row in report.examples:
        print(f"  line {row.line}: {row.reason}: {row.raw}", file=sys.stderr)
    if args.register and report.devices:
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
        print(f"registered {len(rows)} new devices")
    if stats.failures or stats.queued:
        print(f"delivery failures: {stats.failures}, undelivered: {stats.queued}", file=sys.stderr)
        return 1
    return 1 if report.rejected else 0


def cmd_registry(args: argparse.Namespace) -> int:
    settings = settings_from(args)
    if args.action == "create":
        table = reg.build_registry(settings.devices, settings.seed)
        reg.write_registry(table, settings.lake_root)
        print(f"registry: {table.num_rows:,} devices written under {settings.lake_root}")
        return 0
    seed = args.seed if args.seed is not None else int(datetime.now().timestamp())
    try:
        changed = reg.change_devices(settings.lake_root, args.count, seed)
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"registry: {changed.num_rows} devices changed")
    for row in changed.select(["device_id", "owner", "status", "site_address"]).to_pylist():
        print("  " + json.dumps(row))
    return 0


def firmware_update(device_id: str, firmware: str, at: datetime) -> bytes:
    """An authorized-update message (``infra.contract.FIRMWARE_UPDATE_FIELDS``)."""
    authorized_at = at.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")
    update_id = hashlib.sha256(f"{device_id}|{firmware}|{authorized_at}".encode()).hexdigest()
    body = {"update_id": update_id[:32], "device_id": device_id, "firmware": firmware,
            "authorized_at": authorized_at}  # fmt: skip
    return json.dumps(body).encode()


def cmd_firmware(args: argparse.Namespace) -> int:
    from confluent_kafka import Producer

    settings = settings_from(args)
    if not settings.firmware_topic:
        raise ConfigError("IOT_FIRMWARE_TOPIC is empty: set it to the topic of authorized updates")
    try:
        at = datetime.fromisoformat(args.at) if args.at else datetime.now(timezone.utc)
    except ValueError:
        raise ConfigError(f"--at expects an ISO-8601 time, got {args.at!r}") from None
    at = at if at.tzinfo else at.replace(tzinfo=timezone.utc)
    check_producer_options(settings)
    ensure_topic(admin_config(settings), settings.firmware_topic, 1, settings.replication_factor)
    producer = Producer(producer_config(settings))
    producer.produce(settings.firmware_topic, key=args.device_id.encode(),
                     value=firmware_update(args.device_id, args.firmware, at))  # fmt: skip
    if producer.flush(30):
        print(f"error: the update was not delivered to {settings.bootstrap_servers}",
              file=sys.stderr)  # fmt: skip
        return 1
    print(f"authorized firmware {args.firmware} on {args.device_id} at {at.isoformat()}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure_logging(args.verbose)
    commands = {"simulate": cmd_simulate, "replay": cmd_replay, "registry": cmd_registry,
                "firmware": cmd_firmware}  # fmt: skip
    try:
        return commands[args.command](args)
    except SetupError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
