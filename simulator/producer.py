"""Send simulated telemetry to Kafka: idempotent producer, rate control, clean stop.

``run_simulation(settings, sim, stop=...)`` drives a ``Simulation`` into the topic and returns
``RunStats``. Pacing: with ``rate`` > 0 a token bucket holds the send rate; otherwise the simulated
clock runs ``accelerate`` times wall time (0 = as fast as possible). Delivery reports are only
raised for failures (``delivery.report.only.error``), so the hot loop pays no Python callback per
message; delivered = sent - failures - still queued after the final flush.
"""

from __future__ import annotations

import itertools
import logging
import operator
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from itertools import repeat
from typing import Any

import numpy as np
from confluent_kafka import KafkaError, KafkaException, Producer

from infra.errors import ConfigError
from infra.kafka_client import librdkafka_options
from simulator.scenarios import GroundTruthRow, write_ground_truth
from simulator.settings import SimulatorSettings, redact
from simulator.telemetry import Batch, Simulation

log = logging.getLogger(__name__)
# librdkafka's own lines (a broker that cannot be reached, ...) go to Python's logging, so to the
# log file, not straight to the terminal; the simulator reports failed deliveries itself.
RDKAFKA_LOG = logging.getLogger("librdkafka")

PRODUCER_DEFAULTS: dict[str, Any] = {
    "enable.idempotence": True,
    "acks": "all",
    "linger.ms": 20,
    "batch.size": 1_000_000,
    "compression.type": "lz4",
    "queue.buffering.max.messages": 500_000,
    "queue.buffering.max.kbytes": 1_048_576,
    "delivery.report.only.error": True,
}
GROUND_TRUTH_EVERY_S = 10.0
SEND_CHUNK = 5000
PREFETCH_BATCHES = 2


def producer_config(settings: SimulatorSettings) -> dict[str, Any]:
    """Defaults, the ``IOT_KAFKA_*`` security options, then the user's librdkafka options (which
    win), then the bootstrap servers. Holds the password: never log it."""
    conf: dict[str, Any] = dict(PRODUCER_DEFAULTS)
    conf.update(librdkafka_options(settings))
    conf.update(settings.kafka_options)
    conf["bootstrap.servers"] = settings.bootstrap_servers
    conf["logger"] = RDKAFKA_LOG
    return conf


def admin_config(settings: SimulatorSettings) -> dict[str, Any]:
    return {
        **librdkafka_options(settings),
        **settings.kafka_options,
        "bootstrap.servers": settings.bootstrap_servers,
        "logger": RDKAFKA_LOG,
    }


class TokenBucket:
    """``rate`` tokens a second, at most ``burst`` saved up; ``acquire`` sleeps until enough."""

    def __init__(
        self,
        rate: float,
        burst: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.rate = rate
        # Half a second of saved tokens lets the sender catch up after the OS pauses it, so the
        # rate over a minute stays on target on a busy machine.
        self.burst = burst if burst is not None else max(1.0, rate * 0.5)
        self.clock = clock
        self.sleep = sleep
        self.tokens = 0.0
        self.last = clock()

    def acquire(self, n: float) -> float:
        """Take ``n`` tokens (sleeping as needed); returns the seconds slept."""
        now = self.clock()
        self.tokens = min(self.burst, self.tokens + (now - self.last) * self.rate)
        self.last = now
        self.tokens -= n
        if self.tokens >= 0:
            return 0.0
        # Debt is paid by sleeping; the bucket goes back to zero, so the long-run rate is exact.
        # It is even at the moment the debt is paid, not when the sleep returns: a sleep that
        # ends late (a busy machine) leaves the tokens of the overrun to the next call.
        wait = -self.tokens / self.rate
        self.sleep(wait)
        self.tokens = 0.0
        self.last = now + wait
        return wait


@dataclass
class RunStats:
    """What a run sent; ``delivered`` is known after the final flush."""

    sent: int = 0
    failures: int = 0
    queued: int = 0
    elapsed_s: float = 0.0
    flush_s: float = 0.0
    injections: int = 0
    sim_start: datetime | None = None
    sim_end: datetime | None = None
    first_error: str | None = None
    stopped_by: str = "end"
    partitions: dict[int, int] = field(default_factory=dict)

    @property
    def delivered(self) -> int:
        return self.sent - self.failures - self.queued

    @property
    def rate(self) -> float:
        return self.sent / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def line(self) -> str:
        return (
            f"sent {self.sent:,} | delivered {self.delivered:,} | failures {self.failures:,} | "
            f"{self.rate:,.0f} msg/s over {self.elapsed_s:.1f} s (+{self.flush_s:.1f} s flush) | "
            f"injections {self.injections} | "
            f"stopped by {self.stopped_by}"
        )


class Sender:
    """A confluent-kafka Producer with failure counting and BufferError back-pressure."""

    def __init__(self, conf: dict[str, Any], topic: str, stats: RunStats) -> None:
        self.topic = topic
        self.stats = stats
        self.producer = Producer({**conf, "on_delivery": self._on_delivery})

    def _on_delivery(self, err: KafkaError | None, _msg: Any) -> None:
        if err is not None:
            self.stats.failures += 1
            if self.stats.first_error is None:
                self.stats.first_error = str(err)
                log.error("delivery failed: %s", err)

    def send(self, keys: list[bytes], values: list[bytes]) -> None:
        """Produce every message (in order), polling between chunks of ``SEND_CHUNK``."""
        produce = self.producer.produce
        poll = self.producer.poll
        topic = self.topic
        n = len(values)
        i = 0
        while i < n:
            hi = min(n, i + SEND_CHUNK)
            pending = iter(values[i:hi])
            try:
                # map() runs the produce calls without a Python loop body, which is faster.
                deque(map(produce, repeat(topic), pending, keys[i:hi]), maxlen=0)
            except BufferError:
                # Local queue full: the value that failed was taken from ``pending`` already.
                i = hi - operator.length_hint(pending) - 1
                poll(0.05)
                continue
            i = hi
            poll(0)
        self.stats.sent += n

    def flush(self, timeout_s: float = 60.0) -> int:
        remaining: int = self.producer.flush(timeout_s)
        self.stats.queued = remaining
        return remaining

    def queue_length(self) -> int:
        return len(self.producer)

    def close(self) -> None:
        """Destroy the client once all was delivered, so it stops reconnecting to the broker.

        With messages still queued (counted undelivered by ``flush``) it is left to the process's
        exit: ``Producer.close`` would wait for them.
        """
        if self.queue_length() == 0:
            self.producer.close()


def default_start(settings: SimulatorSettings, natural_rate: float, now: datetime) -> datetime:
    """Start of the simulated clock: given, or so that a run with a known end ends when it ends.

    A run that simulates ``span`` seconds in ``wall`` seconds starts ``span - wall`` before now:
    the simulated clock catches up with the wall clock at the end, and never runs ahead of it,
    where the pipeline quarantines events. A real-time run starts now (``span == wall``), and so
    does a run whose span is not known in advance: an open-ended one, or one at full speed
    (``accelerate`` 0) bounded only by ``duration``, which runs ahead of the wall clock (give it
    ``start_time`` to feed a pipeline). A full-speed run with a ``count`` ends near now.
    """
    if settings.start_time is not None:
        return settings.start_time
    span = wall = 0.0
    if settings.rate > 0 and natural_rate > 0:
        if settings.count:
            span, wall = settings.count / natural_rate, settings.count / settings.rate
        elif settings.duration:
            span, wall = settings.duration * settings.rate / natural_rate, settings.duration
    elif settings.accelerate != 1.0:
        if settings.count:
            span = settings.count / max(natural_rate, 1e-9)
            wall = span / settings.accelerate if settings.accelerate > 0 else 0.0
        elif settings.duration and settings.accelerate > 0:
            span, wall = settings.duration * settings.accelerate, settings.duration
    return now - timedelta(seconds=max(0.0, span - wall))


def runs_ahead_of_wall_clock(settings: SimulatorSettings, natural_rate: float) -> bool:
    """True when the simulated clock will pass the wall clock: faster than real time, with no
    ``start_time`` and a span that ``default_start`` cannot know (no ``count``, and a
    ``duration`` only at full speed)."""
    if settings.rate > 0:  # the token bucket sets the pace; accelerate is not used
        faster = settings.rate > natural_rate
    else:
        faster = settings.accelerate == 0 or settings.accelerate > 1.0
    paced = settings.rate > 0 or settings.accelerate > 0
    span_known = bool(settings.count) or (bool(settings.duration) and paced)
    return faster and settings.start_time is None and not span_known


def run_simulation(
    settings: SimulatorSettings,
    sim: Simulation,
    *,
    stop: threading.Event | None = None,
    progress: Callable[[RunStats, Simulation, bool], None] | None = None,
    sender: Sender | None = None,
) -> RunStats:
    """Generate and send until ``duration``, ``count`` or ``stop``; flush; write ground truth.

    ``progress(stats, sim, final)`` is called every ``progress_interval_s`` and once at the end.
    """
    stats = RunStats(sim_start=sim.now)
    log.info(
        "producing to %s on %s (%s%s) with %s",
        settings.topic,
        settings.bootstrap_servers,
        settings.kafka_security_protocol,
        f" as {settings.kafka_sasl_username}" if settings.kafka_sasl_username else "",
        redact({k: str(v) for k, v in settings.kafka_options.items()}),
    )
    own_sender = sender is None
    sender = sender or Sender(producer_config(settings), settings.topic, stats)
    sender.stats = stats
    run = _Run(settings, sim, sender, stop or threading.Event(), progress)
    # Generation runs one or two batches ahead in a thread, overlapping with produce calls
    # (numpy releases the GIL); the sequence of batches is the same as without it.
    prefetch = _Prefetch(sim, run.pacer.slice_s, settings.count)
    try:
        run.send_batches(prefetch)
    finally:
        # The rate is that of sending; the final flush is reported on its own.
        stats.elapsed_s = time.monotonic() - run.t_begin
        unsent = prefetch.close()
        flush_started = time.monotonic()
        sender.flush()
        stats.flush_s = time.monotonic() - flush_started
        if own_sender:
            sender.close()
        run.close_ground_truth(unsent)
        stats.sim_end = sim.now
        if progress is not None:
            progress(stats, sim, True)
    return stats


class _Pacer:
    """When each chunk of a batch may be sent: a token bucket holds ``rate``, or the simulated
    clock runs ``accelerate`` times wall time, or (neither) as fast as possible."""

    def __init__(self, settings: SimulatorSettings, sim: Simulation) -> None:
        self.rate = settings.rate
        self.bucket = TokenBucket(settings.rate) if settings.rate > 0 else None
        self.accelerate = settings.accelerate if self.bucket is None else 0.0
        natural = max(sim.natural_rate, 1e-9)
        # Short slices when paced, so the first messages go out soon and the pace stays even.
        if self.bucket is not None:
            self.slice_s = min(sim.default_slice_s(), max(0.05, settings.rate * 0.25 / natural))
        elif self.accelerate > 0:
            self.slice_s = min(sim.default_slice_s(), max(0.05, self.accelerate * 0.5))
        else:
            self.slice_s = sim.default_slice_s()

    def chunks(self, batch: Batch) -> list[tuple[int, int]]:
        """(first, end) positions of the non-empty chunks of ``batch``, each paced on its own:
        20 ms of the rate, or 50 ms of wall time on the simulated clock."""
        n = len(batch)
        if self.bucket is not None:
            step = max(1, int(self.rate * 0.02))
            bounds = [*range(0, n, step), n]
        elif self.accelerate > 0:
            edges = np.arange(batch.start_s, batch.end_s, 0.05 * self.accelerate)
            bounds = sorted({0, n, *np.searchsorted(batch.send_times, edges).tolist()})
        else:
            bounds = [0, n]
        return [(lo, hi) for lo, hi in itertools.pairwise(bounds) if hi > lo]


class _Run:
    """One ``run_simulation``: its clock, when it stops, and the ground truth still to write."""

    def __init__(
        self,
        settings: SimulatorSettings,
        sim: Simulation,
        sender: Sender,
        stop: threading.Event,
        progress: Callable[[RunStats, Simulation, bool], None] | None,
    ) -> None:
        self.settings = settings
        self.sim = sim
        self.sender = sender
        self.stats = sender.stats
        self.stop = stop
        self.progress = progress
        self.pacer = _Pacer(settings, sim)
        self.t_begin = time.monotonic()
        self.sim_begin = sim.t
        self.deadline = self.t_begin + settings.duration if settings.duration else None
        self.next_progress = self.t_begin + settings.progress_interval_s
        self.next_truth = self.t_begin + GROUND_TRUTH_EVERY_S
        self.pending_truth: list[GroundTruthRow] = []
        self.taken: set[str] = set()  # scenario ids of the ground truth counted so far
        self.last_sent: float | None = None  # send time of the last message sent

    def send_batches(self, prefetch: _Prefetch) -> None:
        """Take batches and send them until a stop condition; ``stats.stopped_by`` says which."""
        stats, count = self.stats, self.settings.count
        while True:
            if self.stop.is_set():
                stats.stopped_by = "signal"
                return
            if self._past_deadline():
                stats.stopped_by = "duration"
                return
            if count and stats.sent >= count:
                stats.stopped_by = "count"
                return
            batch = prefetch.get()
            if count and stats.sent + len(batch) > count:
                batch = batch.head(count - stats.sent)
            self._add_truth(batch.ground_truth)
            if not self._send(batch):
                stats.stopped_by = "signal" if self.stop.is_set() else "duration"
                return
            if time.monotonic() >= self.next_truth:
                self._write_truth()

    def _past_deadline(self) -> bool:
        return self.deadline is not None and time.monotonic() >= self.deadline

    def _send(self, batch: Batch) -> bool:
        """Send a batch chunk by chunk, pacing each; False when stopped part-way."""
        pacer = self.pacer
        for lo, hi in pacer.chunks(batch):
            if self.stop.is_set() or self._past_deadline():
                return False
            if pacer.bucket is not None:
                pacer.bucket.acquire(hi - lo)
            elif pacer.accelerate > 0:
                offset = float(batch.send_times[lo]) - self.sim_begin
                _sleep_until(self.t_begin + offset / pacer.accelerate, self.stop, self.deadline)
                if self.stop.is_set() or self._past_deadline():
                    return False
            self.sender.send(batch.keys[lo:hi], batch.values[lo:hi])
            self.last_sent = float(batch.send_times[hi - 1])
            self._report()
        return True

    def _report(self) -> None:
        now = time.monotonic()
        if self.progress is not None and now >= self.next_progress:
            self.stats.elapsed_s = now - self.t_begin
            self.stats.queued = self.sender.queue_length()
            self.progress(self.stats, self.sim, False)
            self.next_progress = now + self.settings.progress_interval_s

    def _add_truth(self, rows: list[GroundTruthRow]) -> None:
        self.taken.update(row.scenario_id for row in rows)
        self.stats.injections += len(rows)
        self.pending_truth.extend(rows)

    def _write_truth(self) -> None:
        if self.settings.write_ground_truth and self.pending_truth:
            write_ground_truth(self.pending_truth, self.settings.lake_root)
            self.pending_truth = []
            self.next_truth = time.monotonic() + GROUND_TRUTH_EVERY_S

    def close_ground_truth(self, unsent: list[Batch]) -> None:
        """Close the injections at the last message sent, wherever the run stopped (those that
        ended in batches generated ahead but never sent too), and write what is left."""
        until = self.last_sent if self.last_sent is not None else self.sim_begin
        rows = self.sim.finish(until, unsent=unsent)
        self._add_truth([row for row in rows if row.scenario_id not in self.taken])
        self._write_truth()


class _Prefetch:
    """Batches generated by a background thread, at most ``PREFETCH_BATCHES`` ahead."""

    def __init__(self, sim: Simulation, slice_s: float, count: int = 0) -> None:
        self.sim = sim
        self.slice_s = slice_s
        self.count = count
        self.queue: queue.Queue[Batch] = queue.Queue(maxsize=PREFETCH_BATCHES)
        self.done = threading.Event()
        self.error: BaseException | None = None
        self.held: Batch | None = None  # generated, waiting for room in the queue
        self.thread = threading.Thread(target=self._run, name="sim-generate", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        generated = 0
        try:
            while not self.done.is_set():
                if self.count and generated >= self.count:
                    return  # nothing beyond --count, so ground truth matches what was sent
                batch = self.held = self.sim.next_batch(self.slice_s)
                generated += len(batch)
                while not self.done.is_set():
                    try:
                        self.queue.put(batch, timeout=0.1)
                        self.held = None
                        break
                    except queue.Full:
                        continue
        except BaseException as exc:  # re-raised in the sending thread
            self.error = exc

    def get(self) -> Batch:
        while True:
            try:
                return self.queue.get(timeout=0.1)
            except queue.Empty:
                if self.error is not None:
                    raise self.error from None
                if not self.thread.is_alive() and self.queue.empty():
                    raise RuntimeError("the generator thread stopped") from None

    def close(self) -> list[Batch]:
        """Stop generating; return the batches generated but never taken, oldest first."""
        self.done.set()
        self.thread.join()
        unsent: list[Batch] = []
        while not self.queue.empty():
            unsent.append(self.queue.get_nowait())
        if self.held is not None:
            unsent.append(self.held)
        return unsent


def _sleep_until(due: float, stop: threading.Event, deadline: float | None) -> None:
    limit = due if deadline is None else min(due, deadline)
    wait = limit - time.monotonic()
    if wait > 0:
        stop.wait(wait)


def check_producer_options(settings: SimulatorSettings) -> None:
    """Fail at start, with the option named, when librdkafka rejects an option."""
    try:
        Producer(producer_config(settings))
    except KafkaException as exc:
        raise ConfigError(
            f"librdkafka rejected the client options (IOT_KAFKA_*, IOT_SIM_KAFKA_OPTIONS): {exc}"
        ) from None
