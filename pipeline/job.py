"""Wire sources, transforms and sinks into the streaming queries, and run them.

ingest:          source -> parse -> quarantine | dedup -> telemetry     (parse on the stream,
                 foreachBatch: dedup and appends)
detection:       source -> parse -> valid events, first copies (+ the ingest's duplicates and
                 flagging readings, a Delta stream of quarantine) -> registry join -> watermark
                 -> sliding windows -> rules and model -> alerts, features, feature_changes
                 (foreachBatch, update mode; appends of what changed)
firmware_ingest: firmware update topic -> parse -> quarantine | firmware_updates    (appends)
firmware:        firmware changes in telemetry LEFT JOIN firmware_updates (stream-stream,
                 watermarked) -> unauthorized -> firmware_tamper alerts (foreachBatch, MERGE)
fast_path:       source -> parse -> valid and flagging events -> registry join -> per-event
                 rules -> alerts topic   (Real-time Mode, Kafka sink; see ``pipeline.fastpath``)
fast_log:        alerts topic -> fast messages -> fast_alerts   (Delta sink, appends)
silence:         source -> who sent each record, when -> registry join -> per Kafka
                 partition, its own clock, event-time timers -> device_silent, late_burst
                 (foreachBatch, MERGE; see ``pipeline.silence``)

The firmware queries run with the Kafka source when IOT_FIRMWARE_TOPIC is set; the fast path in
live runs with an alerts topic (IOT_PIPELINE_FAST_PATH); the silence query unless
IOT_PIPELINE_SILENCE is off.

Ingest and detection read the topic each for itself. Detection so never waits for bronze to be
committed and read back (the path every alert but replay takes is one pass from Kafka); the
price is a second read and parse of each message (docs/PERFORMANCE.md measures it). Both
make the same per-record checks (``parse_events``) and call copies the same (see
``pipeline.transforms.first_copies``); a window counts the ingest's duplicates, and the
readings it quarantined out of range or with a clock ahead.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from infra import lake
from infra.errors import ConfigError
from infra.spark import ALERTS_POOL, INGEST_POOL, scheduler_pool
from pipeline.detection import FeaturesBatchWriter
from pipeline.fastpath import fast_alerts, fast_log_rows, fast_messages
from pipeline.features import feature_events, features_from_events, quarantine_feature_events
from pipeline.firmware import (
    FirmwareIngestWriter,
    TamperBatchWriter,
    firmware_changes,
    unauthorized_changes,
)
from pipeline.ingest import IngestBatchWriter
from pipeline.maintenance import Hold, apply_table_properties
from pipeline.metrics import MetricsListener, rocksdb_counts_rows
from pipeline.publish import (
    AlertPublisher,
    alert_publisher,
    client_config,
    ensure_output_topic,
)
from pipeline.registry import PinnedRegistry
from pipeline.rules import RuleThresholds
from pipeline.scoring import ModelScorer
from pipeline.settings import PipelineSettings, seconds
from pipeline.silence import (
    SILENCE_STATE_STORE,
    SilenceBatchWriter,
    silence_changes,
    silence_input,
)
from pipeline.sinks import discard_unstarted_batch, ensure_tables
from pipeline.sources import kafka_connection_options, kafka_source, raw_source
from pipeline.transforms import (
    events_and_flagged,
    first_copies,
    parse_events,
    senders,
    valid_events,
)
from pipeline.webhook import WebhookRelay

log = logging.getLogger(__name__)

INGEST = "ingest"
DETECTION = "detection"
FIRMWARE_INGEST = "firmware_ingest"
FIRMWARE = "firmware"
FAST_PATH = "fast_path"
FAST_LOG = "fast_log"
SILENCE = "silence"
STATE_STORE_CONF = "spark.sql.streaming.stateStore.providerClass"
# Failures that say nothing of the data or the set-up. When the silence query plans a batch,
# Spark starts a Python process to read its processor's state schema and waits a fixed 10 s for
# it to connect back (not configurable in Spark 4.2): an overloaded machine can miss that
# (docs/PERFORMANCE.md). Such a query starts again from its checkpoint, which makes it exactly
# once; the same failure again within RESTART_AFTER_S stops the pipeline.
TRANSIENT_FAILURES = ("Python worker failed to connect back",)
RESTART_AFTER_S = 600.0
# How often the pipeline looks for a new version of the registry (``pipeline.registry``).
REGISTRY_CHECK_S = 1.0
# How long a drained stop waits for a query's micro-batch to end (``Pipeline.finish_available``).
DRAIN_WAIT_S = 60.0
# How long the start waits for the queries' first triggers (``Pipeline.wait_until_running``).
FIRST_TRIGGER_WAIT_S = 180.0


def _past_first_trigger(query: StreamingQuery) -> bool:
    return query.lastProgress is not None or str(query.status["message"]).startswith("Waiting")


def trigger_interval(settings: PipelineSettings, query: str) -> str:
    """The processingTime interval micro-batch query ``query`` runs on (the fast path's
    Real-time Mode is not one: ``fast_path_checkpoint_interval``)."""
    intervals = {
        INGEST: settings.ingest_trigger_interval,
        DETECTION: settings.trigger_interval,
        SILENCE: settings.silence_trigger_interval,
        FIRMWARE_INGEST: settings.firmware_trigger_interval,
        FIRMWARE: settings.firmware_trigger_interval,
        FAST_LOG: settings.fast_path_log_interval,
    }
    return intervals[query]


def batch_bounds(settings: PipelineSettings) -> dict[str, int]:
    """The most telemetry messages a micro-batch of each query reading the telemetry takes
    (maxOffsetsPerTrigger, 0: none): its source's bound, and what the falling-behind warning
    names. Empty for the files source, whose batches are bounded in files."""
    if settings.source != "kafka":
        return {}
    return {
        query: settings.offsets_per_trigger(trigger_interval(settings, query))
        for query in (INGEST, DETECTION, SILENCE)
    }


def check_locations(settings: PipelineSettings) -> None:
    """Fail at start when the lake, checkpoint or landing folder cannot be used."""
    for what, location in (("lake", settings.lake_root), ("checkpoint", settings.checkpoint_root)):
        if lake.is_uri(location):
            continue
        path = Path(location)
        try:
            path.mkdir(parents=True, exist_ok=True)
            probe = path / ".write-test"
            probe.write_text("ok")
            probe.unlink()
        except OSError as exc:
            raise ConfigError(
                f"The {what} folder {location} is not writable ({exc.strerror}). "
                f"Point {'IOT_LAKE_ROOT' if what == 'lake' else 'IOT_PIPELINE_CHECKPOINT_ROOT'} "
                "at a folder this user can write."
            ) from None
    if settings.source == "files" and not lake.is_uri(settings.landing_dir):
        Path(settings.landing_dir).mkdir(parents=True, exist_ok=True)


def check_topic(settings: PipelineSettings, timeout_s: float = 15.0) -> None:
    """Fail at start when the topic does not exist (plain connections; secured ones are left to
    Spark, whose Java client options cannot be translated to librdkafka's)."""
    if settings.source != "kafka" or settings.kafka_options:
        return
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": settings.bootstrap_servers})
    try:
        topics = admin.list_topics(timeout=timeout_s).topics
    except Exception as exc:
        raise ConfigError(
            f"Cannot reach Kafka at {settings.bootstrap_servers}: {exc}. Start it with "
            "'iotfraud stack up' or set KAFKA_BOOTSTRAP_SERVERS."
        ) from None
    if settings.topic not in topics:
        raise ConfigError(
            f"Topic {settings.topic!r} does not exist on {settings.bootstrap_servers}. Create it "
            "(iotfraud simulate creates it) or set IOT_TOPIC to an existing topic."
        )
    if settings.firmware_topic and settings.firmware_topic not in topics:
        raise ConfigError(
            f"Topic {settings.firmware_topic!r} (authorized firmware updates) does not exist on "
            f"{settings.bootstrap_servers}. Create it (iotfraud simulate creates it), or set "
            "IOT_FIRMWARE_TOPIC to an empty value to switch the tamper check off."
        )


def model_scorer(settings: PipelineSettings) -> ModelScorer:
    """Follow the registered model; the local SQLite store when no MLflow URI is set."""
    from infra.mlflow_store import local_tracking_uri
    from infra.settings import StackSettings

    uri = settings.mlflow_tracking_uri or local_tracking_uri(StackSettings().state_dir)
    return ModelScorer(uri, settings.model_name, settings.model_alias,
                       signing_key=settings.signing_key())  # fmt: skip


@dataclass
class Pipeline:
    """The running queries and their metrics listener."""

    spark: SparkSession
    settings: PipelineSettings
    listener: MetricsListener
    scorer: ModelScorer | None = None
    queries: list[StreamingQuery] = field(default_factory=list)
    # Receives the rows the model scores (see ``FeaturesBatchWriter.on_scoring``).
    on_scoring: Callable[[pd.DataFrame], None] | None = None
    detection: FeaturesBatchWriter | None = None
    # Publishes alert changes to the alerts topic (``pipeline.publish``); None: no topic.
    publisher: AlertPublisher | None = None
    relay: WebhookRelay | None = None
    # The registry every stream-static join reads (cached; ``pipeline.registry``).
    registry: PinnedRegistry | None = None
    # When each query was last started again after a transient failure (``restart_transient``).
    restarts: dict[str, float] = field(default_factory=dict)

    def checkpoint(self, query: str) -> str:
        return os.path.join(self.settings.checkpoint_root, query)

    def _start_checkpoint(self, query: str) -> str:
        """The checkpoint ``query`` starts from, without what a kill during its first batch left
        (``discard_unstarted_batch``)."""
        path = self.checkpoint(query)
        discard_unstarted_batch(self.spark, path)
        return path

    def _start(
        self,
        df: DataFrame,
        name: str,
        batch_writer: Callable[[DataFrame, int], None],
        *,
        output_mode: str = "append",
    ) -> StreamingQuery:
        """Start ``df`` as query ``name``: its own checkpoint, the run's trigger, foreachBatch."""
        writer = df.writeStream.queryName(name).option(
            "checkpointLocation", self._start_checkpoint(name)
        )
        if self.settings.trigger == "available_now":
            writer = writer.trigger(availableNow=True)
        else:
            writer = writer.trigger(processingTime=trigger_interval(self.settings, name))
        query = writer.outputMode(output_mode).foreachBatch(batch_writer).start()
        self.queries.append(query)
        return query

    def _registry(self) -> DataFrame:
        if self.registry is None:
            self.registry = PinnedRegistry.load(self.spark, self.settings.lake_root)
            self.registry.watch(REGISTRY_CHECK_S)
        return self.registry.frame

    def _stream(self, name: str) -> DataFrame:
        path = lake.table_path(self.settings.lake_root, name)
        return self.spark.readStream.format("delta").load(path)

    def _source(self, query: str) -> DataFrame:
        """The telemetry source of ``query``, bounded as ``batch_bounds`` says."""
        return raw_source(self.spark, self.settings, batch_bounds(self.settings).get(query))

    def _parsed(self, query: str) -> DataFrame:
        return parse_events(self._source(query), max_clock_ahead=self.settings.max_clock_ahead)

    def _feature_input(self) -> DataFrame:
        """Events from the source, each once, plus what the ingest quarantined that counts in
        windows (a Delta stream): the copies of events (``is_duplicate`` = 1) and the readings
        that flag their device (out of range, clock ahead: ``flag``).

        A duplicate counts in the windows of its event time, like every event: replays older
        than the watermark are late here, and stay visible in ``quarantine`` (reason
        ``duplicate``). Only the source's events carry the watermark: the quarantined rows,
        quiet for hours on a clean fleet, must not hold it back, and a clock ahead must not
        move it.
        """
        events = first_copies(valid_events(self._parsed(DETECTION)), self.settings.watermark)
        quarantine = quarantine_feature_events(self._stream(lake.QUARANTINE))
        return feature_events(events, duplicates=False).unionByName(quarantine)

    def start_ingest(self) -> StreamingQuery:
        s = self.settings
        writer = IngestBatchWriter(s.lake_root, s.app_id, s.dedup_horizon,
                                   checkpoint=self.checkpoint(INGEST),
                                   offsets=s.source == "kafka")  # fmt: skip
        # Its tasks before those of the queries nobody waits for within seconds, and its first
        # before detection's second (infra/scheduler_pools.xml).
        with scheduler_pool(self.spark, INGEST_POOL):
            return self._start(self._parsed(INGEST), INGEST, writer)

    def start_detection(self) -> StreamingQuery:
        s = self.settings
        features = features_from_events(
            self._feature_input(), self._registry(), window=s.window, slide=s.slide
        )
        writer = FeaturesBatchWriter(
            s.lake_root,
            self.scorer,
            rules=RuleThresholds.parse(s.rule_thresholds),
            spec=s.profile_spec(),
            watermark_s=seconds(s.watermark),
            app_id=s.app_id,
            checkpoint=self.checkpoint(DETECTION),
            on_scoring=self.on_scoring,
            publish=self.publisher,
        )
        self.detection = writer
        writer.load(self.spark, features.columns)
        # Its tasks before the other queries': alerts are due within seconds, a telemetry row or
        # a silence may come a little later.
        with scheduler_pool(self.spark, ALERTS_POOL):
            return self._start(features, DETECTION, writer, output_mode="update")

    def hold_detection(self) -> AbstractContextManager[object]:
        """Inside, detection runs no batch (one running is finished first): the trim of its
        changelog (``pipeline.maintenance.prune_changes``) loses to any append it commits."""
        return self.detection.paused() if self.detection is not None else nullcontext()

    @property
    def checks_firmware(self) -> bool:
        return self.settings.source == "kafka" and bool(self.settings.firmware_topic)

    def start_firmware_ingest(self) -> StreamingQuery:
        s = self.settings
        raw = kafka_source(self.spark, s, topic=s.firmware_topic)
        writer = FirmwareIngestWriter(s.lake_root, s.app_id)
        return self._start(raw, FIRMWARE_INGEST, writer)

    def start_firmware(self) -> StreamingQuery:
        s = self.settings
        changes = firmware_changes(
            self._stream(lake.TELEMETRY), self._registry(), watermark=s.watermark
        )
        unauthorized = unauthorized_changes(
            changes,
            self._stream(lake.FIRMWARE_UPDATES),
            grace=s.firmware_grace,
            watermark=s.watermark,
        )
        writer = TamperBatchWriter(s.lake_root, s.window, publish=self.publisher)
        return self._start(unauthorized, FIRMWARE, writer)

    @property
    def runs_fast_path(self) -> bool:
        return runs_fast_path(self.settings)

    def start_fast_path(self) -> StreamingQuery:
        """The per-event checks, in Real-time Mode, straight to the alerts topic."""
        s = self.settings
        partitions = topic_partitions(s)
        context = self.spark.sparkContext
        slots = context.defaultParallelism
        if partitions is not None and slots < partitions + 1:
            short = (
                f"The fast path holds one task slot per partition of {s.topic!r} ({partitions}) "
                f"for as long as it runs, and the other queries need at least one more; "
                f"{context.master} has {slots}. Give Spark more cores (IOT_SPARK_MASTER, "
                f"SPARK_WORKER_CORES) or set IOT_PIPELINE_FAST_PATH=false."
            )
            # A cluster's executors may still be registering: its count is not final yet.
            if (context.master or "").startswith("local"):
                raise ConfigError(short)
            log.warning("%s (counted at start)", short)
        events = events_and_flagged(
            parse_events(kafka_source(self.spark, s, max_offsets=0),
                         max_clock_ahead=s.max_clock_ahead)
        )  # fmt: skip
        alerts = fast_alerts(events, self._registry(),
                             window_s=seconds(s.window), slide_s=seconds(s.slide))  # fmt: skip
        writer = (
            fast_messages(alerts)
            .writeStream.queryName(FAST_PATH)
            .format("kafka")
            .options(**kafka_connection_options(s))
            .option("topic", s.alerts_topic)
            .option("kafka.linger.ms", "0")  # a pager waits for every message sent alone
            .option("checkpointLocation", self._start_checkpoint(FAST_PATH))
            .outputMode("update")
        )
        # pyspark's type hints do not list realTime yet (Spark 4.1+ has it).
        realtime = writer.trigger(realTime=s.fast_path_checkpoint_interval)  # type: ignore[call-overload]
        query = realtime.start()
        assert isinstance(query, StreamingQuery)
        self.queries.append(query)
        return query

    def start_fast_log(self) -> StreamingQuery:
        """Record the fast path's messages in ``fast_alerts`` (Delta sink: exactly once)."""
        s = self.settings
        # From the start of the alerts topic, which the pipeline itself writes: whatever the
        # telemetry's starting offsets, no fast message published before this query runs is lost.
        source = kafka_source(self.spark, s, topic=s.alerts_topic, starting_offsets="earliest")
        rows = fast_log_rows(source)
        query = (
            rows.writeStream.queryName(FAST_LOG)
            .format("delta")
            .outputMode("append")
            .option("checkpointLocation", self._start_checkpoint(FAST_LOG))
            .trigger(processingTime=trigger_interval(s, FAST_LOG))
            .start(lake.table_path(s.lake_root, lake.FAST_ALERTS))
        )
        assert isinstance(query, StreamingQuery)
        self.queries.append(query)
        return query

    def start_silence(self) -> StreamingQuery:
        """Silent devices and late bursts (``pipeline.silence``): the readings of the source,
        one group per partition of the topic, and the registry's retirements (a Delta
        stream; ``ignoreChanges``: a registry update rewrites files, whose rows come again, and
        only say each device's status once more). Partitions added to the topic later get no
        retirements made before the query started."""
        s = self.settings
        registry = (
            self.spark.readStream.format("delta")
            .option("ignoreChanges", "true")
            .load(lake.table_path(s.lake_root, lake.DEVICES))
        )
        partitions = (topic_partitions(s) if s.source == "kafka" else None) or 1
        records = senders(self._source(SILENCE), max_clock_ahead=s.max_clock_ahead)
        rows = silence_input(records, self._registry(), registry,
                             lateness=s.silence_watermark, partitions=partitions)  # fmt: skip
        writer = SilenceBatchWriter(lake.table_path(s.lake_root, lake.ALERTS), self.publisher)
        with session_conf(self.spark, STATE_STORE_CONF, SILENCE_STATE_STORE):
            return self._start(silence_changes(rows, s.silence_spec()), SILENCE, writer,
                               output_mode="update")  # fmt: skip

    def wait_until_running(
        self, stop: threading.Event | None = None, timeout_s: float = FIRST_TRIGGER_WAIT_S
    ) -> list[str]:
        """Wait (at most ``timeout_s``, and no longer once ``stop`` is set) until each
        micro-batch query has ended its first trigger: it has reported a batch's progress, or
        it waits for data or for its next trigger. A query's first batch plans its stages,
        compiles their code and starts its Python workers, several seconds on a small machine,
        with every query's first batch at once: a message sent before they end waits for them.
        Under load a query starts its next batch as soon as one ends, and never waits: its
        progress tells that it has run. The fast path is not waited for (its Real-time Mode
        batch lasts a checkpoint interval), nor a query that has stopped (``failures`` reports
        it). Returns the names of the queries still in their first trigger."""
        deadline = time.monotonic() + timeout_s
        pause = stop or threading.Event()
        while True:
            starting = [query.name for query in self.queries
                        if query.name != FAST_PATH and query.isActive
                        and not _past_first_trigger(query)]  # fmt: skip
            if not starting or time.monotonic() >= deadline or pause.wait(0.2):
                return starting

    def flush_metrics(self) -> None:
        self.listener.flush(self.spark)

    def stop(self) -> None:
        if self.relay is not None:
            self.relay.stop()
        for query in self.queries:
            if query.isActive:
                query.stop()
        self.finish_detection()
        self.flush_metrics()
        if self.publisher is not None:
            self.publisher.close()
        self.release_registry()

    def release_registry(self) -> None:
        if self.registry is not None:
            self.registry.release()
            self.registry = None

    def finish_available(self) -> None:
        """Let ingest, then detection (which reads what ingest quarantined), process what the
        topic holds now; then stop every query. Only these two wait for the topic: the firmware
        check runs a batch at every trigger (its join's watermark), so it never has nothing to
        do in Spark's sense; the fast path's micro-batches run until stopped; and what the
        silence query has not read yet it reads at the next start."""
        named = {query.name: query for query in self.queries}
        for query in (named.get(INGEST), named.get(DETECTION)):
            if query is not None and query.isActive:
                query.processAllAvailable()
        # Then each query stops between two micro-batches: a stop cuts the running one, and a
        # cut between publishing and writing leaves the topic an alert the table does not hold
        # until the next start. A query whose batches follow each other without a pause (one
        # slower than its trigger) is stopped after DRAIN_WAIT_S all the same.
        for query in self.queries:
            deadline = time.monotonic() + DRAIN_WAIT_S
            while (query.name != FAST_PATH and query.isActive and time.monotonic() < deadline
                   and query.status["isTriggerActive"]):  # fmt: skip
                time.sleep(0.1)
            query.stop()

    def finish_detection(self) -> None:
        """Once detection has stopped: its open windows' alerts get their latest values."""
        if self.detection is None:
            return
        try:
            self.detection.finish(self.spark)
        except Exception as exc:  # the next start does them again; what stopped matters more
            log.warning("detection's writes at its stop failed (the next start does them "
                        "again): %s", exc)  # fmt: skip

    def failures(self) -> list[str]:
        return [f"{q.name}: {q.exception()}" for q in self.queries if q.exception() is not None]

    def restart_transient(self, now: float) -> list[str]:
        """Start again, from its checkpoint, each query that failed transiently
        (``TRANSIENT_FAILURES``) and can be started again on its own (the silence query, whose
        writer loads what it needs at its first batch), unless it did so less than
        ``RESTART_AFTER_S`` ago (then ``failures`` reports it). The names restarted."""
        restartable = {SILENCE: self.start_silence}
        restarted = []
        for query in list(self.queries):
            error, name = query.exception(), query.name
            if error is None or name not in restartable:
                continue
            if not any(text in str(error) for text in TRANSIENT_FAILURES):
                continue
            last = self.restarts.get(name)
            if last is not None and now - last < RESTART_AFTER_S:
                continue
            log.warning("query %s failed (%s); starting it again from its checkpoint",
                        name, str(error).splitlines()[0])  # fmt: skip
            self.restarts[name] = now
            self.queries.remove(query)
            restartable[name]()
            restarted.append(name)
        return restarted


def prepare(
    spark: SparkSession,
    settings: PipelineSettings,
    on_scoring: Callable[[pd.DataFrame], None] | None = None,
) -> Pipeline:
    """Check the set-up, create missing tables, register the metrics listener; start nothing."""
    check_locations(settings)
    check_topic(settings)
    # Before any query writes (it changes table metadata), and before the missing tables are
    # created: they take the properties from the session's defaults.
    apply_table_properties(spark, settings)
    ensure_tables(spark, settings.lake_root)
    publisher = None
    if settings.source == "kafka" and settings.alerts_topic:
        publisher = alert_publisher(settings, settings.alerts_topic, like=settings.topic)
    listener = MetricsListener(lake.table_path(settings.lake_root, lake.PIPELINE_METRICS),
                               rocksdb_counts_rows=rocksdb_counts_rows(spark))  # fmt: skip
    spark.streams.addListener(listener)
    # Live runs only: a catch-up run returns when the queries are done, not the receiver.
    live = publisher is not None and settings.trigger == "processing"
    if settings.webhook_url.get_secret_value() and not live:
        log.warning("the webhook runs with live runs of the Kafka source only: not in this run")
    live = live and bool(settings.webhook_url.get_secret_value())
    relay = webhook_relay(settings) if live else None
    return Pipeline(spark, settings, listener, model_scorer(settings), on_scoring=on_scoring,
                    publisher=publisher, relay=relay)  # fmt: skip


def start(spark: SparkSession, settings: PipelineSettings) -> Pipeline:
    """Start every query (live mode)."""
    pipeline = prepare(spark, settings)
    if pipeline.checks_firmware:
        pipeline.start_firmware_ingest()
    if pipeline.runs_fast_path:  # first: its tasks take their slots before the others queue
        pipeline.start_fast_path()
    pipeline.start_ingest()
    pipeline.start_detection()
    if pipeline.settings.silence:
        pipeline.start_silence()
    if pipeline.checks_firmware:
        pipeline.start_firmware()
    if pipeline.runs_fast_path:
        pipeline.start_fast_log()
    if pipeline.relay is not None:
        pipeline.relay.start()
    return pipeline


@contextmanager
def session_conf(spark: SparkSession, key: str, value: str) -> Iterator[None]:
    """Set a Spark SQL conf while a query starts: a query takes the session's conf when it
    starts (and keeps what its checkpoint recorded), so this one alone gets ``value``."""
    before = spark.conf.get(key, None)
    spark.conf.set(key, value)
    try:
        yield
    finally:
        if before is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, before)


def runs_fast_path(settings: PipelineSettings) -> bool:
    """The fast path runs in live runs of the Kafka source that publish alerts."""
    return (settings.fast_path and settings.source == "kafka" and bool(settings.alerts_topic)
            and settings.trigger == "processing")  # fmt: skip


def topic_partitions(settings: PipelineSettings, timeout_s: float = 15.0) -> int | None:
    """How many partitions the telemetry topic has (None when it cannot be read)."""
    from infra.kafka_client import connect

    try:
        _, metadata = connect(client_config(settings), timeout_s=timeout_s)
    except Exception as exc:
        log.warning("cannot read the partitions of %r: %s", settings.topic, exc)
        return None
    topic = metadata.topics.get(settings.topic)
    return len(topic.partitions) if topic is not None and topic.partitions else None


def webhook_relay(settings: PipelineSettings) -> WebhookRelay:
    """The relay of the alerts topic to IOT_PIPELINE_WEBHOOK_URL (``pipeline.webhook``), its
    dead-letter topic created if absent."""
    topic = settings.webhook_dead_letter_topic
    ensure_output_topic(settings, topic, like=settings.topic,
                        setting="IOT_PIPELINE_WEBHOOK_DEAD_LETTER_TOPIC")  # fmt: skip
    return WebhookRelay(
        client_config(settings), settings.alerts_topic, settings.webhook_url.get_secret_value(),
        topic, group=f"{settings.app_id}-webhook", attempts=settings.webhook_attempts,
        first_delay_s=settings.webhook_first_retry_s, timeout_s=settings.webhook_timeout_s,
    )  # fmt: skip


def run_available_now(
    spark: SparkSession,
    settings: PipelineSettings,
    on_scoring: Callable[[pd.DataFrame], None] | None = None,
) -> Pipeline:
    """Catch up on everything available, then return. Two stages: the queries that read only
    the sources (the ingests, silence), then those that read what the ingests wrote (detection
    reads ``quarantine``, the firmware join ``telemetry`` and ``firmware_updates``). The queries
    of a stage run side by side: a query spends much of a batch planning and committing on the
    driver, time in which the other's tasks use the cores; and each detector writes its own
    partitions of ``alerts`` (``infra.contract.ALERTS_PARTITIONED_BY``)."""
    settings = settings.model_copy(update={"trigger": "available_now"})
    pipeline = prepare(spark, settings, on_scoring)
    try:
        sources = [pipeline.start_ingest]
        if pipeline.checks_firmware:
            sources.append(pipeline.start_firmware_ingest)
        if settings.silence:
            sources.append(pipeline.start_silence)
        _run_stage(pipeline, sources)
        readers = [pipeline.start_detection]
        if pipeline.checks_firmware:
            readers.append(pipeline.start_firmware)
        _run_stage(pipeline, readers)
        if pipeline.detection is not None:
            # What detection left after its last batch: a failure there fails the catch-up.
            pipeline.detection.settle()
    finally:
        # Also after a failure: what detection left to run after its last batch (the windows it
        # closed) publishes and writes alerts, and must be done before the publisher closes.
        pipeline.finish_detection()
        pipeline.flush_metrics()
        spark.streams.removeListener(pipeline.listener)
        if pipeline.publisher is not None:
            pipeline.publisher.close()
        pipeline.release_registry()
    return pipeline


def _run_stage(pipeline: Pipeline, starts: list[Callable[[], StreamingQuery]]) -> None:
    """Start the queries of ``starts`` and wait until each has ended. When one fails, or a start
    does, the others are stopped first: no query outlives a failed catch-up."""
    try:
        for query in [start() for start in starts]:
            query.awaitTermination()
    except BaseException:
        for query in pipeline.queries:
            if query.isActive:
                query.stop()
        raise


def run_until_stopped(
    pipeline: Pipeline,
    stop: threading.Event,
    on_status: object = None,
    drain: threading.Event | None = None,
) -> None:
    """Block until ``stop`` is set or a query fails; flush metrics and report status meanwhile,
    and maintain the tables every ``maintenance_interval`` (on a thread of its own). When
    ``drain`` is set too, the queries first process what their sources hold (a stop that loses
    no time: the demo's, once its simulator has stopped)."""
    interval = pipeline.settings.status_interval_s
    maintenance = Maintenance(pipeline.spark, pipeline.settings, pipeline.hold_detection)
    try:
        while not stop.wait(interval):
            pipeline.flush_metrics()
            if callable(on_status):
                on_status(pipeline.listener.status_line())
            pipeline.restart_transient(time.monotonic())
            if pipeline.detection is not None:
                pipeline.detection.write_if_idle()
            failed = pipeline.failures()
            if failed:
                raise RuntimeError("a streaming query failed: " + "; ".join(failed))
            maintenance.start_when_due()
        if drain is not None and drain.is_set():
            pipeline.finish_available()
            log.info("ingest and detection have processed what the topic held: stopped")
    finally:
        pipeline.stop()
        pipeline.spark.streams.removeListener(pipeline.listener)


@dataclass
class Maintenance:
    """Runs ``pipeline.maintenance.maintain`` every ``maintenance_interval``, one run at a time,
    beside the streaming queries (its commits change no data; see that module)."""

    spark: SparkSession
    settings: PipelineSettings
    # Holds detection's next batch back (``Pipeline.hold_detection``).
    hold_changes: Hold = nullcontext
    clock: Callable[[], float] = time.monotonic
    thread: threading.Thread | None = None
    last: float | None = None

    def start_when_due(self) -> None:
        every = seconds(self.settings.maintenance_interval)
        now = self.clock()
        if self.last is None:
            self.last = now  # the first run one interval after start: start-up is busy enough
        if every <= 0 or now - self.last < every or (self.thread and self.thread.is_alive()):
            return
        from pyspark import InheritableThread

        from pipeline.maintenance import maintain

        self.last = now
        self.thread = InheritableThread(
            target=maintain,
            args=(self.spark, self.settings),
            kwargs={"hold_changes": self.hold_changes},
            name="maintenance",
            daemon=True,
        )
        self.thread.start()
