"""The simulator CLI without Kafka: registry commands, offline JSON-lines output, config errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from deltalake import DeltaTable

from infra import lake as lk
from simulator.cli import main


def test_registry_create_then_change(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = str(tmp_path / "lake")
    assert main(["registry", "create", "--devices", "40", "--seed", "3", "--lake-root", root]) == 0
    assert main(["registry", "change", "--count", "4", "--seed", "1", "--lake-root", root]) == 0
    out = capsys.readouterr().out
    assert "40 devices written" in out and "4 devices changed" in out
    table = DeltaTable(lk.table_path(root, lk.DEVICES))
    assert table.version() == 1 and table.to_pyarrow_table().num_rows == 40


def test_change_without_registry_says_what_to_do(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["registry", "change", "--lake-root", str(tmp_path)]) == 2
    assert "registry create" in capsys.readouterr().err


def test_simulate_offline_to_json_lines(tmp_path: Path) -> None:
    root, out = str(tmp_path / "lake"), tmp_path / "landing"
    args = ["simulate", "--devices", "50", "--lake-root", root, "--out", str(out),
            "--sim-seconds", "1800", "--scenario-rate", "300", "--start-time",
            "2026-01-05T00:00:00Z"]  # fmt: skip
    assert main(args) == 0
    lines = [line for f in sorted(out.glob("*.jsonl")) for line in f.read_bytes().splitlines()]
    assert len(lines) > 2000
    parsed = 0
    for line in lines:
        try:
            json.loads(line)
            parsed += 1
        except ValueError:
            pass
    assert parsed >= len(lines) * 0.95
    truth = DeltaTable(lk.table_path(root, lk.GROUND_TRUTH)).to_pyarrow_table()
    assert truth.num_rows > 0
    devices = DeltaTable(lk.table_path(root, lk.DEVICES)).to_pyarrow_table()
    assert devices.num_rows == 50


def test_bad_configuration_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("IOT_SIM_RATE", "fast")
    assert main(["simulate"]) == 2
    assert "IOT_SIM_RATE" in capsys.readouterr().err
    monkeypatch.delenv("IOT_SIM_RATE")
    assert main(["simulate", "--rate-of", "flood"]) == 2
    assert "--rate-of" in capsys.readouterr().err
