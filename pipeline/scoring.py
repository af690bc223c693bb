"""The registered model, loaded by alias and swapped when the alias moves.

The model is loaded once per version, on the driver between micro-batches, and scores the
windows the watermark has closed (a few per device and slide) in pandas; each batch only asks
the registry which version the alias points to (one small query).
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from infra import contract as c
from infra.mlflow_store import aliased_version, missing_store
from infra.model_trust import DIGEST_TAG, UntrustedModelError, load_trusted
from pipeline.alerts import alert_frame, empty_alerts
from pipeline.profiles import Z_FEATURES

log = logging.getLogger(__name__)

MODEL_ALERT = "model_anomaly"


@dataclass(frozen=True)
class LoadedModel:
    name: str
    version: str
    model: Any  # mlflow.pyfunc.PyFuncModel
    inputs: tuple[tuple[str, str], ...]  # (column, MLflow type) of the signature, in order
    threshold: float

    def score(self, rows: pd.DataFrame) -> np.ndarray:
        """Scores in [0, 1] of ``rows`` (which hold every input column)."""
        frame = rows[[name for name, _ in self.inputs]].reset_index(drop=True)
        frame = frame.astype({name: "float64" for name, kind in self.inputs if kind == "double"})
        return np.asarray(self.model.predict(frame), dtype=float)


class UnusableModelError(Exception):
    """The registered version cannot score the stream's windows; the message says why."""


class ModelScorer:
    """Follows ``models:/<name>@<alias>``; ``current`` returns the model to score with, or None.

    A version is loaded only if its files match the digest recorded when it was registered
    (``infra.model_trust``: loading runs code), and used only after two checks on the driver:
    the windows have every input of its signature, and it scores its own input example. One that
    fails is logged once and skipped (rules only) until the alias moves: a bad registration must
    not stop the alerts. Nor must the registry: one that cannot be read (a server down, a broken
    store) means rules only until it answers, asked again at every batch. A local SQLite store
    that does not exist holds no model and is not created here: the first ``iotfraud train``
    creates it, so a pipeline killed at start-up can never leave it half-initialised.
    """

    def __init__(
        self, tracking_uri: str, name: str, alias: str = "champion", *,
        signing_key: str | None = None,
    ) -> None:  # fmt: skip
        self.tracking_uri = tracking_uri
        self.signing_key = signing_key
        self.name = name
        self.alias = alias
        self._loaded: LoadedModel | None = None
        self._said: str | None = None  # why the last batch ran rules only, logged once
        self._unusable: set[tuple[str, str | None]] = set()  # (version, its digest tag)
        self._client: Any = None

    def current(self, columns: Collection[str]) -> LoadedModel | None:
        """The model for a batch whose windows have ``columns``; None means rules only."""
        champion = self._champion_version()
        if champion is None:
            self._loaded = None
            return None
        version, digest = champion
        self._said = None
        if self._loaded is not None and self._loaded.version == version:
            return self._loaded
        self._loaded = None
        # Tried again once the version is signed anew (`iotfraud models sign`), or the alias moves.
        if (version, digest) in self._unusable:
            return None
        try:
            self._loaded = self._load(version, columns)
        except UnusableModelError as error:
            log.error(
                "model %s version %s (alias %s) cannot score the stream: %s. Running rules only "
                "until the alias moves; retrain with `iotfraud train`.",
                self.name, version, self.alias, error,
            )  # fmt: skip
            self._unusable.add((version, digest))
        return self._loaded

    def _champion_version(self) -> tuple[str, str | None] | None:
        """The version the alias points to and its recorded digest; None when there is none or
        the registry fails."""
        import mlflow

        store = missing_store(self.tracking_uri)
        if store is not None:
            self._rules_only("no-store", "no MLflow store at %s: running rules only", store)
            return None
        mlflow.set_tracking_uri(self.tracking_uri)
        mlflow.set_registry_uri(self.tracking_uri)
        try:
            if self._client is None:  # one client (and its store connection) for every batch
                self._client = mlflow.MlflowClient(
                    self.tracking_uri, registry_uri=self.tracking_uri
                )
            champion = aliased_version(self._client, self.name, self.alias)
        except Exception as error:  # a store that cannot be read fails in its own library's way
            self._client = None  # connect afresh at the next batch
            self._rules_only(
                "unreadable",
                "the model registry %s cannot be read (%s): running rules only until it answers",
                self.tracking_uri, _first_line(error),
            )  # fmt: skip
            return None
        if champion is None:
            self._rules_only("missing", "no model registered as %s@%s: running rules only",
                             self.name, self.alias)  # fmt: skip
            return None
        return str(champion.version), champion.tags.get(DIGEST_TAG)

    def _rules_only(self, why: str, message: str, *args: object) -> None:
        if self._said != why:
            log.log(logging.ERROR if why == "unreadable" else logging.WARNING, message, *args)
            self._said = why

    def _load(self, version: str, columns: Collection[str]) -> LoadedModel:
        import mlflow

        # Pin the version just looked up: the alias may move again while we load.
        uri = f"models:/{self.name}/{version}"
        info = mlflow.models.get_model_info(uri)
        if info.signature is None:
            raise UnusableModelError("it has no signature (register it with one)")
        inputs = tuple((spec.name, spec.type.name) for spec in info.signature.inputs.inputs)
        missing = [name for name, _ in inputs if name not in columns]
        if missing:
            raise UnusableModelError(f"the windows lack its inputs {missing}")
        try:
            driver_model = load_trusted(self._client, self.name, version, self.signing_key)
        except UntrustedModelError as error:
            raise UnusableModelError(str(error)) from None
        if driver_model.input_example is not None:
            try:
                driver_model.predict(driver_model.input_example)
            except Exception as error:  # whatever the model raises, the stream goes on
                raise UnusableModelError(f"it fails on its own input example: {error!r}") from error
        threshold = float((info.metadata or {}).get("threshold", c.MODEL_ALERT_THRESHOLD))
        log.info("scoring with %s version %s (threshold %.3f)", self.name, version, threshold)
        return LoadedModel(self.name, version, driver_model, inputs, threshold)


def _first_line(error: Exception) -> str:
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0] if lines else ''}"


def largest_deviations(rows: pd.DataFrame, top: int = 2) -> list[str]:
    """Per row, the level or trend furthest from the device's own normal, as analyst text
    ("temperature_c level +15.2 sd"); empty when the rows carry no relative features."""
    present = [f for f in Z_FEATURES if f in rows]
    if not present:
        return [""] * len(rows)
    values = rows[present].astype(float)
    out = []
    for _, row in values.iterrows():
        largest = row.dropna().abs().sort_values(ascending=False).head(top).index
        out.append(", ".join(
            f"{name.removeprefix('rel_').replace('_level', ' level').replace('_trend', ' trend')}"
            f" {row[name]:+.1f} sd of its own normal" for name in largest
        ))  # fmt: skip
    return out


def model_alerts(windows: pd.DataFrame, scores: np.ndarray, model: LoadedModel) -> pd.DataFrame:
    """``model_anomaly`` alerts of the ``windows`` (window features) scored at or above the
    model's threshold (``pipeline.alerts.DETECTOR_COLUMNS``)."""
    hit = scores >= model.threshold
    if not hit.any():
        return empty_alerts()
    rows, values = windows[hit], pd.Series(scores[hit], index=windows.index[hit])
    reason = [
        f"model {model.name} v{model.version} scored {v:.2f} (threshold {model.threshold:.2f})"
        + (f"; {why}" if why else "")
        for v, why in zip(values, largest_deviations(rows), strict=True)
    ]
    severity = pd.Series(np.where(values >= 0.9, "high", "medium"), index=rows.index)
    return alert_frame(rows, MODEL_ALERT, severity, values, pd.Series(reason, index=rows.index),
                       model=(model.name, model.version))  # fmt: skip
