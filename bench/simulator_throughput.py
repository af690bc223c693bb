"""Simulator throughput: events/s delivered to a local Kafka broker by one process.

All scenarios are on.

Usage::

    .venv/bin/python bench/simulator_throughput.py [--devices 10000] [--seconds 20]

Starts its own broker (the real Apache Kafka jars, free ports, a temp folder) unless
KAFKA_BOOTSTRAP_SERVERS is set. Prints one result line, the broker's own count of the messages
in the topic (the sum of its partitions' end offsets, which must equal the delivered count), and
the generation-only rate.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path

from bench_broker import bench_broker

from infra.kafka_client import ensure_topic
from simulator.producer import run_simulation
from simulator.registry import build_registry
from simulator.settings import SimulatorSettings
from simulator.telemetry import Simulation


def generation_only(settings: SimulatorSettings, seconds: float) -> float:
    """Events/s of generation and encoding alone (no Kafka), for comparison."""
    registry = build_registry(settings.devices, settings.seed)
    sim = Simulation(settings, registry, start_time=datetime(2026, 1, 5, tzinfo=timezone.utc))
    sent = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        sent += len(sim.next_batch())
    return sent / (time.perf_counter() - start)


def messages_in_topic(bootstrap: str, topic: str, partitions: int) -> int:
    """The broker's count: sum of end offsets (the topic is new and written by one idempotent
    producer, so no message is counted twice)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4().hex}"})
    try:
        return sum(
            consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1]
            for p in range(partitions)
        )
    finally:
        consumer.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--devices", type=int, default=10_000)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--partitions", type=int, default=6)
    args = parser.parse_args()

    with (
        tempfile.TemporaryDirectory(prefix="simbench-") as tmp,
        bench_broker(Path(tmp) / "kafka") as bootstrap,
    ):
        topic = f"bench.sim.{uuid.uuid4().hex[:8]}"
        settings = SimulatorSettings(
            devices=args.devices,
            accelerate=0,
            duration=args.seconds,
            bootstrap_servers=bootstrap,
            topic=topic,
            lake_root=str(Path(tmp) / "lake"),
            partitions=args.partitions,
            start_time=datetime(2026, 1, 5, tzinfo=timezone.utc),
        )
        ensure_topic(
            {"bootstrap.servers": bootstrap},
            topic,
            args.partitions,
            settings.replication_factor,
        )
        registry = build_registry(settings.devices, settings.seed)
        sim = Simulation(settings, registry)
        stats = run_simulation(settings, sim, stop=threading.Event())
        total = stats.elapsed_s + stats.flush_s  # delivered means acknowledged: flush counts
        print(
            f"simulator -> kafka: {stats.delivered:,} events delivered in {total:.1f} s = "
            f"{stats.delivered / total:,.0f} events/s (failures {stats.failures}, "
            f"devices {settings.devices:,}, injections {stats.injections}, "
            f"all {len(settings.scenarios)} scenarios on)"
        )
        in_topic = messages_in_topic(bootstrap, topic, args.partitions)
        print(f"messages in the topic (broker's end offsets): {in_topic:,}")
        if in_topic != stats.delivered:
            print(f"MISMATCH: the producer counted {stats.delivered:,} delivered")
            return 1
        rate = generation_only(settings, min(args.seconds, 10.0))
        print(f"generation + JSON encoding only: {rate:,.0f} events/s")
        print(f"load average: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    return 0


if __name__ == "__main__":
    sys.exit(main())
