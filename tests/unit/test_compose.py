"""The docker-compose demo, checked without a Docker engine.

``docker-compose config`` (Debian's docker-compose 1.29.2; scripts/system-deps.sh installs it)
parses, interpolates and validates the file against the Compose schema. The tests then read its
resolved output and check it against the project: the ``iotfraud`` commands exist and accept
their arguments, every setting the file passes is a real setting with a valid value, the Spark
packages are the pinned versions, the topic script creates the topics, and the MLflow command
line is accepted and lets the other containers in. (tests/integration/test_compose_mlflow.py
runs that MLflow command.)
"""

from __future__ import annotations

import importlib
import importlib.metadata
import itertools
import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import pytest

from infra.errors import ConfigError
from infra.jars import DELTA_VERSION, KAFKA_VERSION, SPARK_BUNDLE, SPARK_VERSION
from infra.settings import load_settings
from iotfraud.cli import COMMANDS, parse
from iotfraud.config import SETTINGS_CLASSES, rows
from tests.compose_helpers import (
    BIN,
    COMPOSE,
    ENV_EXAMPLE,
    ROOT,
    compose_config,
    docker_compose_command,
    dockerfile_env,
    dockerfile_instructions,
    env_of,
    ignored_by_docker,
    option,
    resolved_services,
)

PROJECT_IMAGE_SERVICES = {
    "mlflow", "spark-master", "spark-worker", "registry", "pipeline", "trainer", "simulator",
    "dashboard",
}  # fmt: skip
# Services that read or write the Delta tables (Spark executors write them on the worker).
LAKE_SERVICES = {"spark-worker", "registry", "pipeline", "simulator", "dashboard"}
SHARED_VARIABLES = {"KAFKA_BOOTSTRAP_SERVERS", "MLFLOW_TRACKING_URI"}
TOPIC_SCRIPT = "/opt/kafka/bin/kafka-topics.sh"


@pytest.fixture(scope="module")
def docker_compose() -> str:
    return docker_compose_command()


@pytest.fixture(scope="module")
def empty_env_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("compose") / "empty.env"
    path.write_text("")
    return path


@pytest.fixture(scope="module")
def services(docker_compose: str, empty_env_file: Path) -> dict[str, dict[str, Any]]:
    return resolved_services(docker_compose, empty_env_file)


# --- the file is valid ------------------------------------------------------------------------


def test_docker_compose_accepts_the_file(docker_compose: str, empty_env_file: Path) -> None:
    for env_file in (empty_env_file, ENV_EXAMPLE):
        result = compose_config(docker_compose, env_file, "-q")
        assert result.returncode == 0, f"with {env_file.name}: {result.stderr}"
        assert result.stderr.strip() == "", result.stderr  # no warning (e.g. an unset variable)


def test_docker_compose_rejects_an_invalid_file(docker_compose: str, tmp_path: Path) -> None:
    """The check above can fail: a misspelt key and an unknown condition are refused."""
    broken = COMPOSE.read_text().replace("condition: service_healthy", "condition: healthy", 1)
    broken = broken.replace("    healthcheck:", "    helthcheck:", 1)
    path = tmp_path / "docker-compose.yml"
    path.write_text(broken)
    result = subprocess.run(
        [docker_compose, "-f", str(path), "config", "-q"],
        capture_output=True, text=True, cwd=tmp_path, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode != 0
    assert "helthcheck" in result.stderr
    assert "healthy" in result.stderr


def test_env_example_documents_exactly_the_defaults(
    docker_compose: str, empty_env_file: Path
) -> None:
    """Every ${VAR:-default} has a default, .env.example lists each variable once with that
    default, and lists nothing the file does not use."""
    text = COMPOSE.read_text()
    used = re.findall(r"(?<!\$)\$\{(\w+)(:?-)?([^}]*)\}", text)
    assert used, "the compose file takes no settings from .env"
    without_default = sorted({name for name, dash, _ in used if not dash})
    assert not without_default, f"variables without a default: {without_default}"

    example: dict[str, str] = {}
    for line in ENV_EXAMPLE.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            name, sep, value = line.partition("=")
            assert sep, f".env.example: not NAME=value: {line!r}"
            assert name not in example, f".env.example sets {name} twice"
            example[name] = value
    assert {name for name, _, _ in used} == set(example)
    for name, _, default in used:
        assert example[name] == default, f"{name}: compose default {default!r} != .env.example"

    with_example = compose_config(docker_compose, ENV_EXAMPLE)
    with_defaults = compose_config(docker_compose, empty_env_file)
    assert with_example.returncode == 0, with_example.stderr
    assert with_example.stdout == with_defaults.stdout


def test_dependencies_wait_for_something_that_can_happen(
    services: dict[str, dict[str, Any]],
) -> None:
    """service_healthy needs a healthcheck; service_completed_successfully a one-shot service."""
    for name, service in services.items():
        for target, spec in (service.get("depends_on") or {}).items():
            condition = spec.get("condition")
            if condition == "service_healthy":
                assert "healthcheck" in services[target], f"{name} waits for {target}'s health"
            elif condition == "service_completed_successfully":
                assert services[target].get("restart") == "no", f"{target} is not one-shot"
    pipeline = services["pipeline"]["depends_on"]
    assert pipeline["kafka-topics"]["condition"] == "service_completed_successfully"
    assert pipeline["registry"]["condition"] == "service_completed_successfully"
    assert pipeline["mlflow"]["condition"] == "service_healthy"
    assert pipeline["spark-master"]["condition"] == "service_healthy"
    assert services["simulator"]["depends_on"]["kafka-topics"]["condition"] == (
        "service_completed_successfully"
    )
    for name in ("kafka", "mlflow", "spark-master", "spark-worker", "dashboard"):
        assert "healthcheck" in services[name], name
    # The devices start once the pipeline runs: its health is the file `run --ready-file` writes.
    assert services["simulator"]["depends_on"]["pipeline"]["condition"] == "service_healthy"
    ready = option(list(services["pipeline"]["command"]), "--ready-file")
    assert len(ready) == 1
    assert services["pipeline"]["healthcheck"]["test"] == ["CMD", "test", "-f", *ready]


# --- the commands exist and accept their arguments --------------------------------------------


def iotfraud_commands(services: dict[str, dict[str, Any]]) -> dict[str, list[str]]:
    """Service -> arguments of ``iotfraud`` (the image's entrypoint unless overridden)."""
    return {
        name: list(service["command"])
        for name, service in services.items()
        if name in PROJECT_IMAGE_SERVICES and not service.get("entrypoint")
    }


def test_the_image_entrypoint_is_the_iotfraud_command() -> None:
    instructions = dockerfile_instructions()
    assert instructions["ENTRYPOINT"] == ['["iotfraud"]']
    (script,) = importlib.metadata.entry_points(group="console_scripts", name="iotfraud")
    assert script.value == "iotfraud.cli:main"


def test_every_iotfraud_command_exists_and_parses(services: dict[str, dict[str, Any]]) -> None:
    commands = iotfraud_commands(services)
    assert set(commands) == {"registry", "trainer", "simulator", "dashboard"}
    for service, args in commands.items():
        assert args and args[0] in COMMANDS, f"{service}: unknown iotfraud command {args[:1]}"
        try:
            parse(args)
        except click.UsageError as exc:
            pytest.fail(f"{service}: iotfraud {shlex.join(args)} is refused: {exc}")


def test_every_iotfraud_subcommand_answers_help(services: dict[str, dict[str, Any]]) -> None:
    """``iotfraud registry create --help`` and the like, as the installed command."""
    iotfraud = BIN / "iotfraud"
    assert iotfraud.exists(), f"{iotfraud} is missing: run make setup"
    commands = iotfraud_commands(services)
    # The pipeline runs under spark-submit, but it is `iotfraud pipeline run` all the same.
    commands["pipeline"] = ["pipeline", *submitted_args(services["pipeline"])]
    for service, args in commands.items():
        words = list(itertools.takewhile(lambda arg: not arg.startswith("-"), args))
        assert 1 <= len(words) <= 2, args
        result = subprocess.run(
            [str(iotfraud), *words, "--help"], capture_output=True, text=True, timeout=120,
            check=False,
        )  # fmt: skip
        assert result.returncode == 0, f"{service}: iotfraud {' '.join(words)}: {result.stderr}"
        assert result.stdout.startswith("usage:"), result.stdout[:200]
        if len(words) == 2:
            assert f"{words[0]} {words[1]}" in result.stdout.splitlines()[0]


def submitted_args(pipeline: dict[str, Any]) -> list[str]:
    """The arguments after the Python file that spark-submit runs."""
    command = list(pipeline["command"])
    scripts = [i for i, arg in enumerate(command) if arg.endswith(".py")]
    assert len(scripts) == 1, command
    return command[scripts[0] + 1 :]


def test_the_pipeline_is_submitted_to_the_cluster_with_a_real_entry_point(
    services: dict[str, dict[str, Any]],
) -> None:
    pipeline = services["pipeline"]
    assert pipeline["entrypoint"] == ["spark-submit"]
    command = list(pipeline["command"])
    script = next(arg for arg in command if arg.endswith(".py"))
    assert script.startswith("/app/"), "the image has the project under /app"
    local = ROOT / script.removeprefix("/app/")
    assert local.is_file(), f"{local} does not exist"
    assert not ignored_by_docker(local.relative_to(ROOT).as_posix()), f"{local} is not copied"

    args = submitted_args(pipeline)
    assert parse(["pipeline", *args]).command_path == "iotfraud pipeline run"
    result = subprocess.run(
        [sys.executable, str(local), *args, "--help"], capture_output=True, text=True,
        timeout=120, check=False, cwd=ROOT,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: iotfraud pipeline run"), result.stdout[:200]

    env = env_of(pipeline)
    master = option(command, "--master")
    assert master == ["spark://spark-master:7077"]
    # The session builder sets the master from IOT_SPARK_MASTER: both must name the cluster.
    assert env["IOT_SPARK_MASTER"] == master[0]
    assert env["IOT_SPARK_RESOLVE_JARS"].lower() == "false"
    host, port = master[0].removeprefix("spark://").split(":")
    master_args = list(services["spark-master"]["command"])
    assert master_args[0] == "org.apache.spark.deploy.master.Master"
    assert option(master_args, "--host") == [host]
    assert option(master_args, "--port") == [port]
    worker_args = list(services["spark-worker"]["command"])
    assert worker_args[:2] == ["org.apache.spark.deploy.worker.Worker", master[0]]
    # Executors connect back to the driver by this name.
    assert f"spark.driver.host={pipeline['hostname']}" in option(command, "--conf")


def test_spark_packages_are_the_pinned_versions(services: dict[str, dict[str, Any]]) -> None:
    command = list(services["pipeline"]["command"])
    packages = option(command, "--packages")
    assert len(packages) == 1
    submitted = set(packages[0].split(","))
    pinned = {str(artifact) for artifact in SPARK_BUNDLE.artifacts}
    assert submitted == pinned
    versions = {coordinate.rsplit(":", 1)[1] for coordinate in submitted}
    assert versions == {SPARK_VERSION, DELTA_VERSION}
    assert importlib.metadata.version("pyspark") == SPARK_VERSION
    assert importlib.metadata.version("delta-spark") == DELTA_VERSION
    excludes = {
        conf.split("=", 1)[1]
        for conf in option(command, "--conf")
        if conf.startswith("spark.jars.excludes=")
    }
    assert excludes == {",".join(f"{g}:{m}" for g, m in SPARK_BUNDLE.excludes)}

    # The image warms the same packages into the Ivy folder the pipeline names.
    arg = next(a for a in dockerfile_instructions()["ARG"] if a.startswith("SPARK_PACKAGES="))
    assert set(arg.split("=", 1)[1].split(",")) == pinned
    ivy = [c for c in option(command, "--conf") if c.startswith("spark.jars.ivy=")]
    assert ivy and ivy[0] in " ".join(dockerfile_instructions()["RUN"])


def test_kafka_is_the_pinned_broker_and_advertises_the_internal_name(
    services: dict[str, dict[str, Any]],
) -> None:
    kafka = services["kafka"]
    assert kafka["image"] == f"apache/kafka:{KAFKA_VERSION}"
    assert services["kafka-topics"]["image"] == kafka["image"]
    env = env_of(kafka)
    advertised = dict(item.split("://", 1) for item in env["KAFKA_ADVERTISED_LISTENERS"].split(","))
    listeners = dict(item.split("://", 1) for item in env["KAFKA_LISTENERS"].split(","))
    for name, service in services.items():
        bootstrap = env_of(service).get("KAFKA_BOOTSTRAP_SERVERS")
        if bootstrap is None:
            continue
        assert bootstrap in advertised.values(), f"{name}: {bootstrap} is not advertised"
        listener = next(k for k, v in advertised.items() if v == bootstrap)
        assert listeners[listener].endswith(":" + bootstrap.rsplit(":", 1)[1])
        assert bootstrap.split(":")[0] == kafka["hostname"] == "kafka"
    assert env["KAFKA_PROCESS_ROLES"] == "broker,controller"
    assert env["KAFKA_NODE_ID"] == "1"


# --- the settings are real --------------------------------------------------------------------


def known_variables() -> set[str]:
    return {variable for _, variable, _, _ in rows()}


def project_variables(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith("IOT_") or k in SHARED_VARIABLES}


def test_every_variable_passed_is_a_real_setting(services: dict[str, dict[str, Any]]) -> None:
    known = known_variables()
    checked = 0
    for name, service in services.items():
        for variable in project_variables(env_of(service)):
            assert variable in known, f"{name} sets {variable}, which no setting reads"
            checked += 1
    for variable in project_variables(dockerfile_env()):
        assert variable in known, f"the Dockerfile sets {variable}, which no setting reads"
        checked += 1
    assert checked > 20


@pytest.fixture
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    for variable in list(os.environ):
        if variable.startswith("IOT_") or variable in SHARED_VARIABLES:
            monkeypatch.delenv(variable)
    yield monkeypatch


def test_every_service_environment_is_a_valid_configuration(
    services: dict[str, dict[str, Any]], clean_environment: pytest.MonkeyPatch
) -> None:
    """Each component's settings load from each service's environment (plus the image's)."""
    for name in PROJECT_IMAGE_SERVICES:
        with pytest.MonkeyPatch.context() as env:
            for variable, value in {**dockerfile_env(), **env_of(services[name])}.items():
                if variable.startswith("IOT_") or variable in SHARED_VARIABLES:
                    env.setenv(variable, value)
            for _, module_name, class_name in SETTINGS_CLASSES:
                cls = getattr(importlib.import_module(module_name), class_name)
                try:
                    load_settings(cls)
                except ConfigError as exc:
                    pytest.fail(f"{name}: {exc}")


def test_invalid_values_would_be_caught(clean_environment: pytest.MonkeyPatch) -> None:
    """The check above can fail: a window that is not a multiple of the slide is refused."""
    from pipeline.settings import PipelineSettings

    clean_environment.setenv("IOT_PIPELINE_WINDOW", "10 minutes")
    clean_environment.setenv("IOT_PIPELINE_SLIDE", "3 minutes")
    with pytest.raises(ConfigError, match="multiple"):
        load_settings(PipelineSettings)


def test_the_lake_and_checkpoints_are_on_one_shared_volume(
    services: dict[str, dict[str, Any]],
) -> None:
    mounts: dict[str, dict[str, str]] = {}
    for name in LAKE_SERVICES:
        volumes = services[name].get("volumes") or []
        mounts[name] = {
            spec.split(":")[0]: spec.split(":")[1] for spec in volumes if isinstance(spec, str)
        }
        assert mounts[name].get("lake") == "/data", f"{name} does not mount the lake at /data"
    for name, service in services.items():
        env = env_of(service)
        for variable in ("IOT_LAKE_ROOT", "IOT_PIPELINE_CHECKPOINT_ROOT"):
            if variable in env and name in LAKE_SERVICES:
                assert env[variable].startswith("/data/"), f"{name}: {variable}={env[variable]}"
    assert env_of(services["pipeline"])["IOT_PIPELINE_CHECKPOINT_ROOT"].startswith("/data/")
    assert (
        len({env_of(services[n])["IOT_LAKE_ROOT"] for n in LAKE_SERVICES - {"spark-worker"}}) == 1
    )
    # The image creates the mount points owned by its user, so new volumes are writable.
    run = " ".join(dockerfile_instructions()["RUN"])
    for path in ("/data/lake", "/data/checkpoints", "/mlflow/artifacts"):
        assert path in run


def test_the_dashboard_listens_where_it_is_published(services: dict[str, dict[str, Any]]) -> None:
    dashboard = services["dashboard"]
    env = env_of(dashboard)
    assert env["IOT_DASH_ADDRESS"] == "0.0.0.0"
    assert any(str(p).endswith(f":{env['IOT_DASH_PORT']}/tcp") for p in dashboard["ports"])
    assert f"localhost:{env['IOT_DASH_PORT']}/" in " ".join(dashboard["healthcheck"]["test"])
    assert dashboard["command"] == ["dashboard"]


# --- the one-shot topic service ---------------------------------------------------------------


def test_the_topic_service_creates_the_topics(
    services: dict[str, dict[str, Any]], tmp_path: Path
) -> None:
    """Run the service's script with kafka-topics.sh replaced by a recorder."""
    service = services["kafka-topics"]
    assert service["entrypoint"] == ["/bin/bash", "-c"]
    # docker-compose config keeps $$ escaped; the container sees a single $.
    script = service["command"][0].replace("$$", "$")
    assert TOPIC_SCRIPT in script
    log = tmp_path / "calls.jsonl"
    recorder = tmp_path / "kafka-topics.sh"
    recorder.write_text(
        "#!/usr/bin/env python3\nimport json, sys\n"
        f"open({str(log)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n"
    )
    recorder.chmod(0o755)
    result = subprocess.run(
        ["/bin/bash", "-c", script.replace(TOPIC_SCRIPT, str(recorder))],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    created = {
        option(call, "--topic")[0]: int(option(call, "--partitions")[0])
        for call in calls
        if "--create" in call
    }
    simulator = env_of(services["simulator"])
    assert created == {simulator["IOT_TOPIC"]: 6, "iot.firmware_updates": 1}
    assert int(simulator["IOT_SIM_PARTITIONS"]) == created["iot.telemetry"]
    for call in calls:
        assert option(call, "--bootstrap-server") == ["kafka:9092"]
        if "--create" in call:
            assert "--if-not-exists" in call  # a second `up` must succeed too
    topics = {env_of(s)["IOT_TOPIC"] for s in services.values() if "IOT_TOPIC" in env_of(s)}
    assert topics == {"iot.telemetry"}


# --- the MLflow server ------------------------------------------------------------------------


def test_the_mlflow_command_is_accepted_and_lets_the_containers_in(
    services: dict[str, dict[str, Any]],
) -> None:
    import click
    from mlflow.cli import server
    from mlflow.server.security_utils import is_allowed_host_header

    service = services["mlflow"]
    assert service["entrypoint"] == ["mlflow"]
    args = list(service["command"])
    assert args[0] == "server"
    params = server.make_context("mlflow server", args[1:]).params  # refuses unknown options
    assert params["serve_artifacts"] is True
    assert params["backend_store_uri"].startswith("sqlite:////mlflow/")
    assert params["artifacts_destination"].startswith("/mlflow/")
    assert any(v.endswith(":/mlflow:rw") for v in service["volumes"]), "the store is not kept"

    uri = env_of(services["pipeline"])["MLFLOW_TRACKING_URI"]
    for name in ("pipeline", "trainer", "dashboard"):
        assert env_of(services[name])["MLFLOW_TRACKING_URI"] == uri
    container_host = uri.removeprefix("http://")
    assert container_host == f"{service['hostname']}:{params['port']}"
    allowed = params["allowed_hosts"].split(",")
    # The containers, and a browser on the published port, get through; anyone else does not.
    assert is_allowed_host_header(allowed, container_host)
    assert is_allowed_host_header(allowed, "localhost:5000")
    assert not is_allowed_host_header(allowed, "attacker.example.com")
    with pytest.raises(click.NoSuchOption, match="bogus"):
        server.make_context("mlflow server", [*args[1:], "--bogus"])


# --- the image --------------------------------------------------------------------------------


def test_the_image_is_the_one_described() -> None:
    instructions = dockerfile_instructions()
    assert instructions["FROM"] == ["python:3.11-slim-bookworm"]
    run = " ".join(instructions["RUN"])
    assert "openjdk-17-jre-headless" in run
    assert 'pip install "/app[all]"' in run
    users = instructions["USER"]
    assert users and users[-1] not in ("root", "0"), "the services must not run as root"
    assert "useradd" in run and users[-1] in run


def test_dockerignore_keeps_local_state_out_and_the_sources_in() -> None:
    for path in (".venv/bin/python", ".iotfraud/lake", ".git/HEAD", ".env",
                 "pipeline/__pycache__/job.cpython-311.pyc", ".mypy_cache/x", ".ruff_cache/x",
                 ".pytest_cache/x"):  # fmt: skip
        assert ignored_by_docker(path), f"{path} would be sent to the Docker build"
    include = re.search(r"^include = \[(.*)\]$", (ROOT / "pyproject.toml").read_text(), re.M)
    assert include is not None, "pyproject.toml: no [tool.setuptools.packages.find] include"
    packages = [name.strip(' "*') for name in include.group(1).split(",")]
    needed = ["pyproject.toml", "README.md", "deploy/submit_pipeline.py"]
    needed += [f"{name}/__init__.py" for name in packages]
    for path in needed:
        assert (ROOT / path).exists(), path
        assert not ignored_by_docker(path), f"{path} is needed in the image"


def test_system_deps_installs_docker_compose() -> None:
    script = (ROOT / "scripts" / "system-deps.sh").read_text()
    assert "command -v docker-compose" in script
    assert "missing+=(docker-compose)" in script
