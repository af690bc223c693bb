"""The pipeline loads only registered models whose files match the digest recorded when they
were registered (issue 24: model trust). Real MLflow store, real pipeline batches.

Loading a pyfunc unpickles it, and unpickling runs code: before this check, anyone who could
write to the registry or its artifact store ran code in the pipeline.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import mlflow
import pytest

from infra import lake as tables
from infra.model_trust import DIGEST_TAG
from models import cli as models_cli
from pipeline.detection import FeaturesBatchWriter
from pipeline.scoring import ModelScorer
from tests.integration.test_detection import rogue_device_windows
from tests.mlflow_helpers import BUSY_EXAMPLE, MODEL, BusyWindow, register_model

pytestmark = pytest.mark.integration


def stored_files(tracking_uri: str, version: str) -> Path:
    """Where the artifact store keeps the files of ``version`` (a local folder here)."""
    client = mlflow.MlflowClient(tracking_uri, registry_uri=tracking_uri)
    return Path(urlparse(client.get_model_version_download_uri(MODEL, version)).path)


class RunsCodeWhenLoaded:
    """A pickle that creates ``marker`` when it is unpickled: what an attacker would store."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.touch, (self.marker,))


def alert_types(spark: Any, lake: str) -> set[tuple[str, str | None]]:
    alerts = spark.read.format("delta").load(tables.table_path(lake, "alerts")).collect()
    return {(a.alert_type, a.model_version) for a in alerts}


def test_a_pickle_swapped_into_the_store_is_never_loaded_and_the_rules_run_on(
    spark: Any, lake: str, tmp_path: Path, mlflow_uri: str, caplog: pytest.LogCaptureFixture
) -> None:
    version = register_model(mlflow_uri, tmp_path, BusyWindow(1), BUSY_EXAMPLE)
    marker = tmp_path / "code-ran"
    (stored_files(mlflow_uri, version) / "python_model.pkl").write_bytes(
        pickle.dumps(RunsCodeWhenLoaded(marker))
    )
    writer = FeaturesBatchWriter(lake, ModelScorer(mlflow_uri, MODEL))
    with caplog.at_level("ERROR", logger="pipeline.scoring"):
        writer(rogue_device_windows(spark, lake), 1)
        writer.settle()  # the closed windows' alerts are written after the batch

    assert not marker.exists(), "the pipeline unpickled a file changed after registration"
    assert alert_types(spark, lake) == {("rogue_device", None)}  # rules only
    errors = [r.getMessage() for r in caplog.records if r.name == "pipeline.scoring"]
    assert len(errors) == 1
    assert f"model {MODEL} version {version} do not match the digest" in errors[0]


def test_an_unsigned_version_is_refused_until_signed(
    spark: Any, lake: str, tmp_path: Path, mlflow_uri: str, caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    version = register_model(mlflow_uri, tmp_path, BusyWindow(1), BUSY_EXAMPLE, sign=False)
    writer = FeaturesBatchWriter(lake, ModelScorer(mlflow_uri, MODEL))
    with caplog.at_level("ERROR", logger="pipeline.scoring"):
        writer(rogue_device_windows(spark, lake), 1)
        writer.settle()  # the closed windows' alerts are written after the batch
    assert alert_types(spark, lake) == {("rogue_device", None)}
    errors = [r.getMessage() for r in caplog.records if r.name == "pipeline.scoring"]
    assert len(errors) == 1 and f"has no {DIGEST_TAG} tag" in errors[0], errors

    # The data scientist checks the files and signs the version: the next batch scores with it.
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_uri)
    monkeypatch.setenv("IOT_MODEL_NAME", MODEL)
    assert models_cli.main(["models", "sign", version]) == 0
    assert f"version {version} signed (sha256)" in capsys.readouterr().out
    writer(rogue_device_windows(spark, lake, hours=(2, 3)), 2)
    writer.settle()
    assert ("model_anomaly", version) in alert_types(spark, lake)


def test_with_a_signing_key_only_versions_signed_with_it_are_loaded(
    tmp_path: Path, mlflow_uri: str
) -> None:
    columns = list(BUSY_EXAMPLE.columns)
    signed = register_model(mlflow_uri, tmp_path, BusyWindow(1), BUSY_EXAMPLE, key="team-key")
    loaded = ModelScorer(mlflow_uri, MODEL, signing_key="team-key").current(columns)
    assert loaded is not None and loaded.version == signed
    assert ModelScorer(mlflow_uri, MODEL, signing_key="other-key").current(columns) is None
    assert ModelScorer(mlflow_uri, MODEL).current(columns) is None  # signed, no key here
    # Anyone able to write tags can record a plain digest: with a key set, it does not load.
    plain = register_model(mlflow_uri, tmp_path, BusyWindow(1), BUSY_EXAMPLE)
    assert ModelScorer(mlflow_uri, MODEL, signing_key="team-key").current(columns) is None
    loaded = ModelScorer(mlflow_uri, MODEL).current(columns)
    assert loaded is not None and loaded.version == plain
