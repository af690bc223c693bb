"""Pipeline part 2 on real parts: rules and the MLflow model (SQLite store) in foreachBatch,
alerts MERGEd exactly once, alias hot swap without restart."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from infra import lake
from pipeline import job
from pipeline.detection import FeaturesBatchWriter
from pipeline.scoring import ModelScorer
from pipeline.settings import PipelineSettings
from tests.mlflow_helpers import (
    BUSY_EXAMPLE,
    MODEL,
    Broken,
    BusyWindow,
    register_busy_window_model,
    register_model,
)
from tests.pipeline_helpers import (
    device_series,
    encoded,
    latest_alerts,
    produce,
    register_and_wait,
    table_alerts,
    topic_messages,
    write_registry,
)

pytestmark = pytest.mark.integration


def test_model_alerts_carry_the_version_and_follow_the_alias(
    spark: Any, bootstrap: str, make_topic: Callable[..., str], lake: str, tmp_path: Path,
    mlflow_uri: str, caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    topic = make_topic(partitions=2)
    now = datetime.now(timezone.utc)
    start = now.replace(minute=now.minute - now.minute % 10, second=0, microsecond=0) - timedelta(
        hours=3
    )
    write_registry(lake, ["busy", "quiet"])
    v1 = register_busy_window_model(mlflow_uri, tmp_path, min_events=15)
    settings = PipelineSettings(
        lake_root=lake, checkpoint_root=str(tmp_path / "cp"), bootstrap_servers=bootstrap,
        topic=topic, window="10 minutes", slide="5 minutes", watermark="5 minutes",
        mlflow_tracking_uri=mlflow_uri, model_name=MODEL, firmware_topic="",
        fast_path=False,  # its tasks need slots the shared local[2] session lacks
    )  # fmt: skip
    with caplog.at_level("INFO", logger="pipeline.scoring"):
        pipeline = job.start(spark, settings)
    # Loaded as the pipeline starts, not by its first batch (none has run: the topic is empty),
    # which would otherwise be late by the time MLflow takes.
    loaded = [r.getMessage() for r in caplog.records if r.name == "pipeline.scoring"]
    assert loaded == [f"scoring with {MODEL} version {v1} (threshold 0.500)"]

    def process() -> None:
        for query in pipeline.queries:
            query.processAllAvailable()
        pipeline.queries[1].processAllAvailable()
        assert pipeline.detection is not None
        pipeline.detection.settle()  # the closed windows' alerts are written after the batch

    def model_alerts() -> list[Any]:
        alerts = spark.read.format("delta").load(lake_table(lake, "alerts"))
        return alerts.where("alert_type = 'model_anomaly'").collect()

    try:
        # 100 minutes: busy sends 20 readings a window, quiet 10. The model scores each window
        # once the watermark closes it, after the device's cold start.
        produce(bootstrap, topic, encoded(
            device_series("busy", start, 200) + device_series("quiet", start, 100, every_s=60)
        ))  # fmt: skip
        process()
        first = model_alerts()
        assert first and {a.device_id for a in first} == {"busy"}
        assert {(a.model_name, a.model_version) for a in first} == {(MODEL, v1)}

        v2 = register_busy_window_model(mlflow_uri, tmp_path, min_events=3)  # moves the alias
        later = start + timedelta(minutes=100)
        produce(bootstrap, topic, encoded(device_series("quiet", later, 40, every_s=60)))
        process()
        after = model_alerts()
        # Windows closed since the alias moved are scored by v2 (busy's last ones too).
        new = [a for a in after if a.alert_id not in {f.alert_id for f in first}]
        assert new and {a.model_version for a in new} == {v2}
        assert "quiet" in {a.device_id for a in new}
        # Alerts already raised keep the version that scored them.
        kept = {a.alert_id: a.model_version for a in after if a not in new}
        assert kept == {f.alert_id: v1 for f in first}
    finally:
        pipeline.stop()


def lake_table(root: str, name: str) -> str:
    return lake.table_path(root, name)


def table_rows(spark: Any, root: str, name: str) -> list[Any]:
    """A table's rows, sorted, without ``detected_at`` (when a run wrote them)."""
    frame = spark.read.format("delta").load(lake_table(root, name))
    return sorted(frame.drop("detected_at").collect())


def test_a_device_registered_while_the_pipeline_runs_is_registered_in_the_next_windows(
    spark: Any, bootstrap: str, make_topic: Callable[..., str], lake: str, tmp_path: Path
) -> None:
    """Detection joins the registry from Spark's cache (``pipeline.registry``); a new version of
    the table reaches it within seconds, with no restart."""
    topic = make_topic(partitions=2)
    start = datetime.now(timezone.utc).replace(second=0, microsecond=0) - timedelta(hours=2)
    write_registry(lake, ["known"])
    settings = PipelineSettings(
        lake_root=lake, checkpoint_root=str(tmp_path / "cp"), bootstrap_servers=bootstrap,
        topic=topic, window="10 minutes", slide="5 minutes", watermark="5 minutes",
        mlflow_tracking_uri=f"sqlite:///{tmp_path / 'none.db'}", firmware_topic="",
        fast_path=False,  # its tasks need slots the shared local[2] session lacks
    )  # fmt: skip
    pipeline = job.start(spark, settings)
    detection = next(q for q in pipeline.queries if q.name == job.DETECTION)

    def rogue_windows() -> set[tuple[str, datetime]]:
        assert pipeline.detection is not None
        pipeline.detection.settle()  # the closed windows' alerts are written after the batch
        return {(a["device_id"], a["window_start"]) for a in table_alerts(lake).values()
                if a["alert_type"] == "rogue_device"}  # fmt: skip

    try:
        produce(bootstrap, topic, encoded(
            device_series("known", start, 20) + device_series("newcomer", start, 20)
        ))  # fmt: skip
        detection.processAllAvailable()
        raised = rogue_windows()
        assert raised and {device for device, _ in raised} == {"newcomer"}
        plan = detection._jsq.streamingQuery().lastExecution().executedPlan().toString()
        assert "InMemoryTableScan" in plan  # the registry read from memory

        register_and_wait(pipeline, lake, ["newcomer"], mode="append")
        produce(bootstrap, topic, encoded(
            device_series("newcomer", start + timedelta(minutes=40), 20)
        ))  # fmt: skip
        detection.processAllAvailable()
        assert rogue_windows() == raised  # its windows since registration are not rogue
    finally:
        pipeline.stop()


def windows_of(spark: Any, lake: str, *series: list[dict[str, Any]]) -> Any:
    """The 10-minute windows (5-minute slide) of the readings in ``series``, tables created."""
    from pipeline.features import features_from_events
    from pipeline.sinks import ensure_tables
    from tests.unit.pipeline.test_rules import events_df, registry_df

    ensure_tables(spark, lake)
    events = events_df(spark, [e for s in series for e in s])
    return features_from_events(
        events, registry_df(spark), window="10 minutes", slide="5 minutes"
    ).localCheckpoint()


def rogue_device_windows(spark: Any, lake: str, hours: tuple[float, float] = (0, 2)) -> Any:
    """The windows of one unregistered device (a rogue_device alert each) over ``hours``
    (from, to), tables created."""
    start = datetime(2026, 11, 22, 8, 0, tzinfo=timezone.utc) + timedelta(hours=hours[0])
    # Two hours: windows past the device's cold start, which the model scores once closed.
    count = int((hours[1] - hours[0]) * 120)
    return windows_of(spark, lake, device_series("rogue", start, count, firmware="6.6.6"))


def test_replayed_batch_changes_no_alert(spark: Any, lake: str, tmp_path: Path) -> None:
    features = rogue_device_windows(spark, lake)
    writer = FeaturesBatchWriter(lake, ModelScorer(f"sqlite:///{tmp_path / 'none.db'}", "absent"))

    writer(features, 7)
    writer.settle()  # its closed windows' alerts, after the batch
    alerts_path = lake_table(lake, "alerts")
    before = spark.read.format("delta").load(alerts_path).drop("detected_at").collect()
    writer(features, 7)  # the same micro-batch again, as after a crash
    writer.settle()
    after = spark.read.format("delta").load(alerts_path).drop("detected_at").collect()

    assert len(before) > 0
    assert sorted(before) == sorted(after)
    assert {a.alert_type for a in after} == {"rogue_device"}  # unregistered: firmware unknown


def test_a_batch_replayed_after_a_crash_between_its_writes_adds_no_alert_twice(
    spark: Any, lake: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The new alerts' append carries no Delta transaction id: after a start, the loaded alerts
    and the first batch's MERGE are what keep a replay from adding an alert twice."""
    from collections import Counter

    from pipeline import detection

    none = ModelScorer(f"sqlite:///{tmp_path / 'none.db'}", "absent")
    running = FeaturesBatchWriter(lake, none)
    running(rogue_device_windows(spark, lake, (0, 1)), 6)
    running.settle()
    later = rogue_device_windows(spark, lake, (1, 2))

    def killed(*_args: Any, **_kwargs: Any) -> None:
        raise RuntimeError("killed in the window changes' append")

    # Batch 7 appends its new alerts, and dies before its window changes mark it done.
    monkeypatch.setattr(detection, "append", killed)
    with pytest.raises(RuntimeError, match="killed"):
        running(later, 7)
    monkeypatch.undo()
    path = lake_table(lake, "alerts")
    before = Counter(r.alert_id for r in spark.read.format("delta").load(path).collect())
    # A restart: a new writer loads what the tables hold and Spark runs batch 7 again.
    restarted = FeaturesBatchWriter(lake, none)
    restarted(later, 7)
    restarted.settle()

    after = Counter(r.alert_id for r in spark.read.format("delta").load(path).collect())
    assert len(before) > 6 and set(before.values()) == {1}
    assert after == before


def test_a_batch_replayed_after_all_its_writes_changes_no_window_and_no_alert(
    spark: Any, lake: str, tmp_path: Path
) -> None:
    """``feature_changes`` carries no Delta transaction id: a batch replayed after its writes
    committed (killed before Spark recorded it done) appends its window rows again, the same
    rows, and every reader still sees one state per window."""
    from pipeline.detection import window_states

    none = ModelScorer(f"sqlite:///{tmp_path / 'none.db'}", "absent")
    running = FeaturesBatchWriter(lake, none)
    running(rogue_device_windows(spark, lake, (0, 1)), 6)
    later = rogue_device_windows(spark, lake, (1, 2))
    running(later, 7)
    running.settle()

    def read(name: str) -> list[Any]:
        return sorted(spark.read.format("delta").load(lake_table(lake, name)).collect())

    alerts, windows = read("alerts"), sorted(window_states(spark, lake).collect())
    changes = read("feature_changes")
    restarted = FeaturesBatchWriter(lake, none)
    restarted(later, 7)  # a restart, and batch 7 again
    restarted.settle()

    assert read("alerts") == alerts
    assert sorted(window_states(spark, lake).collect()) == windows
    again = read("feature_changes")
    assert len(again) == len(changes) + later.count()  # batch 7's rows twice, the same rows
    assert {r for r in again if r.batch_id == 7} == {r for r in changes if r.batch_id == 7}


# Where batch 7 dies: (what closes, the write that fails, whether Spark runs batch 7 again). A
# write the batch left to run after it has returned fails after Spark recorded the batch done
# (then the next batch comes), or before it did (then batch 7 comes again).
CRASHES = [
    ("closes nothing", "new alerts", True),
    ("closes windows", "new alerts", True),
    ("closes windows", "window changes", True),
    ("closes windows", "final values", False),
    ("closes windows", "final values", True),
    ("closes windows", "closed windows", False),
    ("closes windows", "closed windows", True),
]


@pytest.mark.parametrize(("kind", "dies_in", "replayed"), CRASHES)
def test_a_batch_killed_within_its_writes_leaves_the_tables_as_a_run_without_one(
    spark: Any, lake: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    kind: str, dies_in: str, replayed: bool,
) -> None:  # fmt: skip
    """A batch writes its new alerts beside its window changes (which mark it done), and
    returns; the alerts of the windows it closed (their final values MERGEd), then those
    windows, go to ``alerts`` and ``features`` after it. Killed in any of these writes, then
    started again (batch 7 again, or the next one), the pipeline leaves every table as a run
    that was never killed."""
    from pipeline import alerts, detection
    from pipeline.detection import window_states

    start = datetime(2026, 11, 22, 8, 0, tzinfo=timezone.utc)
    # Batch 6: an unregistered device's first hour, and another's reading at 1:04:55, so the
    # watermark closes the windows ending by 0:59:55. Batch 7: the first device's next readings,
    # a new window of its own and, in "closes windows", readings that close older windows; its
    # rogue_device alerts then get their final values. Batch 8: ten more minutes.
    later = 10 if kind == "closes nothing" else 40
    first = [
        device_series("rogue", start, 120),
        device_series("other", start + timedelta(minutes=64, seconds=55), 1),
    ]
    then = [device_series("rogue", start + timedelta(hours=1), later)]
    last = [device_series("rogue", start + timedelta(hours=1, seconds=30 * later), 20)]
    step = {"new alerts": (alerts.AlertWrites, "append"), "window changes": (detection, "append"),
            "final values": (alerts, "merge_alerts"),
            "closed windows": (detection, "idempotent_append")}[dies_in]  # fmt: skip
    reference = str(tmp_path / "reference")
    none = ModelScorer(f"sqlite:///{tmp_path / 'none.db'}", "absent")
    called: list[bool] = []
    for root in (reference, lake):
        batches = [windows_of(spark, root, *rows) for rows in (first, then, last)]
        running = FeaturesBatchWriter(root, none)
        running(batches[0], 6)
        if root == reference:
            running(batches[1], 7)
            running(batches[2], 8)
            running.settle()
            continue
        running.settle()

        def killed(*args: Any, **_kwargs: Any) -> None:
            if dies_in == "final values" and not len(args[1]):
                return  # a write with nothing to MERGE (the batch's own): no MERGE to kill
            called.append(True)
            raise RuntimeError("killed within batch 7's writes")

        monkeypatch.setattr(*step, killed)
        try:
            running(batches[1], 7)
            running.settle()  # the closed windows' writes, after the batch
        except RuntimeError as exc:
            assert "batch" in str(exc) or "killed" in str(exc.__cause__)
        monkeypatch.undo()
        assert called, f"batch 7 never reached its {dies_in}: the test would see nothing"
        # A restart: a new writer loads what the tables hold, and Spark runs batch 7 again if
        # it had not recorded it done, then batch 8.
        again = FeaturesBatchWriter(root, none)
        if replayed:
            again(batches[1], 7)
        again(batches[2], 8)
        again.settle()

    assert table_rows(spark, lake, "alerts") == table_rows(spark, reference, "alerts")
    assert table_rows(spark, lake, "features") == table_rows(spark, reference, "features")
    assert sorted(window_states(spark, lake).collect()) == sorted(
        window_states(spark, reference).collect())  # fmt: skip
    new = [r for r in table_rows(spark, lake, "alerts") if r.batch_id == 7]
    assert new, "batch 7 raised no alert: the test would see no lost alert"
    # Batch 6 closed the windows ending by 0:59:55, batch 7 those ending by its newest event
    # less the watermark (five minutes).
    naive = start.replace(tzinfo=None)
    newest = max(timedelta(minutes=64, seconds=55), timedelta(hours=1, seconds=30 * (later - 1)))
    closed_by_7 = [r for r in table_rows(spark, reference, "features")
                   if naive + timedelta(minutes=55) < r.window_end
                   <= naive + newest - timedelta(minutes=5)]  # fmt: skip
    assert bool(closed_by_7) == (kind == "closes windows")


def test_a_closed_windows_merge_runs_after_the_next_batchs_alerts_and_a_later_batch_waits_for_it(
    spark: Any, lake: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The batch that closes windows returns before their alerts' final values are MERGEd. The
    MERGE runs once the next batch has written its alerts, so that batch writes them at once
    (an append committed while the MERGE runs would fail it); a later batch with alerts waits
    for the MERGE. The tables end as those of a run whose MERGEs were quick."""
    import threading

    from pipeline import alerts

    start = datetime(2026, 11, 22, 8, 0, tzinfo=timezone.utc)
    # As in the test above: batch 7 closes the rogue device's first windows (their alerts'
    # final values MERGEd) and raises alerts on a new window; batches 8 and 9 raise more.
    first = [
        device_series("rogue", start, 120),
        device_series("other", start + timedelta(minutes=64, seconds=55), 1),
    ]
    then = [device_series("rogue", start + timedelta(hours=1), 40)]
    later = [device_series("rogue", start + timedelta(hours=1, minutes=20), 20)]
    last = [device_series("rogue", start + timedelta(hours=1, minutes=30), 20)]
    none = ModelScorer(f"sqlite:///{tmp_path / 'none.db'}", "absent")
    reference = str(tmp_path / "reference")
    quick = FeaturesBatchWriter(reference, none)
    for batch_id, rows in enumerate((first, then, later, last), start=6):
        quick(windows_of(spark, reference, *rows), batch_id)
    quick.settle()

    batches = [windows_of(spark, lake, *rows) for rows in (first, then, later, last)]
    writer = FeaturesBatchWriter(lake, none)
    writer(batches[0], 6)
    writer.settle()
    merge, opened, merging = alerts.merge_alerts, threading.Event(), threading.Event()

    def gated(spark: Any, rows: Any, path: str) -> None:
        if len(rows):  # every write calls it, most with nothing to MERGE
            merging.set()
            assert opened.wait(120), "the test never let the MERGE go on"
        merge(spark, rows, path)

    monkeypatch.setattr(alerts, "merge_alerts", gated)
    table = lake_table(lake, "alerts")

    def run(batch_id: int, wait_s: float) -> threading.Thread:
        thread = threading.Thread(target=writer, args=(batches[batch_id - 6], batch_id))
        thread.start()
        thread.join(wait_s)
        return thread

    try:
        assert not run(7, 60).is_alive()
        # Its closed windows' model and appends run after it; their MERGE waits for batch 8.
        assert not merging.wait(5), "batch 7's MERGE ran before the next batch's alerts"
        assert not run(8, 60).is_alive(), "batch 8 waited for the MERGE of batch 7's windows"
        eighths = [r for r in table_rows(spark, lake, "alerts") if r.batch_id == 8]
        assert eighths, "batch 8 raised no alert: the test would see no wait"
        assert merging.wait(60), "batch 7 MERGEd nothing: the test would see no wait"
        versions = spark.sql(f"DESCRIBE HISTORY delta.`{table}`").count()
        ninth = run(9, 20)
        # Batch 9 has its alerts, and waits for the MERGE to write them.
        assert ninth.is_alive()
        assert spark.sql(f"DESCRIBE HISTORY delta.`{table}`").count() == versions
    finally:
        opened.set()
    ninth.join(120)
    assert not ninth.is_alive()
    writer.settle()
    monkeypatch.undo()

    assert table_rows(spark, lake, "alerts") == table_rows(spark, reference, "alerts")
    assert table_rows(spark, lake, "features") == table_rows(spark, reference, "features")
    ninths = [r for r in table_rows(spark, lake, "alerts") if r.batch_id == 9]
    assert ninths, "batch 9 raised no alert"


def test_a_closed_windows_merge_starts_at_a_status_tick_when_no_next_batch_came(
    spark: Any, lake: str, tmp_path: Path
) -> None:
    """No new data, no next batch: the MERGE and ``features`` append a closing batch left for
    after the next batch start at the first status tick that finds no batch since the last."""
    import time

    start = datetime(2026, 11, 22, 8, 0, tzinfo=timezone.utc)
    first = [device_series("rogue", start, 120)]
    then = [device_series("rogue", start + timedelta(hours=1), 40)]
    batches = [windows_of(spark, lake, *rows) for rows in (first, then)]
    writer = FeaturesBatchWriter(lake, ModelScorer(f"sqlite:///{tmp_path / 'none.db'}", "absent"))
    writer(batches[0], 6)
    writer.settle()
    before = len(table_rows(spark, lake, "features"))
    writer(batches[1], 7)  # closes the windows ending by 1:14:30

    writer.write_if_idle()  # batch 7 ran since the last tick: the next batch may come
    time.sleep(5)
    assert len(table_rows(spark, lake, "features")) == before
    writer.write_if_idle()  # none came
    deadline = time.monotonic() + 120
    while len(table_rows(spark, lake, "features")) == before and time.monotonic() < deadline:
        time.sleep(0.5)
    closed = [r for r in table_rows(spark, lake, "features")
              if r.window_end <= datetime(2026, 11, 22, 9, 14, 30)]  # fmt: skip
    assert len(closed) > before


def test_an_alert_keeps_its_raised_values_until_its_window_closes_or_the_query_stops(
    spark: Any, lake: str, tmp_path: Path
) -> None:
    writer = FeaturesBatchWriter(lake, ModelScorer(f"sqlite:///{tmp_path / 'none.db'}", "absent"))
    path = lake_table(lake, "alerts")
    start = datetime(2026, 11, 22, 8, 0)

    def last_event_times() -> dict[datetime, datetime]:
        rows = spark.read.format("delta").load(path).collect()
        assert len({r.alert_id for r in rows}) == len(rows)
        return {r.window_start: r.last_event_time for r in rows}

    # The unregistered device's readings every 30 s, as the stream's windows grow.
    writer(rogue_device_windows(spark, lake, (0, 0.05)), 0)  # up to 08:02:30
    raised = last_event_times()
    assert raised[start] == start + timedelta(minutes=2, seconds=30)
    writer(rogue_device_windows(spark, lake, (0, 0.11)), 1)  # up to 08:06:00: the window grew
    grown = last_event_times()
    assert grown[start] == raised[start]  # no MERGE for a window still filling
    assert grown[start + timedelta(minutes=5)] == start + timedelta(minutes=6)  # a new alert
    writer.finish(spark)  # the query stopped: open windows' alerts get their latest values
    assert last_event_times()[start] == start + timedelta(minutes=6)
    writer(rogue_device_windows(spark, lake, (0, 1)), 2)  # up to 08:59:30: 08:00-08:10 closed
    writer.settle()  # its closed windows' alerts and features, after the batch
    final = last_event_times()
    assert final[start] == start + timedelta(minutes=9, seconds=30)
    assert len(final) == 13  # one per window start, 07:55 to 08:55
    writer(rogue_device_windows(spark, lake, (0, 1)), 2)  # replayed: nothing changes
    assert last_event_times() == final


def test_a_rule_alert_its_finished_window_does_not_call_for_is_withdrawn(
    spark: Any, lake: str, tmp_path: Path, bootstrap: str, make_topic: Callable[..., str]
) -> None:
    """... and every change is published to the alerts topic before it is written: the latest
    message of each alert is its row in the table."""
    from pipeline.features import features_from_events
    from pipeline.publish import AlertPublisher
    from pipeline.sinks import ensure_tables
    from tests.unit.pipeline.test_rules import events_df, registry_df

    ensure_tables(spark, lake)
    topic = make_topic(partitions=2)
    publish = AlertPublisher({"bootstrap.servers": bootstrap}, topic)
    writer = FeaturesBatchWriter(lake, ModelScorer(f"sqlite:///{tmp_path / 'none.db'}", "absent"),
                                 publish=publish)  # fmt: skip
    start = datetime(2026, 11, 22, 8, 0, tzinfo=timezone.utc)
    # "stuck" reads 21.5 °C for its first five minutes, then varies; "clean" 21.5 °C all along.
    recovers = device_series("stuck", start, 120)
    for event in recovers[:10]:
        event["metrics"]["temperature_c"] = 21.5
    constant = device_series("clean", start, 120, metrics={"temperature_c": 21.5})

    def windows(events: list[dict[str, Any]]) -> Any:
        features = features_from_events(
            events_df(spark, events), registry_df(spark), window="10 minutes", slide="5 minutes"
        )
        return features.localCheckpoint()

    def stuck_alerts() -> dict[tuple[str, datetime], str]:
        rows = spark.read.format("delta").load(lake_table(lake, "alerts")).collect()
        return {(r.device_id, r.window_start.replace(tzinfo=timezone.utc)): r.status
                for r in rows if r.alert_type == "stuck_sensor"}  # fmt: skip

    # The windows holding 08:00-08:04:30: 07:55-08:05 holds nothing else, 08:00-08:10 fills on.
    first = [start - timedelta(minutes=5), start]

    def operations() -> list[str]:
        history = spark.sql(f"DESCRIBE HISTORY delta.`{lake_table(lake, 'alerts')}`")
        return [r.operation for r in history.orderBy("version").collect()]

    writer(windows(recovers[:10] + constant[:10]), 0)
    assert stuck_alerts() == {(d, w): "raised" for d in ("stuck", "clean") for w in first}
    before_close = len(operations())
    writer(windows(recovers + constant), 1)  # to 08:59:30: both windows closed
    writer.settle()  # its closed windows' alerts and features, after the batch
    # The new alerts appended; final values and the withdrawal in one MERGE.
    assert operations()[before_close:] == ["WRITE", "MERGE"]
    after = stuck_alerts()
    assert {(d, w): after[(d, w)] for d in ("stuck", "clean") for w in first} == {
        ("stuck", first[0]): "raised", ("stuck", start): "withdrawn",
        ("clean", first[0]): "raised", ("clean", start): "raised",
    }  # fmt: skip
    assert [k for k, status in after.items() if status == "withdrawn"] == [("stuck", start)]
    assert latest_alerts(bootstrap, topic) == table_alerts(lake)
    published = len(topic_messages(bootstrap, topic))
    table = spark.read.format("delta").load(lake_table(lake, "alerts")).drop("detected_at")
    before = sorted(table.collect())
    # Replayed after a crash that came after its writes: a new writer, its state read from the
    # tables, decides the same and writes and publishes nothing.
    replayed = FeaturesBatchWriter(
        lake, ModelScorer(f"sqlite:///{tmp_path / 'none.db'}", "absent"), publish=publish
    )
    replayed(windows(recovers + constant), 1)
    replayed.settle()
    assert sorted(table.collect()) == before
    assert len(topic_messages(bootstrap, topic)) == published


def test_windows_rebuilt_from_the_topic_raise_no_alert_twice(
    spark: Any, lake: str, tmp_path: Path
) -> None:
    import shutil

    features = rogue_device_windows(spark, lake)
    none = ModelScorer(f"sqlite:///{tmp_path / 'none.db'}", "absent")
    first = FeaturesBatchWriter(lake, none)
    first(features, 0)
    first.settle()
    path = lake_table(lake, "alerts")
    before = sorted(spark.read.format("delta").load(path).drop("detected_at").collect())
    # As after an upgrade (README): features tables and detection checkpoint deleted, the
    # windows rebuilt from the topic under a new checkpoint id.
    for table in ("features", "feature_changes"):
        shutil.rmtree(lake_table(lake, table))
    rebuilt = FeaturesBatchWriter(lake, none, app_id="after-upgrade")
    rebuilt(features, 0)
    rebuilt.settle()

    after = sorted(spark.read.format("delta").load(path).drop("detected_at").collect())
    assert len(before) > 0 and after == before


def test_an_unreadable_model_registry_leaves_the_rules_running_and_says_so_once(
    spark: Any, lake: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # What a pipeline killed while it set up a fresh SQLite store used to leave behind: every
    # later start failed its first features batch ("table _alembic_tmp_experiments already
    # exists"), so the pipeline could not run at all.
    features = rogue_device_windows(spark, lake)
    store = tmp_path / "broken.db"
    store.write_bytes(b"not a SQLite database, whatever MLflow expects" * 100)
    writer = FeaturesBatchWriter(lake, ModelScorer(f"sqlite:///{store}", MODEL))

    with caplog.at_level("ERROR", logger="pipeline.scoring"):
        writer(features, 1)
        writer(features, 2)
        writer.settle()

    alerts = spark.read.format("delta").load(lake_table(lake, "alerts")).collect()
    assert {a.alert_type for a in alerts} == {"rogue_device"}
    said = [r.getMessage() for r in caplog.records if "cannot be read" in r.getMessage()]
    assert len(said) == 1 and "running rules only" in said[0] and str(store) in said[0]


def test_a_missing_sqlite_store_means_rules_only_and_is_not_created(tmp_path: Path) -> None:
    store = tmp_path / "absent" / "mlflow.db"
    scorer = ModelScorer(f"sqlite:///{store}", MODEL)
    assert scorer.current([]) is None
    assert not store.exists()


def test_a_model_that_cannot_score_leaves_the_rules_running_and_says_so_once(
    spark: Any, lake: str, tmp_path: Path, mlflow_uri: str, caplog: pytest.LogCaptureFixture
) -> None:
    features = rogue_device_windows(spark, lake)
    writer = FeaturesBatchWriter(lake, ModelScorer(mlflow_uri, MODEL))

    def alert_types() -> set[tuple[str, str | None]]:
        writer.settle()  # the closed windows' alerts are written after the batch
        alerts = spark.read.format("delta").load(lake_table(lake, "alerts")).collect()
        return {(a.alert_type, a.model_version) for a in alerts}

    # A model needing a window statistic the stream does not compute, then one that raises.
    lacking = register_model(mlflow_uri, tmp_path, BusyWindow(1),
                             BUSY_EXAMPLE.assign(voltage_v_kurtosis=[0.1, 0.2]))  # fmt: skip
    writer(features, 1)
    writer(features, 2)
    broken = register_model(mlflow_uri, tmp_path, Broken(), BUSY_EXAMPLE)
    writer(features, 3)
    writer(features, 4)

    assert alert_types() == {("rogue_device", None)}  # the rules kept alerting
    errors = [r.getMessage() for r in caplog.records if r.name == "pipeline.scoring"]
    assert len(errors) == 2, errors  # once per version, not once per batch
    assert f"version {lacking} " in errors[0]
    assert "lack its inputs ['voltage_v_kurtosis']" in errors[0]
    assert f"version {broken} " in errors[1] and "power_w_slope" in errors[1]

    # The alias moves to a model that works: the next batch scores with it.
    good = register_busy_window_model(mlflow_uri, tmp_path, min_events=1)
    writer(rogue_device_windows(spark, lake, hours=(2, 3)), 5)  # windows the model has not seen
    assert ("model_anomaly", good) in alert_types()
