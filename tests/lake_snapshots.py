"""A lake's tables as rows to compare: a run killed and restarted against an uninterrupted one
(``tests/integration/test_kill_loop.py``)."""

from __future__ import annotations

import math
from typing import Any

from infra import lake as tables
from pipeline.detection import window_states


def delta_rows(lake_root: str, table: str) -> int:
    from deltalake import DeltaTable

    try:
        return int(DeltaTable(tables.table_path(lake_root, table)).to_pyarrow_table().num_rows)
    except Exception:  # table not created yet
        return 0


# Columns whose value says when a row was written, not what it holds: a run killed five times
# writes its rows at other moments, and an alert in another micro-batch, than one that was not.
RUN_DEPENDENT = {
    "telemetry": {"ingest_time"},
    "quarantine": {"ingest_time"},
    "firmware_updates": {"ingest_time"},
    "features": set(),
    "alerts": {"detected_at", "batch_id"},
}


def _comparable(value: Any) -> Any:
    """A cell as compared: NaN as missing, lists and maps as tuples."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, list):
        return tuple(_comparable(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _comparable(v)) for k, v in value.items()))
    return value


class Rows(list):  # type: ignore[type-arg]
    """A table's rows (dicts), equal to another's when each pair matches: doubles to a relative
    1e-7 or an absolute 1e-9, everything else exactly. A window summed in other micro-batches
    differs in the last bits, a slope in about the ninth digit (``pipeline.features``), so one
    near zero differs by about 1e-10 in units per minute."""

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, list) or len(self) != len(other):
            return False
        return all(
            row.keys() == theirs.keys() and all(_close(row[c], theirs[c]) for c in row)
            for row, theirs in zip(self, other, strict=True)
        )

    __hash__ = None  # type: ignore[assignment]


def _close(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-7, abs_tol=1e-9)
    return bool(a == b)


def _order(row: dict[str, Any]) -> str:
    """Rows sort by their columns that are not doubles (doubles may differ in the last bits)."""
    return repr([(c, v) for c, v in row.items() if not isinstance(v, float)])


def snapshot(spark: Any, lake_root: str) -> dict[str, Any]:
    """Every row of every table, on all columns but ``RUN_DEPENDENT``, sorted."""

    def rows(frame: Any, table: str) -> Rows:
        columns = sorted(set(frame.columns) - RUN_DEPENDENT[table])
        return Rows(sorted(
            ({c: _comparable(r[c]) for c in columns} for r in frame.select(*columns).collect()),
            key=_order,
        ))  # fmt: skip

    def load(name: str) -> Any:
        return spark.read.format("delta").load(tables.table_path(lake_root, name))

    found = {name: rows(load(name), name)
             for name in ("telemetry", "quarantine", "alerts")}  # fmt: skip
    # Every window's current state: closed ones from features, open ones from the changelog.
    found["features"] = rows(window_states(spark, lake_root), "features")
    return found
