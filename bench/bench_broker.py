"""The Kafka broker a benchmark runs against: the one KAFKA_BOOTSTRAP_SERVERS names, or a fresh
local broker (free ports, in ``home``) that is stopped however the benchmark ends."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from infra.kafka import KafkaBroker
from infra.ports import free_port
from infra.settings import StackSettings


@contextmanager
def bench_broker(home: Path, heap: str = "1g") -> Iterator[str]:
    """Yield bootstrap servers; a broker started here is stopped on the way out."""
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if bootstrap:
        yield bootstrap
        return
    broker = KafkaBroker(home, StackSettings().cache_dir, port=free_port(),
                         controller_port=free_port(), heap=heap)  # fmt: skip
    broker.start()
    try:
        yield broker.bootstrap_servers
    finally:
        broker.stop()
