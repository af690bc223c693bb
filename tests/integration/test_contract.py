"""Contract test: the simulator's messages, parsed with the pipeline's parser, come out exactly
as labelled: clean and scenario events valid with no value lost, malformed ones quarantined with
the reason the simulator meant."""

from __future__ import annotations

import json
from collections import Counter
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from infra import contract as c
from pipeline.transforms import parse_events
from simulator.registry import build_registry
from simulator.settings import SimulatorSettings
from simulator.telemetry import Simulation

pytestmark = pytest.mark.integration


def test_simulator_output_parses_as_labelled(spark: Any) -> None:
    # Every scenario on, about 10 injections each in the half hour, plus explicit malformed ones.
    settings = SimulatorSettings(devices=150, seed=11, scenario_rate=130)
    start = datetime.now(timezone.utc).replace(microsecond=0) - timedelta(minutes=45)
    sim = Simulation(settings, build_registry(150, seed=11), start_time=start)
    for at in range(0, 1800, 300):
        sim.inject("malformed", start_s=at, duration_s=240)
    keys: list[str | None] = []
    values: list[bytes] = []
    labels: dict[int, str] = {}
    for batch in sim.batches(sim_seconds=1800):
        labels.update({len(values) + i: r for i, r in batch.labels.items()})
        keys += [k.decode() if k else None for k in batch.keys]
        values += batch.values
    assert labels, "the simulator injected no malformed messages"

    produced_at = datetime.now(timezone.utc).replace(microsecond=0)
    raw = spark.createDataFrame(
        [
            (k, v, "contract", 0, i, produced_at)
            for i, (k, v) in enumerate(zip(keys, values, strict=True))
        ],
        "key string, value binary, topic string, partition int, offset long, timestamp timestamp",
    )
    parsed = {r.offset: r for r in parse_events(raw).collect()}
    # A clock running ahead (clock_skew) more than a minute past the send time is quarantined,
    # so it cannot move the watermark: clock_ahead is the label such an event gets.
    for i, value in enumerate(values):
        if i not in labels:
            event_time = datetime.fromisoformat(json.loads(value)["event_time"])
            if event_time > produced_at + timedelta(minutes=1):
                labels[i] = c.REASON_CLOCK_AHEAD
    assert c.REASON_CLOCK_AHEAD in labels.values(), "no clock ran ahead: the check is idle"

    wrong = {i: (parsed[i].reason, labels.get(i)) for i in parsed
             if parsed[i].reason != labels.get(i)}  # fmt: skip
    assert not wrong, f"{len(wrong)} messages parsed differently than labelled, e.g. " + str(
        list(wrong.items())[:5]
    )
    assert set(Counter(labels.values())) >= {c.REASON_INVALID_JSON, c.REASON_MISSING_FIELD,
                                             c.REASON_WRONG_TYPE}  # fmt: skip

    lost = []
    for offset, parsed_row in parsed.items():
        if offset in labels:
            continue
        row = parsed_row.asDict()
        sent = json.loads(values[offset])
        sent_fields = {k: v for k, v in sent.items() if k != "metrics" and v is not None}
        sent_fields.update({m: v for m, v in (sent.get("metrics") or {}).items() if v is not None})
        lost += [(offset, name) for name in sent_fields if name in row and row[name] is None]
    assert not lost, f"values sent but parsed as null: {lost[:10]}"
