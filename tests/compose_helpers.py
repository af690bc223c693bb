"""Reading docker-compose.yml, the Dockerfile and .dockerignore without a Docker engine.

``docker-compose config`` (Debian's docker-compose 1.29.2) parses, interpolates and validates the
compose file; the tests read its resolved output.
"""

from __future__ import annotations

import fnmatch
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = ROOT / "docker-compose.yml"
ENV_EXAMPLE = ROOT / ".env.example"
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
BIN = Path(sys.executable).parent  # the virtualenv's bin: iotfraud, mlflow, spark-submit


def docker_compose_command() -> str:
    """The docker-compose client; its absence fails the test (CI installs it), never skips."""
    found = shutil.which("docker-compose")
    if found is None:
        pytest.fail(
            "docker-compose is not installed: run scripts/system-deps.sh "
            "(apt-get install docker-compose)"
        )
    return found


def compose_config(
    docker_compose: str, env_file: Path, *extra: str
) -> subprocess.CompletedProcess[str]:
    """``docker-compose config`` with ``env_file`` in place of ``.env`` and a clean environment,
    so neither a developer's ``.env`` nor exported variables change the result."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(Path.home())}
    return subprocess.run(
        [docker_compose, "--project-directory", str(ROOT), "--env-file", str(env_file),
         "-f", str(COMPOSE), "config", *extra],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=120, check=False,
    )  # fmt: skip


def resolved_services(docker_compose: str, empty_env_file: Path) -> dict[str, dict[str, Any]]:
    """The services as docker-compose resolves them with every default."""
    result = compose_config(docker_compose, empty_env_file)
    assert result.returncode == 0, result.stderr
    services: dict[str, dict[str, Any]] = yaml.safe_load(result.stdout)["services"]
    return services


def env_of(service: dict[str, Any]) -> dict[str, str]:
    return {k: "" if v is None else str(v) for k, v in (service.get("environment") or {}).items()}


def option(args: list[str], name: str) -> list[str]:
    """Every value of ``--name VALUE`` or ``--name=VALUE`` in ``args``."""
    values = []
    for i, arg in enumerate(args):
        if arg == name and i + 1 < len(args):
            values.append(args[i + 1])
        elif arg.startswith(name + "="):
            values.append(arg.split("=", 1)[1])
    return values


def dockerfile_instructions() -> dict[str, list[str]]:
    """Instruction -> its arguments, in order, with continuation lines joined."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    found: dict[str, list[str]] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if line and not line.startswith("#"):
            instruction, _, rest = line.partition(" ")
            found.setdefault(instruction.upper(), []).append(" ".join(rest.split()))
    return found


def dockerfile_env() -> dict[str, str]:
    env: dict[str, str] = {}
    for item in dockerfile_instructions().get("ENV", []):
        for pair in shlex.split(item):
            name, _, value = pair.partition("=")
            env[name] = value
    return env


def ignored_by_docker(path: str) -> bool:
    """Whether ``path`` (relative to the build context) is left out by .dockerignore."""
    patterns = [
        line.strip().rstrip("/")
        for line in DOCKERIGNORE.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    for pattern in patterns:
        for prefix in prefixes:
            if fnmatch.fnmatch(prefix, pattern):
                return True
            if pattern.startswith("**/") and fnmatch.fnmatch(prefix.split("/")[-1], pattern[3:]):
                return True
    return False
