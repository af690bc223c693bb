"""``iotfraud train``: simulate history (with the ``HistorySource`` passed in), fit the detector,
evaluate it on a held-out fleet, log everything to MLflow, register the model, and promote it only
if it beats the champion.

The held-out fleet (its own seed) is the same for every run with the same settings, so the
candidate and the current champion are compared on identical windows.
"""

from __future__ import annotations

import json
import logging
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from pyspark.sql import SparkSession

from infra import contract as c
from infra.mlflow_store import artifact_root_for, ensure_experiment
from infra.model_trust import UntrustedModelError, load_trusted, sign_version
from models import registry
from models.dataset import ALERT_COLUMNS, Fleet, History, HistorySource, simulated_history
from models.detector import MODEL_SCENARIOS, Detector, choose_threshold, fit
from models.evaluation import CLEAN, evaluate, false_alerts_per_10k
from models.pyfunc import log_detector
from models.settings import ModelSettings
from pipeline.profiles import ProfileSpec

log = logging.getLogger(__name__)


@dataclass
class TrainResult:
    version: str
    promoted: bool
    score: registry.Score
    champion_score: registry.Score | None
    report: pd.DataFrame  # per scenario, rules and model together, on the held-out fleet
    metrics: dict[str, float]


def history_alerts(history: History, scores: np.ndarray, threshold: float) -> pd.DataFrame:
    """``model_anomaly`` alerts (``ALERT_COLUMNS``) of ``history``'s windows scored at or above
    ``threshold``."""
    hits = history.features[scores >= threshold]
    columns = ["device_id", "window_start", "window_end", "last_event_time"]
    return hits[columns].assign(alert_type="model_anomaly")[ALERT_COLUMNS]


def model_score(scores: np.ndarray, labels: pd.Series, threshold: float) -> dict[str, float]:
    """Window-level precision, recall, F1 and PR-AUC of the model on its own scenarios, overall
    and per scenario (scenario windows against clean windows)."""
    from sklearn.metrics import average_precision_score, f1_score, precision_score, recall_score

    out: dict[str, float] = {}
    for scope in ("model", *MODEL_SCENARIOS):
        wanted = MODEL_SCENARIOS if scope == "model" else (scope,)
        rows = ((labels == CLEAN) | labels.isin(wanted)).to_numpy()
        truth = labels[rows].isin(wanted).to_numpy()
        if truth.sum() == 0:
            continue
        predicted = scores[rows] >= threshold
        out[f"{scope}_pr_auc"] = float(average_precision_score(truth, scores[rows]))
        out[f"{scope}_precision"] = float(precision_score(truth, predicted, zero_division=0))
        out[f"{scope}_recall"] = float(recall_score(truth, predicted, zero_division=0))
        out[f"{scope}_f1"] = float(f1_score(truth, predicted, zero_division=0))
    return out


def holdout_report(
    history: History, scores: np.ndarray, threshold: float
) -> tuple[pd.DataFrame, dict[str, float]]:
    """Rules and model together against the held-out ground truth: the per-scenario table and
    flat metrics (``holdout_<scenario>_<metric>``, false alerts per 10k clean windows)."""
    alerts = pd.concat([history.rule_alerts, history_alerts(history, scores, threshold)])
    report = evaluate(alerts, history.truth)
    metrics: dict[str, float] = {}
    for row in report.to_dict("records"):
        for name in ("precision", "recall", "f1", "median_time_to_detect_s"):
            if row[name] is not None and not pd.isna(row[name]):
                metrics[f"holdout_{row['scenario']}_{name}"] = float(row[name])
    labelled = alerts.merge(
        history.features[["device_id", "window_start", "label"]].rename(
            columns={"label": "window_label"}
        ),
        on=["device_id", "window_start"],
        how="left",
    )
    false, clean, per_10k = false_alerts_per_10k(labelled, history.labels)
    metrics.update(holdout_false_alerts=false, holdout_clean_windows=clean,
                   holdout_false_alerts_per_10k_clean_windows=per_10k)  # fmt: skip
    scored = history.features["scorable"].to_numpy()
    window_metrics = model_score(scores[scored], history.labels[scored], threshold)
    metrics.update({f"holdout_{k}": v for k, v in window_metrics.items()})
    return report, metrics


def _plots(scores: np.ndarray, labels: pd.Series, threshold: float, folder: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from sklearn.metrics import ConfusionMatrixDisplay, PrecisionRecallDisplay

    rows = ((labels == CLEAN) | labels.isin(MODEL_SCENARIOS)).to_numpy()
    truth = labels[rows].isin(MODEL_SCENARIOS).to_numpy()
    paths = []
    fig, ax = plt.subplots(figsize=(5, 4))
    ConfusionMatrixDisplay.from_predictions(
        truth, scores[rows] >= threshold, display_labels=["clean", "anomaly"], ax=ax
    )
    ax.set_title("Held-out windows")
    paths.append(folder / "confusion_matrix.png")
    fig.savefig(paths[-1], bbox_inches="tight")
    fig, ax = plt.subplots(figsize=(5, 4))
    PrecisionRecallDisplay.from_predictions(truth, scores[rows], ax=ax, name="detector")
    ax.set_title("Held-out windows: precision-recall")
    paths.append(folder / "pr_curve.png")
    fig.savefig(paths[-1], bbox_inches="tight")
    plt.close("all")
    return paths


def split_devices(frame: pd.DataFrame, fraction: float, seed: int) -> np.ndarray:
    """Boolean mask of validation rows: whole devices, so overlapping windows never straddle."""
    devices = np.sort(frame["device_id"].unique())
    rng = np.random.default_rng(seed)
    chosen = rng.choice(devices, size=max(1, round(fraction * devices.size)), replace=False)
    return frame["device_id"].isin(chosen).to_numpy()


def fit_detector(history: History, settings: ModelSettings) -> tuple[Detector, np.ndarray]:
    """The detector fitted on the training devices of ``history``'s scored windows, thresholds
    chosen on its validation devices; returns it with the validation mask (of the scored
    windows)."""
    history = history.scored
    validation = split_devices(history.features, settings.validation_fraction, settings.seed)
    frame, labels = history.features, history.labels
    detector = fit(frame[~validation], labels[~validation])
    choose_threshold(detector, frame[validation], labels[validation],
                     settings.max_false_alert_rate)  # fmt: skip
    return detector, validation


def champion_score(
    tracking_uri: str, name: str, holdout: History, key: str | None
) -> registry.Score | None:
    """The current champion scored on ``holdout`` with its own threshold; None when there is no
    champion, its files do not match their recorded digest (``key`` as in the pipeline), or it
    cannot score these windows (registered by a release with other features)."""

    version = registry.alias_version(registry.client(tracking_uri), name, registry.CHAMPION)
    if version is None:
        return None
    uri = f"models:/{name}/{version}"
    # Also points mlflow at the store, for the load below.
    if not registry.compares_with_own_normal(tracking_uri, name, version):
        log.warning("champion %s scores absolute window statistics (an earlier release): it "
                    "does not count against the candidate", uri)  # fmt: skip
        return None
    try:
        model = load_trusted(registry.client(tracking_uri), name, version, key)
    except UntrustedModelError as error:
        log.warning("champion %s is not loaded: %s. It does not count against the candidate",
                    uri, error)  # fmt: skip
        return None
    threshold = float((model.metadata.metadata or {}).get("threshold", c.MODEL_ALERT_THRESHOLD))
    schema = model.metadata.get_input_schema()
    numbers = {spec.name: "float64" for spec in schema.inputs if spec.type.name == "double"}
    try:
        frame = holdout.features[schema.input_names()].astype(numbers)
        scores = np.asarray(model.predict(frame), dtype=float)
    except Exception as error:  # e.g. registered by a release with other features
        log.warning("champion %s cannot score the current features (%r): it does not count "
                    "against the candidate", uri, error)  # fmt: skip
        return None
    scored = holdout.features["scorable"].to_numpy()
    metrics = model_score(scores[scored], holdout.labels[scored], threshold)
    return registry.Score(metrics["model_f1"], metrics["model_pr_auc"])


def holdout_scores(detector: Detector, holdout: History) -> np.ndarray:
    """Scores of every held-out window; 0 for those the stream's model does not score."""
    scores = np.zeros(len(holdout.features))
    rows = holdout.features["scorable"].to_numpy()
    if rows.any():
        scores[rows] = detector.score(holdout.features[rows])
    return scores


def train(spark: SparkSession, settings: ModelSettings, tracking_uri: str, *, window: str,
          slide: str, spec: ProfileSpec, history_source: HistorySource) -> TrainResult:  # fmt: skip
    import mlflow

    def history(seed: int, hours: float, folder: str) -> History:
        fleet = Fleet(settings.devices, hours, seed, settings.scenario_rate, settings.start_time)
        return simulated_history(
            spark, history_source, fleet, folder=Path(settings.workdir) / folder, window=window,
            slide=slide, min_overlap_s=settings.min_overlap_s, spec=spec,
        )  # fmt: skip

    history_ = history(settings.seed, settings.hours, "train")
    holdout = history(settings.holdout_seed, settings.holdout_hours, "holdout")

    detector, validation = fit_detector(history_, settings)
    frame, labels = history_.scored.features, history_.scored.labels
    scores = holdout_scores(detector, holdout)
    report, metrics = holdout_report(holdout, scores, c.MODEL_ALERT_THRESHOLD)
    score = registry.Score(metrics["holdout_model_f1"], metrics["holdout_model_pr_auc"])
    champion = champion_score(tracking_uri, settings.name, holdout, settings.signing_key())

    mlflow.set_tracking_uri(tracking_uri)
    mlflow.set_registry_uri(tracking_uri)
    experiment = ensure_experiment(
        settings.experiment, tracking_uri, artifact_root_for(tracking_uri)
    )
    params: dict[str, Any] = {
        "devices": settings.devices, "hours": settings.hours, "seed": settings.seed,
        "holdout_seed": settings.holdout_seed, "holdout_hours": settings.holdout_hours,
        "scenario_rate": settings.scenario_rate, "window": window, "slide": slide,
        "min_overlap_s": settings.min_overlap_s, "profile_span_s": spec.span_s,
        "profile_min_windows": spec.min_windows,
        "max_false_alert_rate": settings.max_false_alert_rate,
        "deviation_threshold": detector.threshold,
        "training_windows": int((~validation).sum()), "validation_windows": int(validation.sum()),
    }  # fmt: skip
    with mlflow.start_run(experiment_id=experiment) as run, tempfile.TemporaryDirectory() as tmp:
        mlflow.log_params(params)
        mlflow.log_metrics(metrics)
        folder = Path(tmp)
        report.to_csv(folder / "holdout_by_scenario.csv", index=False)
        (folder / "label_counts.json").write_text(
            json.dumps(labels.value_counts().to_dict(), indent=2)
        )
        for path in [folder / "holdout_by_scenario.csv", folder / "label_counts.json",
                     *_plots(scores, holdout.labels, c.MODEL_ALERT_THRESHOLD, folder)]:  # fmt: skip
            mlflow.log_artifact(str(path))
        info = log_detector(detector, frame, folder / "model",
                            {"deviation_threshold": detector.threshold})  # fmt: skip
        version = str(
            mlflow.register_model(
                info.model_uri, settings.name, tags={"run_id": run.info.run_id}
            ).version
        )
    mlflow_client = registry.client(tracking_uri)
    # The pipeline loads only versions whose files match this digest.
    sign_version(mlflow_client, settings.name, version, settings.signing_key())
    promoted = registry.beats(score, champion)
    if promoted:
        registry.promote(mlflow_client, settings.name, version)
    else:
        registry.make_challenger(mlflow_client, settings.name, version)
    return TrainResult(version, promoted, score, champion, report, metrics)
