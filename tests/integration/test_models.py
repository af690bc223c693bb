"""Models on real parts: training on a small simulated history (Spark, the pipeline's feature
code and profiles), registration in a SQLite MLflow store, scoring by alias as the pipeline does,
and champion / challenger / rollback through the CLI."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest
from pyspark.sql import SparkSession

from iotfraud.training import simulate
from models import cli, registry
from models.dataset import History, scoring_rows, simulated_events
from models.settings import ModelSettings
from models.train import TrainResult, champion_score, train
from pipeline.features import batch_feature_input, features_from_events
from pipeline.profiles import RELATIVE_FEATURES, ProfileSpec
from pipeline.scoring import ModelScorer, model_alerts
from tests.mlflow_helpers import BUSY_EXAMPLE, Broken, BusyWindow, register_model

pytestmark = pytest.mark.integration
NAME = "iot-fraud-test"  # the same registered model name as tests.mlflow_helpers.MODEL


@dataclass
class Trained:
    settings: ModelSettings
    uri: str
    first: TrainResult


@pytest.fixture(scope="module")
def trained(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Trained:
    folder = tmp_path_factory.mktemp("models")
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    settings = ModelSettings(
        name=NAME, devices=40, hours=1.5, holdout_hours=1.0, scenario_rate=150,
        seed=3, holdout_seed=4, workdir=str(folder / "work"),
    )  # fmt: skip
    first = train(spark, settings, uri, window="10 minutes", slide="5 minutes", spec=ProfileSpec(),
                  history_source=simulate)  # fmt: skip
    return Trained(settings, uri, first)


def aliases(uri: str) -> dict[str, str]:
    model = registry.client(uri).get_registered_model(NAME)
    return {alias: str(version) for alias, version in model.aliases.items()}


def test_training_logs_metrics_and_plots_and_registers_the_champion(trained: Trained) -> None:
    first = trained.first
    assert first.promoted and aliases(trained.uri) == {"champion": first.version}
    client = registry.client(trained.uri)
    run = client.get_run(client.get_model_version(NAME, first.version).run_id)
    metrics = run.data.metrics
    for name in ("holdout_model_precision", "holdout_model_recall", "holdout_model_f1",
                 "holdout_model_pr_auc", "holdout_all_recall", "holdout_tampering_recall",
                 "holdout_all_median_time_to_detect_s",
                 "holdout_false_alerts_per_10k_clean_windows"):  # fmt: skip
        assert name in metrics, name
    assert run.data.params["seed"] == "3" and "deviation_threshold" in run.data.params
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"confusion_matrix.png", "pr_curve.png", "holdout_by_scenario.csv"} <= artifacts
    # Rules and model together catch most injected fraud even on this small fleet.
    assert metrics["holdout_all_recall"] >= 0.7
    assert metrics["holdout_all_precision"] >= 0.9


def test_the_pipeline_scores_windows_with_the_champion_by_alias(
    spark: SparkSession, trained: Trained
) -> None:
    work = Path(trained.settings.workdir) / "holdout"
    events = batch_feature_input(simulated_events(spark, work / "landing"))
    devices = spark.read.format("delta").load(str(work / "lake" / "devices"))
    windows = features_from_events(events, devices, window="10 minutes", slide="5 minutes")
    rows, _ = scoring_rows(windows.toPandas(), ProfileSpec())
    rows = rows[rows["scorable"]].reset_index(drop=True)
    model = ModelScorer(trained.uri, NAME).current(rows.columns)
    assert model is not None and model.version == trained.first.version
    assert model.threshold == 0.5
    assert ("rel_temperature_c_level", "double") in model.inputs
    assert not any(name == "device_type" for name, _ in model.inputs)  # itself, not its type
    scores = model.score(rows)
    alerts = model_alerts(rows, scores, model)
    assert len(alerts), "the held-out fleet has injected anomalies the model must flag"
    assert set(zip(alerts["alert_type"], alerts["model_name"], alerts["model_version"],
                   strict=True)) == {("model_anomaly", NAME, trained.first.version)}  # fmt: skip
    assert alerts["score"].between(0.5, 1.0).all()
    assert all("sd of its own normal" in r[0] for r in alerts["reasons"])
    # Flagged devices had a scenario injected (the model is precise on the held-out fleet).
    truth = trained.first.report  # per scenario; the flagged devices come from the holdout truth
    assert truth.loc[truth["scenario"] == "all", "precision"].item() >= 0.9


def test_a_candidate_that_does_not_beat_the_champion_is_the_challenger_and_cli_moves_aliases(
    spark: SparkSession,
    trained: Trained,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Same data and seed: the same score, and a tie keeps the champion.
    second = train(spark, trained.settings, trained.uri, window="10 minutes", slide="5 minutes",
                   spec=ProfileSpec(), history_source=simulate)  # fmt: skip
    v1, v2 = trained.first.version, second.version
    assert not second.promoted and second.champion_score == trained.first.score
    assert aliases(trained.uri) == {"champion": v1, "challenger": v2}

    monkeypatch.setenv("MLFLOW_TRACKING_URI", trained.uri)
    monkeypatch.setenv("IOT_MODEL_NAME", NAME)
    assert cli.main(["models", "promote", v2]) == 0
    assert aliases(trained.uri) == {"champion": v2, "previous": v1}
    assert cli.main(["models", "rollback"]) == 0
    assert aliases(trained.uri) == {"champion": v1, "previous": v2}
    assert cli.main(["models", "promote", "99"]) == 2
    assert "has no version 99" in capsys.readouterr().err
    assert cli.main(["models", "list"]) == 0
    listing = capsys.readouterr().out
    lines = {line.split()[1]: line for line in listing.splitlines()}
    assert "champion" in lines[f"v{v1}"] and "previous" in lines[f"v{v2}"]


def test_a_champion_that_cannot_score_the_current_features_does_not_block_promotion(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    relative = pd.DataFrame({name: [0.1, -0.2] for name in RELATIVE_FEATURES})
    register_model(uri, tmp_path, Broken(), relative)
    holdout = History(relative.assign(label=["clean", "clean"], scorable=[True, True]),
                      truth=pd.DataFrame(), rule_alerts=pd.DataFrame())  # fmt: skip

    assert champion_score(uri, NAME, holdout, None) is None  # so any candidate beats it
    assert "cannot score the current features" in caplog.text and "power_w_slope" in caplog.text


def test_a_champion_of_an_earlier_release_does_not_count_against_a_candidate(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    register_model(uri, tmp_path, BusyWindow(1), BUSY_EXAMPLE)  # absolute window statistics
    holdout = History(BUSY_EXAMPLE.assign(label=["clean", "clean"], scorable=[True, True]),
                      truth=pd.DataFrame(), rule_alerts=pd.DataFrame())  # fmt: skip

    assert champion_score(uri, NAME, holdout, None) is None
    assert "an earlier release" in caplog.text


def test_an_unsigned_champion_is_not_loaded_by_training_and_does_not_count(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    relative = pd.DataFrame({name: [0.1, -0.2] for name in RELATIVE_FEATURES})
    # Broken() raises when it scores: loaded, it would say "cannot score" instead.
    register_model(uri, tmp_path, Broken(), relative, sign=False)
    holdout = History(relative.assign(label=["clean", "clean"], scorable=[True, True]),
                      truth=pd.DataFrame(), rule_alerts=pd.DataFrame())  # fmt: skip

    assert champion_score(uri, NAME, holdout, None) is None
    assert "is not loaded" in caplog.text and "iotfraud.artifact_digest" in caplog.text
    assert "cannot score" not in caplog.text
