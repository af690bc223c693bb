"""`make demo` installs only what the demo needs: no root for packages that only the tests use."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "system-deps.sh"


def dry_run(target: str) -> str:
    """What ``make <target>`` would run (``make -n``), from the repository."""
    result = subprocess.run(["make", "-n", target], cwd=ROOT, capture_output=True, text=True,
                            timeout=60, check=True)  # fmt: skip
    return result.stdout


def test_demo_installs_the_demo_packages_and_test_the_rest() -> None:
    demo = dry_run("demo")
    assert "scripts/system-deps.sh demo" in demo
    assert "system-deps.sh test" not in demo
    assert "scripts/system-deps.sh test" in dry_run("test")


@pytest.fixture
def bin_with_java(tmp_path: Path) -> Path:
    """A PATH with a Java but no Chromium or docker-compose, as a non-root user without sudo."""
    folder = tmp_path / "bin"
    folder.mkdir()
    for name, text in {"java": "exit 0", "id": "echo 1000"}.items():
        (folder / name).write_text(f"#!/bin/sh\n{text}\n")
        (folder / name).chmod(0o755)
    return folder


def run_script(bin_folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": str(bin_folder)}
    return subprocess.run(["/bin/bash", str(SCRIPT), *args], env=env, capture_output=True,
                          text=True, timeout=60, check=False)  # fmt: skip


def test_the_demo_needs_java_only(bin_with_java: Path) -> None:
    result = run_script(bin_with_java, "demo")
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""


def test_the_tests_also_need_chromium_and_docker_compose(bin_with_java: Path) -> None:
    result = run_script(bin_with_java, "test")
    assert result.returncode == 1
    assert "Missing Debian packages: chromium docker-compose." in result.stderr
