"""Telemetry generation, Kafka-free: the API the pipeline, the model trainer and the producer use.

Stable public API::

    from simulator.registry import build_registry
    from simulator.settings import SimulatorSettings
    from simulator.telemetry import Simulation, write_jsonl

    settings = SimulatorSettings(devices=200, seed=7, scenario_rate=30)
    start = datetime(2026, 1, 5, tzinfo=timezone.utc)
    sim = Simulation(settings, build_registry(200, seed=7), start_time=start)
    sim.inject("flood", device_id="dev-000003", start_s=60, duration_s=900)   # optional, explicit
    for batch in sim.batches(sim_seconds=3600):       # one simulated hour
        batch.keys, batch.values                       # list[bytes], list[bytes], in send order
        batch.tags                                     # scenario code per message (0 = clean)
        batch.labels                                   # {position: quarantine reason} (malformed)
    rows = sim.finish()                                # every GroundTruthRow, open ones clipped
    write_jsonl(sim2.batches(sim_seconds=3600), "landing/")   # or JSON-lines files

The simulated clock starts at ``start_time`` (default: now) and advances by slices; devices report
at a steady interval (10-30 s) with daily cycles and bounded noise (``simulator.fleet``), and the
running scenarios (``simulator.scenarios``) change them. Same settings, registry, start time and
slice sizes give the same messages byte for byte.
"""

from __future__ import annotations

import itertools
import logging
import os
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from infra import contract as c
from simulator import scenarios as sc
from simulator.events import Events, clamp_to_contract, encode, uuid4_rows
from simulator.fleet import Fleet, first_seq, signals
from simulator.settings import SimulatorSettings

log = logging.getLogger(__name__)


@dataclass
class Batch:
    """Messages of one slice of simulated time, in send order (readings an injection withholds,
    ``Scenario.withholds``, are not among them: one message is not always one reading)."""

    keys: list[bytes]
    values: list[bytes]
    send_times: np.ndarray  # simulated seconds since the start, one per message
    tags: np.ndarray  # int8: 0 clean, else infra.contract.SCENARIOS[tag - 1]
    labels: dict[int, str]  # position -> quarantine reason of each malformed message
    start_s: float
    end_s: float
    ground_truth: list[sc.GroundTruthRow] = field(default_factory=list)
    # The injections behind ``ground_truth``: re-closed by ``Simulation.finish`` if never sent.
    ended: list[sc.Scenario] = field(default_factory=list, repr=False)

    def __len__(self) -> int:
        return len(self.values)

    def scenario_of(self, position: int) -> str | None:
        tag = int(self.tags[position])
        return c.SCENARIOS[tag - 1] if tag else None

    def head(self, n: int) -> Batch:
        """The first ``n`` messages (the whole ground truth)."""
        return replace(
            self,
            keys=self.keys[:n],
            values=self.values[:n],
            send_times=self.send_times[:n],
            tags=self.tags[:n],
            labels={i: r for i, r in self.labels.items() if i < n},
        )


class Simulation:
    """A seeded fleet sending telemetry with injected scenarios, slice by slice (no Kafka)."""

    def __init__(
        self,
        settings: SimulatorSettings,
        registry: pa.Table,
        *,
        start_time: datetime | None = None,
        run_id: str | None = None,
    ) -> None:
        self.settings = settings
        self.rng = np.random.default_rng(settings.seed)
        start = start_time or settings.start_time or datetime.now(timezone.utc)
        self.start_time = sc.utc(start)
        self.fleet = Fleet(registry, settings, self.rng, first_seq=first_seq(self.start_time))
        self.start_epoch = self.start_time.timestamp()
        self.start_ms = round(self.start_epoch * 1000)
        self.run_id = run_id or settings.run_id or str(uuid.uuid4())
        self.t = 0.0
        self.active: list[sc.Scenario] = []
        self.ground_truth: list[sc.GroundTruthRow] = []
        self._busy: set[int] = set()
        self._injections = 0
        # Send time of the last message kept when ``batches(count=...)`` cut a batch short.
        self.cut_at: float | None = None

    @property
    def now(self) -> datetime:
        """The simulated clock."""
        return self.start_time + timedelta(seconds=self.t)

    @property
    def natural_rate(self) -> float:
        """Clean events per simulated second of the whole fleet."""
        live = self.fleet.live_from == -np.inf
        return float((1.0 / self.fleet.params["interval"][live]).sum())

    def default_slice_s(self) -> float:
        """The slice that yields about ``settings.batch_events`` events."""
        return float(np.clip(self.settings.batch_events / max(self.natural_rate, 1e-9), 0.5, 600))

    # --- scenarios -------------------------------------------------------------------------------
    def inject(
        self,
        scenario: str,
        *,
        device_id: str | None = None,
        start_s: float | None = None,
        duration_s: float | None = None,
        **params: Any,
    ) -> sc.Scenario:
        """Schedule one injection explicitly (tests, demos); random parts come from the seed.

        ``params`` override the parameters the kind would draw.
        """
        kind = sc.KINDS.get(scenario)
        if kind is None:
            raise ValueError(f"unknown scenario {scenario!r}")
        start = self.t if start_s is None else float(start_s)
        duration = duration_s or kind.lasts(self.rng, self.settings)
        dev = kind.device(self.fleet, self.rng, self._busy, device_id)
        place = sc.Placement(self.fleet.device_type(dev), self.settings, start)
        chosen = {**kind.choose(self.rng, place), **params}
        self._injections += 1
        injection = kind(
            scenario_id=str(uuid.UUID(bytes=self.rng.bytes(16), version=4)),
            dev=dev,
            start=start,
            end=start + duration,
            index=self._injections,
            params=chosen,
        )
        injection.prepare(self.fleet)
        self.active.append(injection)
        self._busy.add(dev)
        log.debug("inject %s on %s at %.0f s", scenario, self.fleet.ids[dev], start)
        return injection

    def _plan(self, t0: float, t1: float) -> None:
        """Inject the scenarios that start in ``[t0, t1)``: a Poisson number of each kind."""
        per_thousand = self.fleet.n_registered / 1000.0
        # In the contract's order: the random draws, so the whole run, follow it.
        for scenario in c.SCENARIOS:
            rate = self.settings.rate_of(scenario) * per_thousand
            if rate <= 0:
                continue
            for _ in range(int(self.rng.poisson(rate * (t1 - t0) / 3600.0))):
                start = float(self.rng.uniform(t0, t1))
                if not sc.KINDS[scenario].may_start(start, self.settings):
                    continue
                try:
                    self.inject(scenario, start_s=start)
                except ValueError:
                    log.debug("no free device for %s; skipped", scenario)

    # --- generation ------------------------------------------------------------------------------
    def next_batch(self, slice_s: float | None = None) -> Batch:
        """Generate the messages of the next ``slice_s`` simulated seconds."""
        t0 = self.t
        t1 = t0 + (slice_s or self.default_slice_s())
        self._plan(t0, t1)
        running = [s for s in self.active if s.overlaps(t0, t1)]
        events, power_factor = self._readings(running, t0, t1)
        self._apply(running, events, power_factor)
        events = events.take(np.argsort(events.t, kind="stable"))
        keys: list[bytes] = self.fleet.keys[events.dev].tolist()
        values = encode(
            events,
            type_code=self.fleet.type_code,
            device_ids=self.fleet.id_rows(),
            firmware_table=self.fleet.firmware_rows(),
            start_ms=self.start_ms,
            event_ids=uuid4_rows(self.rng, len(events)),
        )
        events, keys, values, withheld = _withhold(running, events, keys, values)
        now = sc.Slice(
            t0, t1, self.fleet, self.rng, self.start_epoch, events, keys, values, withheld
        )
        batch = _with_messages(now, self._messages(running, now))
        self.t = t1
        batch.ended = [s for s in self.active if s.end <= t1]
        self.active = [s for s in self.active if s.end > t1]
        batch.ground_truth = [self._record(s, s.end) for s in batch.ended]
        return batch

    def _readings(
        self, running: list[sc.Scenario], t0: float, t1: float
    ) -> tuple[Events, np.ndarray]:
        """The slice's readings, clean and numbered, with each one's true power factor."""
        dev, t = self.fleet.schedule(t0, t1)
        parts = [(dev, t, np.full(dev.size, -1, np.int64))]
        for scenario in running:
            extra = scenario.extra_reports(self.fleet, t0, t1)
            if extra is not None:
                parts.append(extra)
        dev = np.concatenate([p[0] for p in parts])
        t = np.concatenate([p[1] for p in parts])
        clone = np.concatenate([p[2] for p in parts])
        metrics, lat, lon, power_factor = signals(self.fleet, dev, t, self.start_epoch, self.rng)
        events = Events(
            dev=dev,
            t=t,
            t_event=t.copy(),
            lat=lat,
            lon=lon,
            metrics=metrics,
            firmware=self.fleet.firmware[dev],
            seq=np.zeros(dev.size, np.int64),
            tag=np.zeros(dev.size, np.int8),
            clone=clone,
        )
        self._number(running, events)
        return events, power_factor

    def _number(self, running: list[sc.Scenario], events: Events) -> None:
        """Per-device seq counting up by 1 in time order; a scenario numbers its own readings."""
        own = np.flatnonzero(events.clone < 0)
        order = own[np.lexsort((events.t[own], events.dev[own]))]
        devs = events.dev[order]
        counts = np.bincount(devs, minlength=len(self.fleet))
        first = np.cumsum(counts) - counts
        rank = np.arange(order.size) - first[devs]
        events.seq[order] = self.fleet.seq[devs] + rank + 1
        for scenario in running:
            scenario.number(events, int(self.fleet.seq[scenario.dev]))
        self.fleet.seq += counts

    def _apply(self, running: list[sc.Scenario], events: Events, power_factor: np.ndarray) -> None:
        """The running scenarios' effects on the readings, then the contract's valid ranges."""
        by_device = np.argsort(events.dev, kind="stable")
        sorted_devices = events.dev[by_device]
        for scenario in running:
            lo, hi = np.searchsorted(sorted_devices, [scenario.dev, scenario.dev + 1])
            scenario.apply(events, by_device[lo:hi], power_factor)
        clamp_to_contract(events)

    def _messages(self, running: list[sc.Scenario], now: sc.Slice) -> list[sc.Message]:
        """The messages the running scenarios send on their own, kind by kind in ``KINDS`` order
        (the order of messages sent at the same time, and of the random draws)."""
        out: list[sc.Message] = []
        for kind in sc.KINDS.values():
            mine = [s for s in running if type(s) is kind]
            if mine:
                out += kind.messages(mine, now)
        return out

    def _record(self, scenario: sc.Scenario, until_s: float) -> sc.GroundTruthRow:
        self._busy.discard(scenario.dev)
        device_id = str(self.fleet.ids[scenario.dev])
        row = scenario.ground_truth_row(device_id, self.start_time, until_s, self.run_id)
        self.ground_truth.append(row)
        return row

    def finish(
        self, until_s: float | None = None, *, unsent: Iterable[Batch] = ()
    ) -> list[sc.GroundTruthRow]:
        """Close the injections still running, clipped to ``until_s`` (default: the clock).

        Pass the send time of the last message actually sent when a batch was cut short, and
        as ``unsent`` the batches generated but never sent (a producer that generates ahead):
        the injections that ended in them are closed at ``until_s`` too, or dropped when they
        start after it. Returns every ground-truth row so far.
        """
        until = self.t if until_s is None else min(until_s, self.t)
        reopened = [s for batch in unsent for s in batch.ended]
        ids = {s.scenario_id for s in reopened}
        self.ground_truth = [row for row in self.ground_truth if row.scenario_id not in ids]
        for scenario in reopened + self.active:
            if scenario.start < until:
                self._record(scenario, until)
        self.active = []
        return list(self.ground_truth)

    def batches(
        self,
        *,
        sim_seconds: float | None = None,
        count: int | None = None,
        slice_s: float | None = None,
    ) -> Iterator[Batch]:
        """Batches until ``sim_seconds`` of simulated time or ``count`` messages (last one cut)."""
        end = None if sim_seconds is None else self.t + sim_seconds
        sent = 0
        while end is None or self.t < end - 1e-9:
            step = slice_s or self.default_slice_s()
            if end is not None:
                step = min(step, end - self.t)
            batch = self.next_batch(step)
            if count is not None and sent + len(batch) >= count:
                cut = batch.head(count - sent)
                self.cut_at = float(cut.send_times[-1]) if len(cut) else batch.start_s
                yield cut
                return
            sent += len(batch)
            yield batch


def _withhold(
    running: list[sc.Scenario], events: Events, keys: list[bytes], values: list[bytes]
) -> tuple[Events, list[bytes], list[bytes], list[sc.Withheld]]:
    """The encoded readings without those the running injections withhold (``withholds``:
    their device's own readings of the window), and those, time-ordered, as ``Withheld``."""
    holders = [s for s in running if s.withholds]
    if not holders:
        return events, keys, values, []
    # One pass over the slice for all their devices, then one over those readings per injection.
    theirs = np.flatnonzero(np.isin(events.dev, [s.dev for s in holders]))
    held = np.zeros(len(events), bool)
    withheld: list[sc.Withheld] = []
    for scenario in holders:
        idx = scenario.readings(events, theirs[events.dev[theirs] == scenario.dev])
        idx = idx[~held[idx]]
        if not idx.size:
            continue
        held[idx] = True
        scenario.withheld += int(idx.size)
        times = events.t[idx].tolist()
        withheld += [
            sc.Withheld(scenario, t, keys[i], values[i])
            for i, t in zip(idx.tolist(), times, strict=True)
        ]
    if not withheld:
        return events, keys, values, []
    withheld.sort(key=lambda w: w.send_s)
    sent = ~held
    mask = sent.tolist()
    return (
        events.take(np.flatnonzero(sent)),
        list(itertools.compress(keys, mask)),
        list(itertools.compress(values, mask)),
        withheld,
    )


def _with_messages(now: sc.Slice, messages: list[sc.Message]) -> Batch:
    """The batch of a slice: its readings in send order, the scenarios' own messages among them."""
    events = now.events
    batch = Batch(
        keys=now.keys,
        values=now.values,
        send_times=events.t,
        tags=events.tag,
        labels={},
        start_s=now.t0,
        end_s=now.t1,
    )
    if not messages:
        return batch
    # The few messages are spliced into the time-ordered readings (after the readings sent at
    # the same time, like a stable sort), not sorted with them: re-ordering the batch as Python
    # objects cost more than all the messages.
    first = np.argsort(np.asarray([m.send_s for m in messages]), kind="stable")
    ordered = [messages[i] for i in first]
    send_at = np.asarray([m.send_s for m in ordered])
    at = np.searchsorted(events.t, send_at, side="right")
    batch.keys = _splice(now.keys, at, [m.key for m in ordered])
    batch.values = _splice(now.values, at, [m.value for m in ordered])
    batch.send_times = np.insert(events.t, at, send_at)
    batch.tags = np.insert(events.tag, at, np.asarray([m.scenario.code for m in ordered], np.int8))
    batch.labels = {
        int(position): m.label
        for position, m in zip(at + np.arange(at.size), ordered, strict=True)
        if m.label is not None
    }
    return batch


def _splice(items: list[bytes], at: np.ndarray, extra: list[bytes]) -> list[bytes]:
    """``items`` with ``extra[j]`` inserted before ``items[at[j]]`` (``at`` ascending)."""
    out: list[bytes] = []
    done = 0
    for position, item in zip(at.tolist(), extra, strict=True):
        out += items[done:position]
        out.append(item)
        done = position
    out += items[done:]
    return out


def write_jsonl(
    batches: Iterable[Batch], folder: str | os.PathLike[str], *, events_per_file: int = 100_000
) -> list[Path]:
    """Write message values as JSON-lines files (one message a line) into ``folder``.

    Files appear atomically (written under a dot-name, then renamed) so a streaming file source
    never reads half a file. Keys are not written: generate with ``malformed_reasons`` without
    key_mismatch for files. Returns the files written, in order.
    """
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    buffer: list[bytes] = []
    for batch in batches:
        for value in batch.values:
            buffer.append(value)
            if len(buffer) >= events_per_file:
                written.append(_write_file(out, len(written), buffer))
                buffer = []
    if buffer:
        written.append(_write_file(out, len(written), buffer))
    return written


def _write_file(folder: Path, number: int, lines: list[bytes]) -> Path:
    """One JSON-lines file, written under a dot-name and renamed into place."""
    final = folder / f"telemetry-{number:06d}-{uuid.uuid4().hex[:8]}.jsonl"
    tmp = folder / f".{final.name}.tmp"
    tmp.write_bytes(b"\n".join(lines) + b"\n")
    tmp.rename(final)
    return final
