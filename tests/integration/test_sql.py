"""``iotfraud sql``: Spark SQL over the lake's Delta tables, registered by name."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import pytest

from infra import lake as lake_tables
from iotfraud import sql

pytestmark = pytest.mark.integration


@pytest.fixture
def analyst_lake(spark: Any, lake: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """A lake with an ``alerts`` and a ``devices`` table, and IOT_LAKE_ROOT pointing at it."""
    alerts = [("a1", "d1", "flood"), ("a2", "d1", "replay"), ("a3", "d2", "flood")]
    spark.createDataFrame(
        alerts, "alert_id string, device_id string, alert_type string"
    ).write.format("delta").save(lake_tables.table_path(lake, lake_tables.ALERTS))
    devices = [("d1", "smart_meter"), ("d2", "gps_tracker")]
    spark.createDataFrame(devices, "device_id string, device_type string").write.format(
        "delta"
    ).save(lake_tables.table_path(lake, lake_tables.DEVICES))
    monkeypatch.setenv("IOT_LAKE_ROOT", lake)
    return lake


def test_query_joins_tables_by_name_and_prints_rows(
    analyst_lake: str, capsys: pytest.CaptureFixture[str]
) -> None:
    query = (
        "SELECT d.device_type, count(*) AS alerts FROM alerts a JOIN devices d USING (device_id) "
        "GROUP BY d.device_type ORDER BY alerts DESC"
    )
    assert sql.main([query]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].split() == ["device_type", "alerts"]
    assert [line.split() for line in lines[1:]] == [["smart_meter", "2"], ["gps_tracker", "1"]]


def test_long_results_are_cut_and_say_so(
    analyst_lake: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert sql.main(["SELECT alert_id FROM alerts ORDER BY alert_id", "--max-rows", "2"]) == 0
    out = capsys.readouterr().out
    assert "a1" in out and "a2" in out and "a3" not in out
    assert "first 2 rows shown" in out


def test_result_written_as_csv(analyst_lake: str, tmp_path: Path) -> None:
    output = tmp_path / "floods.csv"
    query = "SELECT device_id FROM alerts WHERE alert_type = 'flood' ORDER BY device_id"
    assert sql.main([query, "--output", str(output)]) == 0
    parts = sorted(output.glob("part-*.csv"))
    rows = [row for part in parts for row in csv.DictReader(part.open())]
    assert sorted(r["device_id"] for r in rows) == ["d1", "d2"]


def test_unknown_table_is_a_clear_error_listing_the_tables(
    analyst_lake: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert sql.main(["SELECT * FROM alertz"]) == 2
    err = capsys.readouterr().err
    assert "alertz" in err
    assert "tables in" in err and "devices, alerts" in err


def test_output_format_must_be_known() -> None:
    with pytest.raises(ValueError, match="--format csv"):
        sql.output_format("result.txt", None)
    assert sql.output_format("out.parquet", None) == "parquet"
    assert sql.output_format(None, None) == "table"
