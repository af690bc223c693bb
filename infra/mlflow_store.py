"""The MLflow store: the local one (a SQLite tracking and registry database plus an artifact
folder) or the configured one (``tracking_uri``), and the model version behind a registry alias."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

# What MLflow answers when the model, or its alias, does not exist (any other error is a failure).
_NOT_REGISTERED = {"RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"}


def local_tracking_uri(state_dir: Path) -> str:
    """``sqlite:///<abs path>/mlflow.db`` under the stack's state folder."""
    db = (state_dir / "mlflow" / "mlflow.db").resolve()
    return f"sqlite:///{db}"


def local_artifact_root(state_dir: Path) -> str:
    return (state_dir / "mlflow" / "artifacts").resolve().as_uri()


def ensure_local_store(state_dir: Path) -> str:
    """Create the store's folder; return its tracking URI."""
    (state_dir / "mlflow" / "artifacts").mkdir(parents=True, exist_ok=True)
    return local_tracking_uri(state_dir)


def tracking_uri(configured: str) -> str:
    """The configured MLflow URI, or the local stack's SQLite store (created if absent)."""
    from infra.settings import StackSettings, load_settings

    return configured or ensure_local_store(load_settings(StackSettings).state_dir)


def ensure_experiment(name: str, tracking_uri: str, artifact_root: str | None) -> str:
    """Return the id of experiment ``name``, creating it with ``artifact_root`` if absent."""
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=tracking_uri)
    existing = client.get_experiment_by_name(name)
    if existing is not None:
        return str(existing.experiment_id)
    location = f"{artifact_root.rstrip('/')}/{name}" if artifact_root else None
    experiment_id = client.create_experiment(name, artifact_location=location)
    log.info("created MLflow experiment %s (%s)", name, location)
    return str(experiment_id)


def sqlite_store_path(tracking_uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` tracking URI; None for any other store."""
    prefix = "sqlite:///"
    if not tracking_uri.startswith(prefix):
        return None
    return Path(tracking_uri[len(prefix) :].split("?", 1)[0])


def artifact_root_for(tracking_uri: str) -> str | None:
    """Artifacts beside a SQLite store (``<db folder>/artifacts``); a server chooses its own."""
    db = sqlite_store_path(tracking_uri)
    return None if db is None else (db.parent / "artifacts").resolve().as_uri()


def missing_store(tracking_uri: str) -> Path | None:
    """The database file of a local SQLite store that does not exist yet, which holds no model
    and is not to be created by a reader; None for a store that exists, or any other store."""
    db = sqlite_store_path(tracking_uri)
    return db if db is not None and not db.exists() else None


def aliased_version(mlflow_client: Any, name: str, alias: str) -> Any | None:
    """The ``ModelVersion`` (number, tags, run) that ``alias`` of model ``name`` points to; None
    when the model or the alias does not exist. A registry that cannot be read raises."""
    from mlflow.exceptions import MlflowException

    try:
        return mlflow_client.get_model_version_by_alias(name, alias)
    except MlflowException as error:
        if error.error_code in _NOT_REGISTERED:
            return None
        raise
