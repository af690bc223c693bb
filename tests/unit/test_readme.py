"""The README stays true: its configuration table is what the settings classes define."""

from __future__ import annotations

from pathlib import Path

from iotfraud.config import markdown_table, rows, with_table

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_configuration_table_is_current() -> None:
    text = README.read_text()
    assert with_table(text) == text, "run: .venv/bin/iotfraud config --update README.md"


def test_every_setting_has_a_description_and_a_variable() -> None:
    table = rows()
    assert {"KAFKA_BOOTSTRAP_SERVERS", "IOT_LAKE_ROOT", "IOT_PIPELINE_WINDOW"} <= {
        variable for _, variable, _, _ in table
    }
    assert all(description for _, _, _, description in table)
    assert markdown_table().count("\n") == len(table) + 1
