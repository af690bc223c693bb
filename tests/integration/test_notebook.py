"""The analyst notebook (``notebooks/analyst.ipynb``) run in a real Jupyter kernel on a known lake.

The lake is the dashboard tests' (``build_lake``) plus ground truth, two stuck-sensor alerts and
three withdrawn alerts, so that the device drill-down's default device, the chart and the
precision figures all change if a withdrawn alert were counted, and precision is neither 0 nor 1.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import nbformat
import pyarrow as pa
import pytest
from deltalake import write_deltalake
from nbclient import NotebookClient

from infra import contract as c
from infra import lake
from tests.dashboard_fixtures import build_lake

pytestmark = [pytest.mark.integration, pytest.mark.slow]

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "analyst.ipynb"
NOW = datetime(2026, 3, 2, 12, 0, tzinfo=timezone.utc)
# Altair's default renderer shows a chart as HTML that calls vega-embed with the spec inline.
EMBED_CALL = "})("

# build_lake's alerts (window minutes before NOW, all 10 minutes long):
#   001 meter-001 tampering [-10, 0)       002 meter-001 model_anomaly [-10, 0)
#   003 tracker-002 impossible_travel [-30, -20)   004 rogue-999 rogue_device [-40, -30)
#   005 tracker-002 flood [-50, -40), verdict false_positive
#   006 meter-001 model_anomaly [-55, -45)
# Added here: 007 thermo-003 stuck_sensor [-20, -10), 008 thermo-003 stuck_sensor [-60, -50),
# and 009-011 on tracker-002, withdrawn (they overlap no injection: false if they were counted).
# Injections: tampering on meter-001 [-15, 0) and [-180, -120), impossible_travel on tracker-002
# [-35, -25), rogue_device on rogue-999 [-45, 0), stuck_sensor on thermo-003 [-25, -5).
# True: 001, 002 (tampering), 003, 004, 007. False: 005 (verdict), 006, 008 (overlap nothing).
# The earlier tampering is missed (recall 1/2).
# A scenario's precision counts the false alerts of its types: model_anomaly 006 counts against
# tampering, spike, dip, stuck_sensor and drift.
EXPECTED_BY_SCENARIO: dict[str, tuple[int, int, int, int, float, float | None]] = {
    # scenario: injected, detected, alerts, true positive alerts, precision, recall
    "tampering": (2, 1, 3, 2, 2 / 3, 1 / 2),
    "spike": (0, 0, 1, 0, 0.0, None),
    "dip": (0, 0, 1, 0, 0.0, None),
    "stuck_sensor": (1, 1, 3, 1, 1 / 3, 1.0),
    "drift": (0, 0, 1, 0, 0.0, None),
    "impossible_travel": (1, 1, 1, 1, 1.0, 1.0),
    "flood": (0, 0, 1, 0, 0.0, None),
    "rogue_device": (1, 1, 1, 1, 1.0, 1.0),
    "all": (5, 4, 8, 5, 5 / 8, 4 / 5),
}
EXPECTED_BY_TYPE: dict[str, tuple[int, int, float]] = {
    # alert type: alerts, true positive alerts, precision
    "flood": (1, 0, 0.0),
    "impossible_travel": (1, 1, 1.0),
    "model_anomaly": (2, 1, 1 / 2),
    "rogue_device": (1, 1, 1.0),
    "stuck_sensor": (2, 1, 1 / 2),
    "tampering": (1, 1, 1.0),
}
STANDING_BY_TYPE = {type_: alerts for type_, (alerts, _, _) in EXPECTED_BY_TYPE.items()}


def _append(root: str, table: str, columns: c.Columns, rows: list[dict[str, Any]]) -> None:
    data = pa.Table.from_pylist(rows, schema=c.arrow_schema(columns))
    write_deltalake(lake.table_path(root, table), data, mode="append")


def _alert(n: int, device: str, type_: str, minutes_ago: int, status: str) -> dict[str, Any]:
    start = NOW - timedelta(minutes=minutes_ago)
    return {
        "alert_id": f"alert-{n:03d}", "device_id": device, "alert_type": type_,
        "severity": "medium", "score": 0.8, "reasons": [f"{type_} rule fired"],
        "model_name": None, "model_version": None,
        "window_start": start, "window_end": start + timedelta(minutes=10),
        "first_event_time": start, "last_event_time": start + timedelta(minutes=9),
        "status": status, "detected_at": start + timedelta(minutes=10), "batch_id": n,
    }  # fmt: skip


def _injection(n: int, device: str, scenario: str, start_ago: int, end_ago: int) -> dict[str, Any]:
    return {
        "scenario_id": f"sc-{n}", "device_id": device, "scenario": scenario,
        "start_time": NOW - timedelta(minutes=start_ago),
        "end_time": NOW - timedelta(minutes=end_ago), "details": "", "run_id": "run-1",
    }  # fmt: skip


def build_analyst_lake(root: str) -> None:
    build_lake(root, now=NOW)
    _append(root, lake.ALERTS, c.ALERTS_COLUMNS, [
        _alert(7, "thermo-003", "stuck_sensor", 20, c.ALERT_RAISED),
        _alert(8, "thermo-003", "stuck_sensor", 60, c.ALERT_RAISED),
        _alert(9, "tracker-002", "spike", 15, c.ALERT_WITHDRAWN),
        _alert(10, "tracker-002", "drift", 15, c.ALERT_WITHDRAWN),
        _alert(11, "tracker-002", "spike", 5, c.ALERT_WITHDRAWN),
    ])  # fmt: skip
    _append(root, lake.GROUND_TRUTH, c.GROUND_TRUTH_COLUMNS, [
        _injection(1, "meter-001", "tampering", 15, 0),
        _injection(2, "meter-001", "tampering", 180, 120),
        _injection(3, "tracker-002", "impossible_travel", 35, 25),
        _injection(4, "rogue-999", "rogue_device", 45, 0),
        _injection(5, "thermo-003", "stuck_sensor", 25, 5),
    ])  # fmt: skip


def run_notebook(lake_root: str, home: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The notebook executed as a user runs it (in its own folder) with ``IOT_LAKE_ROOT`` set;
    the kernel is this interpreter. A cell error raises ``CellExecutionError``."""
    kernel = home / "kernels" / "python3"
    kernel.mkdir(parents=True)
    spec = {"argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": "test", "language": "python"}  # fmt: skip
    (kernel / "kernel.json").write_text(json.dumps(spec))
    monkeypatch.setenv("JUPYTER_PATH", str(home))  # searched before the user's kernels
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(home / "runtime"))
    monkeypatch.setenv("IPYTHONDIR", str(home / "ipython"))
    monkeypatch.setenv("IOT_LAKE_ROOT", lake_root)
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    client = NotebookClient(
        notebook, timeout=120, startup_timeout=60, kernel_name="python3",
        resources={"metadata": {"path": str(NOTEBOOK.parent)}},
    )  # fmt: skip
    client.execute()
    return notebook


def printed(notebook: Any) -> list[str]:
    """Every line the cells printed."""
    return [
        line
        for cell in notebook.cells if cell.cell_type == "code"
        for output in cell.outputs if output.output_type == "stream" and output.name == "stdout"
        for line in output.text.splitlines()
    ]  # fmt: skip


def charts(notebook: Any) -> list[dict[str, Any]]:
    """The Vega-Lite specs of the charts the cells displayed."""
    pages = [
        output.data["text/html"]
        for cell in notebook.cells if cell.cell_type == "code"
        for output in cell.outputs if output.output_type in ("display_data", "execute_result")
        if "vega-embed" in output.data.get("text/html", "")
    ]  # fmt: skip
    decoder = json.JSONDecoder()
    return [
        decoder.raw_decode(page, page.rindex(EMBED_CALL) + len(EMBED_CALL))[0] for page in pages
    ]


def records(spec: dict[str, Any], column: str) -> list[dict[str, Any]]:
    """The rows of the chart's inline data sets that have ``column``."""
    return [row for rows in spec["datasets"].values() for row in rows if column in row]


def table_rows(lines: list[str], header: str) -> dict[str, list[str]]:
    """The printed text table whose header starts with ``header``: first column -> the others."""
    start = next(i for i, line in enumerate(lines) if line.split()[:1] == [header])
    rows = {}
    for line in lines[start + 1 :]:
        fields = line.split()
        if len(fields) != len(lines[start].split()):
            break
        rows[fields[0]] = fields[1:]
    return rows


def shown(value: float | None) -> str:
    """A ratio as the notebook prints it (as ``iotfraud eval`` does)."""
    return "n/a" if value is None else f"{value:.2f}"


@pytest.mark.timeout(300)
def test_the_notebook_shows_the_lakes_alerts_device_and_precision(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = str(tmp_path / "lake")
    build_analyst_lake(root)

    notebook = run_notebook(root, tmp_path / "jupyter", monkeypatch)

    # A cell that raises fails run_notebook; a warning would show in red under its cell.
    complaints = [o for cell in notebook.cells for o in cell.get("outputs", ())
                  if o.output_type == "error" or o.get("name") == "stderr"]  # fmt: skip
    assert complaints == []
    lines = printed(notebook)
    assert f"lake: {root}" in lines
    assert (
        "8 standing alerts (3 withdrawn, left out), 3 registered devices, verdicts on 1 alerts"
        in lines
    )
    # The drill-down's default: meter-001 has 3 standing alerts; tracker-002 would have 5 with
    # its withdrawn ones. Its 60 events are all within 30 minutes of its alert windows.
    assert (
        "meter-001 (smart_meter, Unter den Linden 1, Berlin): 3 standing alerts, "
        "3 without a verdict; 60 events shown"
    ) in lines

    timeline, device = charts(notebook)
    by_type: Counter[str] = Counter()
    for row in records(timeline, "alert_type"):
        by_type[row["alert_type"]] += row["alerts"]
    assert dict(by_type) == STANDING_BY_TYPE
    assert len(records(device, "event_time")) == 60
    windows = records(device, "window_start")  # the shaded alert windows
    assert Counter(w["alert_type"] for w in windows) == {"model_anomaly": 2, "tampering": 1}

    by_scenario = table_rows(lines, "scenario")
    assert {
        scenario: fields[:6] for scenario, fields in by_scenario.items()
    } == {
        scenario: [str(injected), str(detected), str(alerts), str(true), shown(precision),
                   shown(recall)]
        for scenario, (injected, detected, alerts, true, precision, recall)
        in EXPECTED_BY_SCENARIO.items()
    }  # fmt: skip
    by_type_printed = table_rows(lines, "alert_type")
    assert by_type_printed == {
        type_: [str(alerts), str(true), shown(precision)]
        for type_, (alerts, true, precision) in EXPECTED_BY_TYPE.items()
    }


def test_the_notebook_is_stored_without_outputs() -> None:
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(notebook)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert code
    assert all(cell.outputs == [] and cell.execution_count is None for cell in code)
