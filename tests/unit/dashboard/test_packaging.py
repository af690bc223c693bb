"""``pip install 'iotfraud[dashboard]'`` gives every page what it imports, and the map's borders."""

from __future__ import annotations

import ast
import fnmatch
import sys
from importlib import metadata
from pathlib import Path

import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[3]
FIRST_PARTY = {"infra", "simulator", "pipeline", "models", "dashboard", "iotfraud"}


def _imports(path: Path) -> set[str]:
    """Modules ``path`` imports at run time (``from a import b`` also names ``a.b``)."""
    names: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and ast.unparse(node.test).endswith("TYPE_CHECKING"):
            return
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text()))
    return names


def _source(module: str) -> Path | None:
    base = REPO.joinpath(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.exists():
            return path
    return None


def _third_party_imports() -> set[str]:
    """Top-level names of the packages the dashboard's modules reach, following our own."""
    todo = sorted((REPO / "dashboard").rglob("*.py"))
    seen: set[Path] = set()
    found: set[str] = set()
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        for name in _imports(path):
            top = name.split(".")[0]
            if top in FIRST_PARTY:
                source = _source(name)
                if source is not None:
                    todo.append(source)
            elif top not in sys.stdlib_module_names and top != "__future__":
                found.add(top)
    return found


def _installed_by(requirements: list[str]) -> set[str]:
    """The distributions pip installs for ``requirements``: them and, from their installed
    metadata, what they require in turn."""
    todo = [Requirement(r) for r in requirements]
    closure: set[str] = set()
    while todo:
        requirement = todo.pop()
        name = canonicalize_name(requirement.name)
        if name in closure:
            continue
        closure.add(name)
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        for text in requires:
            nested = Requirement(text)
            if nested.marker is None or nested.marker.evaluate({"extra": ""}):
                todo.append(nested)
    return closure


def test_the_dashboard_extra_installs_every_package_the_pages_import() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    installed = _installed_by(
        [*project["dependencies"], *project["optional-dependencies"]["dashboard"]]
    )
    distributions = metadata.packages_distributions()
    imported = _third_party_imports()
    assert {"streamlit", "mlflow", "deltalake"} <= imported
    missing = {
        top: distributions.get(top, [top])
        for top in imported
        if not any(canonicalize_name(d) in installed for d in distributions.get(top, [top]))
    }
    assert missing == {}


def test_the_map_borders_ship_with_the_package() -> None:
    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    patterns = setuptools["package-data"]["dashboard"]
    borders = REPO / "dashboard" / "assets" / "countries-110m.geojson"
    assert any(fnmatch.fnmatch("assets/countries-110m.geojson", p) for p in patterns)
    assert 0 < borders.stat().st_size < 1_000_000
