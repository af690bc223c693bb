"""``iotfraud eval``: the live ``alerts`` table against ``ground_truth`` (and analyst verdicts),
read with ``deltalake`` (no JVM); the result is appended to the ``evaluation`` table."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone

import pandas as pd

from infra import contract as c
from infra import lake
from models.evaluation import evaluate, other_scenario_alerts

_ALERT_COLUMNS = ["alert_id", "device_id", "alert_type", "window_start", "window_end",
                  "last_event_time"]  # fmt: skip


def read_table(lake_root: str, table: str, columns: list[str]) -> pd.DataFrame | None:
    """A Delta table as pandas, or None when it does not exist."""
    found = lake.open_table(lake_root, table)
    return None if found is None else found.to_pandas(columns=columns)


def standing_alerts(lake_root: str, columns: list[str]) -> pd.DataFrame | None:
    """The ``columns`` of the alerts that stand (what analysts see: not withdrawn when their
    window closed), or None when there is no ``alerts`` table."""
    table = lake.open_table(lake_root, lake.ALERTS)
    if table is None:
        return None
    # A table the pipeline has not upgraded yet has no status: every alert stands.
    status = ["status"] if "status" in {f.name for f in table.schema().fields} else []
    alerts = table.to_pandas(columns=[*columns, *status])
    if status:
        alerts = alerts[alerts["status"] != c.ALERT_WITHDRAWN].drop(columns="status")
    return alerts.reset_index(drop=True)


@dataclass(frozen=True)
class LakeEvaluation:
    """``evaluate``'s table for the lake, and the standing alerts its ``all`` row leaves out
    (``other_scenario_alerts``), from one read of the tables."""

    table: pd.DataFrame
    left_out: pd.DataFrame

    def left_out_line(self) -> str | None:
        """The alerts left out, by injection and type, so that the table's count and the
        standing alerts add up; None when there are none."""
        if self.left_out.empty:
            return None
        counts = self.left_out.groupby(["during", "alert_type"]).size()
        by_injection: dict[str, list[str]] = {}
        for during, alert_type, n in zip(
            counts.index.get_level_values(0),
            counts.index.get_level_values(1),
            counts,
            strict=True,
        ):
            by_injection.setdefault(during, []).append(f"{alert_type} {n:,}")
        listed = "; ".join(
            f"during {d}: {', '.join(types)}" for d, types in sorted(by_injection.items())
        )
        alerts = f"{len(self.left_out):,} alert" + ("s" if len(self.left_out) > 1 else "")
        return (f"{alerts} not in the table, neither true nor false: each came on a device "
                "during an injection of a scenario that does not raise its type "
                f"({listed})")  # fmt: skip


def evaluate_lake(lake_root: str) -> LakeEvaluation:
    """The evaluation of the lake's standing alerts; a clear error when a needed table is
    missing."""
    truth = read_table(lake_root, lake.GROUND_TRUTH, c.column_names(c.GROUND_TRUTH_COLUMNS))
    alerts = standing_alerts(lake_root, _ALERT_COLUMNS)
    missing = [name for name, frame in ((lake.GROUND_TRUTH, truth), (lake.ALERTS, alerts))
               if frame is None]  # fmt: skip
    if missing:
        # A simulator that ran but injected nothing yet (a short real-time run) wrote no row.
        why = {lake.GROUND_TRUTH: "the simulator writes it when it injects its first scenario "
                                  "(a run of a few minutes in real time may inject none)",
               lake.ALERTS: "the pipeline writes it"}  # fmt: skip
        raise FileNotFoundError(
            f"no {' and no '.join(missing)} table under {lake_root}: "
            + "; ".join(why[name] for name in missing)
        )
    assert truth is not None and alerts is not None
    feedback = read_table(lake_root, lake.ALERT_FEEDBACK, ["alert_id", "verdict", "created_at"])
    return LakeEvaluation(
        evaluate(alerts, truth, feedback), other_scenario_alerts(alerts, truth, feedback)
    )


def write_evaluation(lake_root: str, result: pd.DataFrame, at: datetime | None = None) -> None:
    """Append ``result`` with ``evaluated_at`` to the ``evaluation`` table (the dashboard reads
    the latest evaluation)."""
    import pyarrow as pa
    from deltalake import write_deltalake

    lake.ensure_lake(lake_root)
    stamped = result.assign(evaluated_at=at or datetime.now(timezone.utc))
    table = pa.Table.from_pandas(
        stamped[c.column_names(c.EVALUATION_COLUMNS)], preserve_index=False
    ).cast(c.arrow_schema(c.EVALUATION_COLUMNS))
    write_deltalake(lake.table_path(lake_root, lake.EVALUATION), table, mode="append")


def format_table(result: pd.DataFrame) -> str:
    """The evaluation as an aligned text table (None shown as n/a)."""
    shown = result.copy()
    for name in ("precision", "recall", "f1"):
        shown[name] = shown[name].map(lambda v: "n/a" if v is None or pd.isna(v) else f"{v:.2f}")
    shown["median_time_to_detect_s"] = shown["median_time_to_detect_s"].map(
        lambda v: "n/a" if v is None or pd.isna(v) else f"{v:.0f}"
    )
    return shown.to_string(index=False)
