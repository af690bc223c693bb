"""``iotfraud config``: every setting, its environment variable and default, as a Markdown table.

The README's configuration table is this command's output (a test keeps the two in step).
"""

from __future__ import annotations

import importlib
from pathlib import Path

import click
from pydantic_settings import BaseSettings

from infra.commandline import command, run
from infra.settings import default_text, variable_name

# (section title, module, class) in the order the README lists them.
SETTINGS_CLASSES = (
    ("Shared", "infra.settings", "CommonSettings"),
    ("Local stack", "infra.settings", "StackSettings"),
    ("Spark", "infra.settings", "SparkSettings"),
    ("Simulator", "simulator.settings", "SimulatorSettings"),
    ("Pipeline", "pipeline.settings", "PipelineSettings"),
    ("Models", "models.settings", "ModelSettings"),
    ("Dashboard", "dashboard.settings", "DashboardSettings"),
)


def rows() -> list[tuple[str, str, str, str]]:
    """(section, variable, default, description) for every setting, inherited ones once."""
    seen: set[str] = set()
    result = []
    for section, module_name, class_name in SETTINGS_CLASSES:
        cls: type[BaseSettings] = getattr(importlib.import_module(module_name), class_name)
        for name, field in cls.model_fields.items():
            variable = variable_name(cls, name)
            if variable in seen:
                continue
            seen.add(variable)
            default = default_text(field).replace("|", "\\|")
            description = (field.description or "").replace("|", "\\|")
            result.append((section, variable, default, description))
    return result


def markdown_table() -> str:
    lines = ["| component | variable | default | meaning |", "|---|---|---|---|"]
    lines += [f"| {s} | `{v}` | `{d}` | {m} |" for s, v, d, m in rows()]
    return "\n".join(lines)


START_MARK = "<!-- config-table:start -->"
END_MARK = "<!-- config-table:end -->"


def with_table(readme: str) -> str:
    """``readme`` with the text between the config-table markers replaced by the current table."""
    head, rest = readme.split(START_MARK, 1)
    _, tail = rest.split(END_MARK, 1)
    return f"{head}{START_MARK}\n{markdown_table()}\n{END_MARK}{tail}"


@command("config")
@click.option(
    "--update",
    metavar="README",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Rewrite the table between the config-table markers of this file instead.",
)
def config(update: Path | None) -> None:
    """Print every setting with its environment variable and default (a Markdown table)."""
    if update is not None:
        update.write_text(with_table(update.read_text()))
    else:
        click.echo(markdown_table())


def main(argv: list[str] | None = None) -> int:
    """``iotfraud config``."""
    return run(config, argv, prog="iotfraud config")
