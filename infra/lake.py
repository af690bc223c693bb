"""Table names, where each table lives under the lake root (a local path or any Hadoop URI), and
how a process without Spark opens one (``open_table``, with ``deltalake``)."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from deltalake import DeltaTable

DEVICES = "devices"
TELEMETRY = "telemetry"
QUARANTINE = "quarantine"
FEATURES = "features"
# Every state of every window as the stream changed it (latest per window: the open windows).
FEATURE_CHANGES = "feature_changes"
ALERTS = "alerts"
ALERT_FEEDBACK = "alert_feedback"
PIPELINE_METRICS = "pipeline_metrics"
GROUND_TRUTH = "ground_truth"
EVALUATION = "evaluation"
FIRMWARE_UPDATES = "firmware_updates"
# One row per alert the fast path published (see infra.contract.FAST_ALERTS_COLUMNS).
FAST_ALERTS = "fast_alerts"

TABLES = (
    DEVICES, TELEMETRY, QUARANTINE, FEATURES, FEATURE_CHANGES, ALERTS,
    ALERT_FEEDBACK, PIPELINE_METRICS, GROUND_TRUTH, EVALUATION, FIRMWARE_UPDATES, FAST_ALERTS,
)  # fmt: skip


def is_uri(location: str) -> bool:
    return "://" in location


def table_path(lake_root: str, table: str) -> str:
    """The folder of ``table``: ``<root>/<table>`` for URIs, an absolute path for local folders."""
    if is_uri(lake_root):
        return f"{lake_root.rstrip('/')}/{table}"
    return str((Path(lake_root) / table).resolve())


def ensure_lake(lake_root: str) -> None:
    """Create a local lake folder; object stores need nothing."""
    if not is_uri(lake_root):
        Path(lake_root).mkdir(parents=True, exist_ok=True)


def delta_uri(lake_root: str, table: str) -> str:
    """Where ``deltalake`` finds ``table``; Hadoop's ``s3a://`` is plain ``s3://`` for delta-rs."""
    path = table_path(lake_root, table)
    return "s3://" + path[len("s3a://") :] if path.startswith("s3a://") else path


def open_table(lake_root: str, table: str) -> DeltaTable | None:
    """The latest version of ``table`` read with ``deltalake`` (no JVM), or None when it does not
    exist yet."""
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    uri = delta_uri(lake_root, table)
    if not is_uri(uri) and not Path(uri).exists():
        return None
    try:
        return DeltaTable(uri)
    except TableNotFoundError:
        return None


def first_commit_times(lake_root: str, table: str, key: str) -> dict[Any, datetime]:
    """Per value of the column ``key``: when the commit that first added a row holding it was
    made (its commit timestamp, UTC), walking the table's versions in order. Rows a later
    commit rewrote (a MERGE, OPTIMIZE) keep the time they were first committed. Empty when the
    table does not exist. Versions whose log or files are gone (log retention, VACUUM) are
    skipped: the time then known for a key is that of the first version still readable."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from deltalake.exceptions import DeltaError

    found = open_table(lake_root, table)
    if found is None:
        return {}
    stamps = {entry["version"]: entry["timestamp"] for entry in found.history()}
    files = found.to_pyarrow_dataset().filesystem  # the table's folder, on any store
    seen: set[str] = set()
    first: dict[Any, datetime] = {}
    for version in sorted(stamps):
        try:
            found.load_as_version(version)
        except DeltaError:  # cleaned up: the next version still readable counts
            continue
        added = set(pa.table(found.get_add_actions(flatten=True)).column("path").to_pylist())
        committed = datetime.fromtimestamp(stamps[version] / 1000, tz=timezone.utc)
        for path in sorted(added - seen):
            try:
                values = pq.read_table(path, filesystem=files, columns=[key]).column(key)
            except FileNotFoundError:  # vacuumed: its rows were rewritten into later files
                continue
            for value in values.to_pylist():
                first.setdefault(value, committed)
        seen |= added
    return first
