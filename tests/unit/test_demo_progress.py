"""The demo's progress line: row counts from the Delta log, alerts by type, before and after the
tables exist (real Delta tables written with deltalake)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
from deltalake import write_deltalake

from infra import lake
from iotfraud.demo import progress_line, row_count


def test_progress_counts_rows_of_every_commit_and_alerts_by_type(tmp_path: Path) -> None:
    root = str(tmp_path)
    assert progress_line(root) == "telemetry 0 | quarantine 0 | alerts 0"

    telemetry = lake.table_path(root, lake.TELEMETRY)
    for first in range(0, 2500, 1000):  # three commits: 1,000 + 1,000 + 500 rows
        ids = [f"e{i}" for i in range(first, min(first + 1000, 2500))]
        write_deltalake(telemetry, pa.table({"event_id": ids}), mode="append")
    write_deltalake(lake.table_path(root, lake.QUARANTINE), pa.table({"reason": ["bad_json"] * 7}))
    types = ["flood"] * 3 + ["rogue_device"]
    write_deltalake(lake.table_path(root, lake.ALERTS), pa.table({"alert_type": types}))

    assert row_count(root, lake.TELEMETRY) == 2500
    assert progress_line(root) == (
        "telemetry 2,500 | quarantine 7 | alerts 4 (flood 3, rogue_device 1)"
    )
