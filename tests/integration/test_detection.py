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
from tests.pipeline_helpers import device_series, encoded, produce, write_registry

pytestmark = pytest.mark.integration

MODEL = "iot-fraud-test"


def register_busy_window_model(tracking_uri: str, tmp_path: Path, min_events: float) -> str:
    """A pyfunc that scores 1.0 for windows with at least ``min_events`` events."""
    import mlflow
    import pandas as pd
    from mlflow.models import infer_signature

    class BusyWindow(mlflow.pyfunc.PythonModel):  # type: ignore[misc]
        def __init__(self, min_events: float) -> None:
            self.min_events = min_events

        def predict(self, context: Any, model_input: pd.DataFrame, params: Any = None) -> Any:
            return (model_input["event_count"] >= self.min_events).astype(float)

    mlflow.set_tracking_uri(tracking_uri)
    mlflow.set_registry_uri(tracking_uri)
    client = mlflow.MlflowClient()
    if client.get_experiment_by_name("detect") is None:
        client.create_experiment("detect", artifact_location=(tmp_path / "art").as_uri())
    mlflow.set_experiment("detect")
    example = pd.DataFrame({"event_count": [1.0, 30.0], "voltage_v_mean": [230.0, 231.0]})
    model = BusyWindow(min_events)
    with mlflow.start_run():
        info = mlflow.pyfunc.log_model(
            name="model",
            python_model=model,
            signature=infer_signature(example, model.predict(None, example)),
            input_example=example,
            registered_model_name=MODEL,
            metadata={"threshold": 0.5},
        )
    version = str(info.registered_model_version)
    client.set_registered_model_alias(MODEL, "champion", version)
    return version


def test_model_alerts_carry_the_version_and_follow_the_alias(
    spark: Any, bootstrap: str, make_topic: Callable[..., str], lake: str, tmp_path: Path,
    mlflow_uri: str,
) -> None:  # fmt: skip
    topic = make_topic(partitions=2)
    now = datetime.now(timezone.utc)
    start = now.replace(minute=now.minute - now.minute % 10, second=0, microsecond=0) - timedelta(
        hours=2
    )
    write_registry(lake, ["busy", "quiet"])
    v1 = register_busy_window_model(mlflow_uri, tmp_path, min_events=15)
    settings = PipelineSettings(
        lake_root=lake, checkpoint_root=str(tmp_path / "cp"), bootstrap_servers=bootstrap,
        topic=topic, window="10 minutes", slide="5 minutes", watermark="30 minutes",
        mlflow_tracking_uri=mlflow_uri, model_name=MODEL, firmware_topic="",
    )  # fmt: skip
    pipeline = job.start(spark, settings)

    def process() -> None:
        for query in pipeline.queries:
            query.processAllAvailable()
        pipeline.queries[1].processAllAvailable()

    def model_alerts() -> list[Any]:
        alerts = spark.read.format("delta").load(lake_table(lake, "alerts"))
        return alerts.where("alert_type = 'model_anomaly'").collect()

    try:
        produce(bootstrap, topic, encoded(
            device_series("busy", start, 20) + device_series("quiet", start, 5, every_s=60)
        ))  # fmt: skip
        process()
        first = model_alerts()
        assert first and {a.device_id for a in first} == {"busy"}
        assert {(a.model_name, a.model_version) for a in first} == {(MODEL, v1)}

        v2 = register_busy_window_model(mlflow_uri, tmp_path, min_events=3)  # moves the alias
        later = start + timedelta(minutes=30)
        produce(bootstrap, topic, encoded(device_series("quiet", later, 5, every_s=60)))
        process()
        new = [a for a in model_alerts() if a.window_start >= later.replace(tzinfo=None)]
        assert new and {(a.device_id, a.model_version) for a in new} == {("quiet", v2)}
        # Alerts already raised keep the version that scored them.
        assert {a.model_version for a in model_alerts() if a.device_id == "busy"} == {v1}
    finally:
        pipeline.stop()


def lake_table(root: str, name: str) -> str:
    return lake.table_path(root, name)


def test_replayed_batch_changes_no_alert(spark: Any, lake: str, tmp_path: Path) -> None:
    from pipeline.features import features_from_events
    from pipeline.sinks import ensure_tables
    from tests.unit.pipeline.test_rules import events_df, registry_df

    ensure_tables(spark, lake)
    start = datetime(2026, 11, 22, 8, 0, tzinfo=timezone.utc)
    events = events_df(spark, device_series("rogue", start, 20, firmware="6.6.6"))
    features = features_from_events(
        events, registry_df(spark), window="10 minutes", slide="5 minutes"
    )
    writer = FeaturesBatchWriter(lake, ModelScorer(f"sqlite:///{tmp_path / 'none.db'}", "absent"))

    writer(features, 7)
    alerts_path = lake_table(lake, "alerts")
    before = spark.read.format("delta").load(alerts_path).drop("detected_at").collect()
    writer(features, 7)  # the same micro-batch again, as after a crash
    after = spark.read.format("delta").load(alerts_path).drop("detected_at").collect()

    assert len(before) > 0
    assert sorted(before) == sorted(after)
    assert {a.alert_type for a in after} == {"rogue_device"}  # unregistered: firmware unknown
