"""The live evaluation reads the alerts analysts see: withdrawn ones are left out."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from infra import contract as c
from infra import lake
from models.evaluation import window_labels
from models.live_eval import evaluate_lake, standing_alerts

T0 = datetime(2026, 11, 26, 8, 0, tzinfo=timezone.utc)


def write(root: str, table: str, columns: c.Columns, rows: list[dict[str, object]]) -> None:
    write_deltalake(lake.table_path(root, table),
                    pa.Table.from_pylist(rows, schema=c.arrow_schema(columns)))  # fmt: skip


def test_withdrawn_alerts_count_neither_as_true_nor_as_false(tmp_path: Path) -> None:
    root = str(tmp_path)
    write(root, lake.GROUND_TRUTH, c.GROUND_TRUTH_COLUMNS, [
        {"scenario_id": "s1", "device_id": "d1", "scenario": "flood", "start_time": T0,
         "end_time": T0 + timedelta(minutes=10)},
    ])  # fmt: skip

    def alert(alert_id: str, device: str, status: str | None) -> dict[str, object]:
        return {"alert_id": alert_id, "device_id": device, "alert_type": "flood",
                "window_start": T0, "window_end": T0 + timedelta(minutes=10),
                "last_event_time": T0 + timedelta(minutes=9), "status": status}  # fmt: skip

    write(root, lake.ALERTS, c.ALERTS_COLUMNS, [
        alert("early", "d2", c.ALERT_WITHDRAWN), alert("true", "d1", c.ALERT_RAISED),
        alert("older", "d1", None), alert("false", "d3", c.ALERT_WITHDRAWN),
    ])  # fmt: skip
    standing = standing_alerts(root, ["alert_id", "device_id", "window_start", "window_end"])
    assert standing is not None
    assert list(standing["alert_id"]) == ["true", "older"]
    # Positional labels (the live-quality bench's false alerts): one per standing alert.
    assert list(window_labels(standing, ground_truth(root), 0.0)) == ["flood", "flood"]
    flood = evaluate_lake(root).set_index("scenario").loc["flood"]
    assert (flood["alerts"], flood["true_positive_alerts"], flood["precision"]) == (2, 2, 1.0)


def ground_truth(root: str) -> pd.DataFrame:
    return DeltaTable(lake.table_path(root, lake.GROUND_TRUTH)).to_pandas()


def test_a_lake_without_injections_says_why_there_is_nothing_to_evaluate(tmp_path: Path) -> None:
    root = str(tmp_path)
    write(root, lake.ALERTS, c.ALERTS_COLUMNS, [])  # the pipeline ran; the simulator injected none

    with pytest.raises(FileNotFoundError) as raised:
        evaluate_lake(root)

    assert str(raised.value) == (
        f"no ground_truth table under {root}: the simulator writes it when it injects its first "
        "scenario (a run of a few minutes in real time may inject none)"
    )
