"""Pipeline part 1 on real parts: Kafka source -> parse/quarantine -> dedup -> telemetry ->
registry join -> window features, with Delta sinks."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from infra import contract as c
from infra import lake
from infra.spark import ALERTS_POOL, INGEST_POOL
from pipeline import job
from pipeline.detection import window_states
from pipeline.metrics import BACKLOG
from pipeline.settings import PipelineSettings
from tests.pipeline_helpers import (
    device_series,
    encoded,
    produce,
    query_stage_pools,
    register_and_wait,
    write_registry,
)

pytestmark = pytest.mark.integration


def ingest_available(spark: Any, settings: PipelineSettings) -> None:
    """The ingest query alone over what the topic holds (``job.run_available_now`` runs every
    query after it)."""
    pipeline = job.prepare(spark, settings.model_copy(update={"trigger": "available_now"}))
    try:
        pipeline.start_ingest().awaitTermination()
    finally:
        spark.streams.removeListener(pipeline.listener)
        if pipeline.publisher is not None:
            pipeline.publisher.close()


def settings_for(lake_root: str, tmp_path: Path, **overrides: Any) -> PipelineSettings:
    return PipelineSettings(
        lake_root=lake_root,
        checkpoint_root=str(tmp_path / "checkpoints"),
        landing_dir=str(tmp_path / "landing"),
        window="10 minutes",
        slide="5 minutes",
        watermark="10 minutes",
        dedup_horizon="15 minutes",
        firmware_topic="",
        # Its Real-time Mode tasks need slots the shared local[2] session lacks (test_fast_path).
        fast_path=False,
        # An empty store (rules only), not the checkout's local one with whatever model is there.
        mlflow_tracking_uri=f"sqlite:///{tmp_path / 'none.db'}",
        **overrides,
    )


def table(spark: Any, lake_root: str, name: str) -> Any:
    return spark.read.format("delta").load(lake.table_path(lake_root, name))


def files_per_write(spark: Any, lake_root: str, name: str) -> list[int]:
    """The files each append to a table added, oldest first."""
    history = spark.sql(f"DESCRIBE HISTORY delta.`{lake.table_path(lake_root, name)}`")
    writes = history.where("operation = 'WRITE'").orderBy("version").collect()
    return [int(h.operationMetrics["numFiles"]) for h in writes]


def test_live_pipeline_quarantines_dedups_joins_and_windows(
    spark: Any, bootstrap: str, make_topic: Callable[..., str], lake: str, tmp_path: Path
) -> None:
    topic = make_topic(partitions=3)
    now = datetime.now(timezone.utc)
    # Aligned to 10 minutes so that one window holds exactly the first 20 readings.
    start = now.replace(minute=now.minute - now.minute % 10, second=0, microsecond=0) - timedelta(
        minutes=40
    )
    write_registry(lake, ["dev-1", "dev-2"])
    dev1 = device_series("dev-1", start, 20)
    dev2 = device_series("dev-2", start, 10, firmware="6.6.6")  # not the expected firmware
    rogue = device_series("dev-9", start, 5)
    replayed = dev1[:3]  # same event_id, same payload: a replay
    bad = [("dev-1", b"{broken"), ("dev-1", json.dumps({"device_id": "dev-1"}).encode()),
           ("dev-2", b"{broken")]  # in another partition than dev-1's  # fmt: skip
    produce(bootstrap, topic, encoded(dev1 + dev2 + rogue) + encoded(replayed) + bad)

    settings = settings_for(lake, tmp_path, bootstrap_servers=bootstrap, topic=topic)
    pipeline = job.start(spark, settings)
    # No alert waits for the ingest: it runs on a trigger of its own, longer than detection's.
    triggers = {q.name: q._jsq.streamingQuery().trigger().toString() for q in pipeline.queries}
    assert triggers == {job.INGEST: "ProcessingTimeTrigger(5000)",
                        job.DETECTION: "ProcessingTimeTrigger(1000)"}  # fmt: skip
    try:
        # What `pipeline run --ready-file` waits for before it says the pipeline runs: every
        # query past its first micro-batch (here with data), so a message sent then waits for
        # no query's start.
        assert pipeline.wait_until_running(timeout_s=180) == []
        ran = {q.name: q.lastProgress is not None for q in pipeline.queries}
        assert ran == {job.INGEST: True, job.DETECTION: True}, ran
        for query in pipeline.queries:
            query.processAllAvailable()
        pipeline.queries[1].processAllAvailable()  # detection sees the ingest's last duplicates

        telemetry = table(spark, lake, "telemetry")
        assert telemetry.count() == 35
        assert telemetry.select("event_id").distinct().count() == 35
        rejected = table(spark, lake, "quarantine").collect()
        assert Counter(r.reason for r in rejected) == {
            c.REASON_DUPLICATE: 3, c.REASON_INVALID_JSON: 2, c.REASON_MISSING_FIELD: 1
        }  # fmt: skip
        # From two Kafka partitions, yet each batch's rejects land in one file.
        assert len({r.kafka_partition for r in rejected}) == 2
        files = files_per_write(spark, lake, "quarantine")
        assert files and files == [1] * len(files)
        # And the events of several partitions too: a file per Kafka partition made many small
        # files for every reader until maintenance compacted them.
        assert telemetry.select("kafka_partition").distinct().count() > 1
        files = files_per_write(spark, lake, "telemetry")
        assert files and files == [1] * len(files)

        features = window_states(spark, lake)
        by_device = {
            r.device_id: r
            for r in features.groupBy("device_id")
            .agg({"registered": "max", "duplicate_count": "sum", "firmware_mismatch_count": "sum"})
            .withColumnsRenamed({"max(registered)": "registered", "sum(duplicate_count)": "dups",
                                 "sum(firmware_mismatch_count)": "fw"})
            .collect()
        }  # fmt: skip
        assert by_device["dev-9"].registered is False
        assert by_device["dev-1"].registered is True
        assert by_device["dev-1"].dups > 0 and by_device["dev-2"].dups == 0
        assert by_device["dev-2"].fw > 0 and by_device["dev-1"].fw == 0
        first_window = features.where(
            (features.device_id == "dev-1") & (features.window_start == start)
        ).first()
        assert first_window is not None
        assert first_window.event_count == 20  # 20 readings 30 s apart fill the 10-minute window
        assert first_window.voltage_v_mean == pytest.approx(230.9, abs=0.5)

        # A registry change reaches the joins without restart: the pipeline looks for a new
        # version every second (``pipeline.registry``), and the batches after that use it.
        register_and_wait(pipeline, lake, ["dev-1", "dev-2", "dev-9"])
        later = start + timedelta(minutes=20)
        produce(bootstrap, topic, encoded(device_series("dev-9", later, 4)))
        for query in pipeline.queries:
            query.processAllAvailable()
        pipeline.queries[1].processAllAvailable()
        registered_now = window_states(spark, lake).where(
            f"device_id = 'dev-9' AND window_start >= '{later:%Y-%m-%d %H:%M:%S}'"
        )
        assert registered_now.count() > 0
        assert all(r.registered for r in registered_now.collect())
    finally:
        pipeline.stop()

    # Detection's jobs (its aggregation and its writes) ran first in line for the task slots,
    # the ingest's next, those of the other queries behind them.
    pools = {q.name: query_stage_pools(spark, q) for q in pipeline.queries}
    assert set(pools[job.DETECTION]) == {ALERTS_POOL} and pools[job.DETECTION][ALERTS_POOL] > 5
    assert set(pools[job.INGEST]) == {INGEST_POOL} and pools[job.INGEST][INGEST_POOL] > 5

    metrics = table(spark, lake, "pipeline_metrics")
    assert {r.query_name for r in metrics.select("query_name").distinct().collect()} == {
        "ingest", "detection"
    }  # fmt: skip
    assert metrics.where("query_name = 'ingest'").agg({"num_input_rows": "sum"}).first()[0] == 45
    # Each batch's Kafka end offsets, as Spark reported them: the last batch of each query ended
    # where the topic ends (the alert latency counts a batch's messages from these).
    from iotfraud.demo import messages_in_topic

    for query in ("ingest", "detection"):
        last = metrics.where(f"query_name = '{query}'").orderBy("batch_id").collect()[-1]
        ends = json.loads(last.kafka_end_offsets)
        assert list(ends) == [topic] and len(ends[topic]) == 3
        assert sum(ends[topic].values()) == messages_in_topic(bootstrap, topic)
        # What the falling-behind warning follows (``pipeline.progress``): the topic's latest
        # offsets when the batch was planned (here the whole topic), and what of it waited,
        # which this batch took (no maxOffsetsPerTrigger left any behind).
        backlog = pipeline.listener.latest[query][BACKLOG]
        assert backlog.latest == messages_in_topic(bootstrap, topic)
        assert backlog.waiting == last.num_input_rows


def test_files_source_feeds_the_same_pipeline(spark: Any, lake: str, tmp_path: Path) -> None:
    start = datetime.now(timezone.utc) - timedelta(hours=1)
    write_registry(lake, ["dev-1"])
    settings = settings_for(lake, tmp_path, source="files")
    landing = Path(settings.landing_dir)
    landing.mkdir(parents=True)
    events = device_series("dev-1", start, 12)
    (landing / "part-1.jsonl").write_text(
        "\n".join(json.dumps(e) for e in events[:6]) + "\nnot json\n"
    )
    (landing / "part-2.jsonl").write_text("\n".join(json.dumps(e) for e in events[6:]) + "\n")

    job.run_available_now(spark, settings)

    assert table(spark, lake, "telemetry").count() == 12
    assert [r.reason for r in table(spark, lake, "quarantine").collect()] == [c.REASON_INVALID_JSON]
    assert window_states(spark, lake).where("device_id = 'dev-1'").count() > 0

    # Running again over the same files changes nothing.
    job.run_available_now(spark, settings)
    assert table(spark, lake, "telemetry").count() == 12


def test_a_catch_up_fails_when_a_write_after_its_last_batch_fails_and_the_next_one_does_it(
    spark: Any, lake: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The windows a catch-up's last batches close go to ``features`` after those batches, when
    the queries have ended. That append failing fails the catch-up (not a warning and a clean
    exit); the next catch-up's first batch writes them."""
    from infra.lake import FEATURES, table_path
    from pipeline import detection

    start = datetime.now(timezone.utc) - timedelta(hours=2)
    write_registry(lake, ["dev-1"])
    settings = settings_for(lake, tmp_path, source="files")
    landing = Path(settings.landing_dir)
    landing.mkdir(parents=True)
    # An hour of readings: the watermark closes its first windows.
    events = device_series("dev-1", start, 120)
    (landing / "part-1.jsonl").write_text("\n".join(json.dumps(e) for e in events) + "\n")
    append = detection.idempotent_append

    def unwritable(*_args: Any, **_kwargs: Any) -> None:
        raise OSError("features unwritable")

    monkeypatch.setattr(detection, "idempotent_append", unwritable)
    with pytest.raises(RuntimeError, match="after its micro-batch failed") as failed:
        job.run_available_now(spark, settings)
    assert "features unwritable" in str(failed.value.__cause__)
    assert not Path(table_path(lake, FEATURES)).exists()

    # The next catch-up's first batch closes them again (``detection.load_state``).
    monkeypatch.setattr(detection, "idempotent_append", append)
    more = device_series("dev-1", start, 124)[120:]
    (landing / "part-2.jsonl").write_text("\n".join(json.dumps(e) for e in more) + "\n")
    job.run_available_now(spark, settings)
    done = start + timedelta(seconds=123 * 30) - timedelta(minutes=10)  # less the watermark
    closed = window_states(spark, lake).where(f"window_end <= TIMESTAMP '{done:%Y-%m-%d %H:%M:%S}'")
    assert closed.count() > 0
    assert table(spark, lake, FEATURES).count() == closed.count()


def test_late_events_update_windows_within_the_watermark_and_are_counted_beyond(
    spark: Any, bootstrap: str, make_topic: Callable[..., str], lake: str, tmp_path: Path
) -> None:
    topic = make_topic(partitions=1)
    now = datetime.now(timezone.utc)
    start = now.replace(minute=now.minute - now.minute % 10, second=0, microsecond=0) - timedelta(
        hours=1
    )
    write_registry(lake, ["dev-1"])
    settings = settings_for(lake, tmp_path, bootstrap_servers=bootstrap, topic=topic)
    pipeline = job.start(spark, settings)

    def process() -> None:
        for query in pipeline.queries:
            query.processAllAvailable()
        pipeline.queries[1].processAllAvailable()

    window = start + timedelta(minutes=20)

    def count_in_window() -> int:
        row = (
            window_states(spark, lake)
            .where(f"device_id = 'dev-1' AND window_start = '{window:%Y-%m-%d %H:%M:%S}'")
            .first()
        )
        return int(row.event_count) if row else 0

    try:
        series = device_series("dev-1", start, 60, every_s=30)  # 30 minutes of readings
        produce(bootstrap, topic, encoded(series[:45] + series[47:]))
        process()
        assert count_in_window() == 18
        # Watermark: latest event (29.5 min) - 10 min = 19.5 min. The two readings held back
        # (22.5 and 23 min) are late but within it; one from two hours earlier is beyond it.
        too_late = device_series("dev-1", start - timedelta(hours=2), 1)
        produce(bootstrap, topic, encoded(series[45:47] + too_late))
        process()
        process()  # the next batch reports the rows the previous one dropped
        assert count_in_window() == 20
        assert table(spark, lake, "telemetry").count() == 61  # bronze keeps every valid event
        pipeline.flush_metrics()
        late = table(spark, lake, "pipeline_metrics").where("query_name = 'detection'")
        assert late.agg({"late_rows_dropped": "sum"}).first()[0] >= 1
    finally:
        pipeline.stop()


def test_a_deleted_ingest_checkpoint_loses_nothing_and_writes_nothing_twice(
    spark: Any, bootstrap: str, make_topic: Callable[..., str], lake: str, tmp_path: Path
) -> None:
    import shutil

    topic = make_topic(partitions=2)
    start = datetime.now(timezone.utc) - timedelta(minutes=30)
    write_registry(lake, ["dev-1", "dev-2"])
    first = device_series("dev-1", start, 30)
    produce(bootstrap, topic, encoded(first) + encoded(first[:2]) + [("dev-1", b"{broken")])
    # Small batches, as a live run makes: the old checkpoint numbered its batches up to 6.
    settings = settings_for(lake, tmp_path, bootstrap_servers=bootstrap, topic=topic)
    ingest_available(spark, settings.model_copy(update={"max_offsets_per_trigger": 5}))
    assert table(spark, lake, "telemetry").count() == 30
    assert table(spark, lake, "quarantine").count() == 3

    # The ingest checkpoint is lost; meanwhile more messages arrive, copies among them.
    shutil.rmtree(tmp_path / "checkpoints" / "ingest")
    second = device_series("dev-2", start, 12)
    produce(bootstrap, topic, encoded(second) + encoded(first[5:6]) + [("dev-2", b"[")])
    # Reads the topic again from the earliest offsets, in one batch: number 0, which a txnAppId
    # shared with the old checkpoint would skip as committed, new messages and all.
    ingest_available(spark, settings)

    telemetry = table(spark, lake, "telemetry")
    assert telemetry.count() == 42, "every new event once, none of the earlier ones again"
    assert telemetry.select("event_id").distinct().count() == 42
    quarantine = Counter(r.reason for r in table(spark, lake, "quarantine").collect())
    assert quarantine == {c.REASON_DUPLICATE: 3, c.REASON_INVALID_JSON: 2}


def files_under(folder: Path) -> dict[str, bytes]:
    return {str(f.relative_to(folder)): f.read_bytes() for f in folder.rglob("*") if f.is_file()}


def test_queries_killed_as_they_logged_their_first_batch_start_again_and_started_ones_stay(
    spark: Any, bootstrap: str, make_topic: Callable[..., str], lake: str, tmp_path: Path
) -> None:
    import uuid

    from pipeline.sinks import discard_unstarted_batch

    topic = make_topic(partitions=2)
    write_registry(lake, ["dev-1"])
    produce(bootstrap, topic, encoded(device_series("dev-1", datetime.now(timezone.utc)
                                                    - timedelta(minutes=30), 30)))  # fmt: skip
    # With the silence query: CI's kill loop caught it in this state.
    settings = settings_for(lake, tmp_path, bootstrap_servers=bootstrap, topic=topic, silence=True)
    # What a SIGKILL leaves between Spark's write of batch 0's offsets and its rename: the
    # query's id, and a temporary file alone in offsets/ (Spark then refuses the checkpoint).
    checkpoints = tmp_path / "checkpoints"
    for query in (job.INGEST, job.SILENCE, job.DETECTION):
        offsets = checkpoints / query / "offsets"
        offsets.mkdir(parents=True)
        (checkpoints / query / "metadata").write_text(json.dumps({"id": str(uuid.uuid4())}))
        (offsets / f".0.{uuid.uuid4()}.tmp").write_text("v1\n")

    job.run_available_now(spark, settings)

    assert table(spark, lake, "telemetry").count() == 30
    assert window_states(spark, lake).where("device_id = 'dev-1'").count() > 0
    # A checkpoint with a batch is Spark's to resume: nothing in it changes.
    for query in (job.INGEST, job.SILENCE, job.DETECTION):
        (checkpoints / query / "offsets" / f".9.{uuid.uuid4()}.tmp").write_text("v1\n")
        before = files_under(checkpoints / query)
        assert discard_unstarted_batch(spark, str(checkpoints / query)) == []
        assert files_under(checkpoints / query) == before


def kafka_batch(spark: Any, bootstrap: str, topic: str, start: Any, end: Any) -> Any:
    """A micro-batch as the ingest query receives it: the topic's records from the offsets
    ``start`` to ``end`` (JSON per Spark's Kafka source), parsed."""
    from pipeline.sources import kafka_records
    from pipeline.transforms import parse_events

    raw = (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", json.dumps(start) if isinstance(start, dict) else start)
        .option("endingOffsets", json.dumps(end) if isinstance(end, dict) else end)
        .load()
    )
    return parse_events(kafka_records(raw)).localCheckpoint()


def end_offsets(spark: Any, bootstrap: str, topic: str, partitions: int) -> dict[str, Any]:
    """Where the topic ends, per partition (-2, the earliest, for an empty one)."""
    rows = (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .load()
        .groupBy("partition")
        .max("offset")
        .collect()
    )
    ends = {str(r[0]): int(r[1]) + 1 for r in rows}
    return {topic: {str(p): ends.get(str(p), -2) for p in range(partitions)}}


@pytest.mark.parametrize("committed", ["telemetry", "both"])
def test_a_batch_replayed_after_a_crash_between_or_after_its_appends_writes_each_row_once(
    spark: Any, bootstrap: str, make_topic: Callable[..., str], lake: str,
    monkeypatch: pytest.MonkeyPatch, committed: str,
) -> None:  # fmt: skip
    """The ingest's appends carry no Delta transaction id: after a restart, the offsets of its
    first batch that each table holds are what keep a replayed batch from writing twice."""
    from pipeline import ingest
    from pipeline.ingest import IngestBatchWriter
    from pipeline.sinks import ensure_tables

    ensure_tables(spark, lake)
    topic = make_topic(partitions=2)
    start = datetime.now(timezone.utc) - timedelta(minutes=30)
    write_registry(lake, ["dev-1", "dev-2"])
    first = device_series("dev-1", start, 20)
    produce(bootstrap, topic, [*encoded(first), ("dev-1", b"{broken")])
    batch_0 = kafka_batch(spark, bootstrap, topic, "earliest", "latest")
    middle = end_offsets(spark, bootstrap, topic, partitions=2)
    second = device_series("dev-2", start, 12)
    produce(bootstrap, topic, encoded(second) + encoded(first[:3]) + [("dev-2", b"[")])
    batch_1 = kafka_batch(spark, bootstrap, topic, middle, "latest")

    running = IngestBatchWriter(lake, "test")
    running(batch_0, 0)
    real_append = ingest.append

    def crash(df: Any, path: str, **kwargs: Any) -> None:
        # The process dies before Spark records the batch done: after the telemetry append
        # alone, or after both.
        if path.endswith("telemetry") or committed == "both":
            real_append(df, path, **kwargs)
        raise RuntimeError(f"killed after the {committed} append")

    monkeypatch.setattr(ingest, "append", crash)
    with pytest.raises(RuntimeError, match="killed"):
        running(batch_1, 1)
    monkeypatch.undo()
    # A restart: a new writer, and Spark runs batch 1 again.
    IngestBatchWriter(lake, "test")(batch_1, 1)

    events = [r.event_id for r in table(spark, lake, "telemetry").collect()]
    assert sorted(events) == sorted(e["event_id"] for e in first + second)
    quarantine = Counter(r.reason for r in table(spark, lake, "quarantine").collect())
    assert quarantine == {c.REASON_DUPLICATE: 3, c.REASON_INVALID_JSON: 2}
