"""The model registry: champion / challenger aliases, promotion and rollback.

- ``champion``: what the pipeline scores with (``models:/<name>@champion``).
- ``challenger``: a trained candidate that did not beat the champion on the same held-out data.
- ``previous``: the champion before the last promotion; ``rollback`` swaps it back.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from infra.mlflow_store import aliased_version

log = logging.getLogger(__name__)

CHAMPION = "champion"
CHALLENGER = "challenger"
PREVIOUS = "previous"


@dataclass(frozen=True, order=True)
class Score:
    """How a model does on held-out windows; compared by F1, then PR-AUC."""

    f1: float
    pr_auc: float


def beats(candidate: Score, champion: Score | None) -> bool:
    """Whether the candidate should replace the champion: strictly better, or no champion."""
    return champion is None or candidate > champion


def client(tracking_uri: str) -> Any:
    import mlflow

    return mlflow.MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)


def alias_version(mlflow_client: Any, name: str, alias: str) -> str | None:
    """The version ``alias`` points to, or None (also when the model does not exist)."""
    found = aliased_version(mlflow_client, name, alias)
    return None if found is None else str(found.version)


def compares_with_own_normal(tracking_uri: str, name: str, version: str) -> bool:
    """Whether a registered version scores windows relative to each device's own normal (its
    inputs are ``pipeline.profiles.RELATIVE_FEATURES``), as this release trains them; one
    registered by an earlier release scored absolute window statistics per device type."""
    import mlflow

    from pipeline.profiles import RELATIVE_FEATURES

    mlflow.set_tracking_uri(tracking_uri)
    mlflow.set_registry_uri(tracking_uri)
    info = mlflow.models.get_model_info(f"models:/{name}/{version}")
    inputs = set(info.signature.inputs.input_names()) if info.signature else set()
    return bool(inputs) and inputs <= set(RELATIVE_FEATURES)


def check_version(mlflow_client: Any, name: str, version: str) -> None:
    from mlflow.exceptions import MlflowException

    try:
        mlflow_client.get_model_version(name, version)
    except MlflowException as exc:
        raise ValueError(f"model {name} has no version {version}") from exc


def promote(mlflow_client: Any, name: str, version: str) -> str | None:
    """Point ``champion`` at ``version``; the old champion becomes ``previous``. Returns it."""
    check_version(mlflow_client, name, version)
    old = alias_version(mlflow_client, name, CHAMPION)
    if old == version:
        return old
    if old is not None:
        mlflow_client.set_registered_model_alias(name, PREVIOUS, old)
    mlflow_client.set_registered_model_alias(name, CHAMPION, version)
    if alias_version(mlflow_client, name, CHALLENGER) == version:
        mlflow_client.delete_registered_model_alias(name, CHALLENGER)
    log.info("%s: champion is now version %s (was %s)", name, version, old)
    return old


def make_challenger(mlflow_client: Any, name: str, version: str) -> None:
    check_version(mlflow_client, name, version)
    mlflow_client.set_registered_model_alias(name, CHALLENGER, version)
    log.info("%s: version %s is the challenger", name, version)


def rollback(mlflow_client: Any, name: str) -> tuple[str, str]:
    """Swap ``champion`` and ``previous``; returns (new champion, demoted version)."""
    back = alias_version(mlflow_client, name, PREVIOUS)
    current = alias_version(mlflow_client, name, CHAMPION)
    if back is None or current is None:
        raise ValueError(
            f"model {name} has no previous champion to roll back to "
            f"(champion: {current or 'none'}); use `iotfraud models promote VERSION`"
        )
    mlflow_client.set_registered_model_alias(name, CHAMPION, back)
    mlflow_client.set_registered_model_alias(name, PREVIOUS, current)
    log.info("%s: rolled back the champion from version %s to %s", name, current, back)
    return back, current


def versions(mlflow_client: Any, name: str) -> list[dict[str, Any]]:
    """Every version, newest first: version, aliases, created, run_id and held-out metrics."""
    from mlflow.exceptions import MlflowException

    try:
        # search_model_versions leaves aliases empty: take them from the registered model.
        by_version: dict[str, list[str]] = {}
        for alias, version in mlflow_client.get_registered_model(name).aliases.items():
            by_version.setdefault(str(version), []).append(alias)
    except MlflowException:
        return []
    rows = []
    for mv in mlflow_client.search_model_versions(f"name = '{name}'"):
        metrics = mlflow_client.get_run(mv.run_id).data.metrics if mv.run_id else {}
        rows.append({
            "version": str(mv.version),
            "aliases": ",".join(sorted(by_version.get(str(mv.version), []))),
            "created": datetime.fromtimestamp(mv.creation_timestamp / 1000, timezone.utc),
            "holdout_f1": metrics.get("holdout_model_f1"),
            "holdout_pr_auc": metrics.get("holdout_model_pr_auc"),
            "run_id": mv.run_id,
        })  # fmt: skip
    return sorted(rows, key=lambda row: int(row["version"]), reverse=True)
