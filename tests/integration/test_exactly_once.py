"""SIGKILL the pipeline process mid-stream, restart it from its checkpoint: telemetry,
quarantine, features and alerts end up exactly as after an uninterrupted run."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from infra import lake as tables
from pipeline import job
from pipeline.detection import window_states
from pipeline.settings import PipelineSettings
from tests.pipeline_helpers import device_series, encoded, produce, write_registry

pytestmark = [pytest.mark.integration, pytest.mark.slow]

WINDOWING = {"IOT_PIPELINE_WINDOW": "10 minutes", "IOT_PIPELINE_SLIDE": "5 minutes",
             "IOT_PIPELINE_WATERMARK": "2 hours",
             "IOT_PIPELINE_DEDUP_HORIZON": "3 hours"}  # fmt: skip


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


@pytest.mark.timeout(900)
def test_sigkill_and_restart_give_the_same_tables(
    spark: Any, bootstrap: str, make_topic: Callable[..., str], tmp_path: Path
) -> None:
    topic = make_topic(partitions=3)
    start = datetime.now(timezone.utc).replace(microsecond=0) - timedelta(hours=1)
    devices = [f"dev-{i}" for i in range(6)]
    events = []
    for i, device in enumerate(devices):
        events += device_series(
            device, start, 60, every_s=30, firmware="6.6.6" if i == 1 else "1.0.0"
        )
    events += device_series("rogue-1", start, 30)
    messages = encoded(events) + encoded(events[:25]) + [("dev-0", b"{bad json")] * 5
    produced = produce(bootstrap, topic, messages)
    for root in ("reference", "killed"):
        write_registry(str(tmp_path / root / "lake"), devices)

    # The uninterrupted run.
    reference = PipelineSettings(
        lake_root=str(tmp_path / "reference" / "lake"),
        checkpoint_root=str(tmp_path / "reference" / "cp"),
        bootstrap_servers=bootstrap, topic=topic, max_offsets_per_trigger=150,
        firmware_topic="", mlflow_tracking_uri=f"sqlite:///{tmp_path / 'none.db'}",
        **{k.removeprefix("IOT_PIPELINE_").lower(): v for k, v in WINDOWING.items()},
    )  # fmt: skip
    job.run_available_now(spark, reference)

    # The same input, killed twice with SIGKILL while live, then caught up.
    killed_lake = str(tmp_path / "killed" / "lake")
    env = {
        **os.environ, **WINDOWING,
        "IOT_LAKE_ROOT": killed_lake,
        "IOT_PIPELINE_CHECKPOINT_ROOT": str(tmp_path / "killed" / "cp"),
        "KAFKA_BOOTSTRAP_SERVERS": bootstrap, "IOT_TOPIC": topic,
        "IOT_FIRMWARE_TOPIC": "", "IOT_PIPELINE_MAX_OFFSETS_PER_TRIGGER": "150",
        "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'none.db'}",
        "IOT_SPARK_MASTER": "local[2]", "IOT_SPARK_SHUFFLE_PARTITIONS": "2",
        "IOT_SPARK_DRIVER_MEMORY": "1g",
    }  # fmt: skip
    command = [sys.executable, "-m", "pipeline", "run"]
    seen = 0
    for kill_after_rows in (100, 250):
        proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
        deadline = time.monotonic() + 240
        while delta_rows(killed_lake, "telemetry") < max(seen + 1, kill_after_rows):
            assert proc.poll() is None, "the pipeline exited on its own"
            assert time.monotonic() < deadline, "the pipeline made no progress"
            time.sleep(0.5)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        seen = delta_rows(killed_lake, "telemetry")
    finish = subprocess.run([*command, "--available-now"], env=env, capture_output=True,
                            text=True, timeout=600, check=False)  # fmt: skip
    assert finish.returncode == 0, finish.stderr[-3000:]

    expected, actual = snapshot(spark, reference.lake_root), snapshot(spark, killed_lake)
    assert len(expected["telemetry"]) == len(events)
    assert Counter(r["reason"] for r in expected["quarantine"]) == {"duplicate": 25,
                                                                    "invalid_json": 5}  # fmt: skip
    assert len(expected["telemetry"]) + len(expected["quarantine"]) == produced
    assert {a["alert_type"] for a in expected["alerts"]} >= {"rogue_device", "firmware_mismatch",
                                                             "replay"}  # fmt: skip
    for table in ("telemetry", "quarantine", "features", "alerts"):
        assert actual[table] == expected[table], f"{table} differs after SIGKILL and restart"
