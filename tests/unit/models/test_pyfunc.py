"""The code a registered model carries (``models.pyfunc.CODE_MODULES``) is everything it imports
from this project, and none of it needs Spark; tests/integration/test_model_serving.py serves
such a model where the repository cannot be imported."""

from __future__ import annotations

import ast
import importlib
import importlib.util
from pathlib import Path

from models.pyfunc import CODE_MODULES, stage_code

PROJECT = {"dashboard", "infra", "iotfraud", "models", "pipeline", "simulator"}


def is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # a name inside a module (``models.detector.Detector``)
        return False


def source(module: str) -> Path:
    return Path(str(importlib.import_module(module).__file__))


def imports(module: str) -> set[str]:
    """The modules ``module`` and its package's ``__init__`` import, at module level or in a
    function."""
    found = set()
    for name in (module, module.rpartition(".")[0]):
        for node in ast.walk(ast.parse(source(name).read_text())):
            if isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    inner = f"{node.module}.{alias.name}"
                    found.add(inner if is_module(inner) else node.module)
    return found


def test_the_carried_code_is_all_the_model_imports_from_the_project_and_needs_no_spark() -> None:
    imported = set().union(*(imports(module) for module in CODE_MODULES))
    project = {name for name in imported if name.partition(".")[0] in PROJECT}
    assert project <= set(CODE_MODULES), project - set(CODE_MODULES)
    spark = {name for name in imported if name.partition(".")[0] in {"pyspark", "delta"}}
    assert spark == set()


def test_the_code_is_staged_as_packages_with_the_sources_bytes(tmp_path: Path) -> None:
    paths = stage_code(tmp_path)
    assert paths == [str(tmp_path / name) for name in ("infra", "models", "pipeline")]
    staged = {p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file()}
    expected = {f"{m.replace('.', '/')}.py" for m in CODE_MODULES}
    expected |= {f"{package}/__init__.py" for package in ("infra", "models", "pipeline")}
    assert staged == expected
    for module in CODE_MODULES:
        copy = tmp_path / f"{module.replace('.', '/')}.py"
        assert copy.read_bytes() == source(module).read_bytes()
