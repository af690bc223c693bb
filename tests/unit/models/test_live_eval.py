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
from iotfraud.demo import detection_summary
from models import cli as models_cli
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
    flood = evaluate_lake(root).table.set_index("scenario").loc["flood"]
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


def test_the_alerts_left_out_of_the_table_are_named_by_injection_and_type(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The demo's alert count and its table's add up: an alert on a device during an injection
    of a scenario that does not raise its type is neither true nor false, and said."""
    root = str(tmp_path)
    write(root, lake.GROUND_TRUTH, c.GROUND_TRUTH_COLUMNS, [
        {"scenario_id": f"s{i}", "device_id": device, "scenario": scenario, "start_time": T0,
         "end_time": T0 + timedelta(minutes=20)}
        for i, (device, scenario) in enumerate([("d1", "flood"), ("d2", "replay")])
    ])  # fmt: skip
    rows = [  # device, type, status
        ("d1", "flood", c.ALERT_RAISED),  # its own scenario's type: true, in the table
        ("d1", "stuck_sensor", c.ALERT_RAISED),
        ("d1", "stuck_sensor", None),
        ("d1", "model_anomaly", c.ALERT_RAISED),
        ("d1", "spike", c.ALERT_WITHDRAWN),  # not standing: counted nowhere
        ("d2", "flood", c.ALERT_RAISED),
        ("d3", "stuck_sensor", c.ALERT_RAISED),  # no injection on d3: false, in the table
        ("d1", "spike", c.ALERT_RAISED),  # an analyst's verdict below: in the table
    ]
    write(root, lake.ALERTS, c.ALERTS_COLUMNS, [
        {"alert_id": f"a{i}", "device_id": device, "alert_type": alert_type, "window_start": T0,
         "window_end": T0 + timedelta(minutes=10), "last_event_time": T0 + timedelta(minutes=5),
         "status": status}
        for i, (device, alert_type, status) in enumerate(rows)
    ])  # fmt: skip
    assert len(evaluate_lake(root).left_out) == 5  # a7 too, before its verdict
    write(root, lake.ALERT_FEEDBACK, c.ALERT_FEEDBACK_COLUMNS, [
        {"alert_id": "a7", "verdict": "true_positive", "note": None, "analyst": "ana",
         "created_at": T0 + timedelta(hours=1)},
    ])  # fmt: skip

    result = evaluate_lake(root)

    left_out = (
        "4 alerts not in the table, neither true nor false: each came on a device during an "
        "injection of a scenario that does not raise its type (during flood: model_anomaly 1, "
        "stuck_sensor 2; during replay: flood 1)"
    )
    assert result.left_out_line() == left_out
    standing = standing_alerts(root, ["alert_id"])
    assert standing is not None
    total = result.table.set_index("scenario").loc["all"]
    assert (total["alerts"], len(result.left_out), len(standing)) == (3, 4, 7)
    # What the demo and `iotfraud eval` print under the table.
    assert detection_summary(root).splitlines()[-1] == left_out
    monkeypatch.setenv("IOT_LAKE_ROOT", root)
    assert models_cli.main(["eval"]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[-2:] == [left_out, f"written to the evaluation table under {root}"]
