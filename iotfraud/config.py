"""``iotfraud config``: every setting, its environment variable and default, as a Markdown table.

The README's configuration table is this command's output (a test keeps the two in step).
"""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path
from typing import Any

from pydantic_settings import BaseSettings

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


def _default(field: Any) -> str:
    if field.default_factory is not None:
        try:
            value = field.default_factory()
        except TypeError:
            value = "(computed)"
    else:
        value = field.default
    text = str(value) if value not in ("", None) else "(empty)"
    text = text.replace(str(Path.home()), "~")
    if isinstance(value, dict) and not value:
        text = "{}"
    return text.replace("|", "\\|")


def rows() -> list[tuple[str, str, str, str]]:
    """(section, variable, default, description) for every setting, inherited ones once."""
    seen: set[str] = set()
    result = []
    for section, module_name, class_name in SETTINGS_CLASSES:
        cls: type[BaseSettings] = getattr(importlib.import_module(module_name), class_name)
        prefix = str(cls.model_config.get("env_prefix", ""))
        for name, field in cls.model_fields.items():
            alias = field.validation_alias
            variable = alias if isinstance(alias, str) else f"{prefix}{name}".upper()
            if variable in seen:
                continue
            seen.add(variable)
            description = (field.description or "").replace("|", "\\|")
            result.append((section, variable, _default(field), description))
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="iotfraud config", description=__doc__)
    parser.add_argument("--update", metavar="README", help="rewrite the table in this file")
    args = parser.parse_args(argv)
    if args.update:
        path = Path(args.update)
        path.write_text(with_table(path.read_text()))
        return 0
    print(markdown_table())
    return 0
