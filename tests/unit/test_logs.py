"""Where a command's log records go (issue 23): a quiet terminal, everything in the log file."""

from __future__ import annotations

import logging
import warnings
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra import logs


@pytest.fixture
def restore_logging(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """configure_logging changes the process's logging: give the next test it back."""
    monkeypatch.setenv("MLFLOW_CONFIGURE_LOGGING", "false")  # it sets it too
    # An earlier test's CLI may have captured warnings: a second capture would do nothing.
    logging.captureWarnings(False)
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    for handler in root.handlers:
        handler.close()
    root.handlers[:] = handlers
    root.setLevel(level)
    logging.captureWarnings(False)
    logs._active.setup = None


def record(name: str, level: int) -> logging.LogRecord:
    return logging.LogRecord(name, level, __file__, 1, "message", None, None)


@pytest.mark.parametrize(
    ("name", "level", "shown"),
    [
        ("pipeline.cli", logging.INFO, True),  # what the command says
        ("iotfraud.demo", logging.INFO, True),
        ("pipeline.sinks", logging.INFO, False),  # the project's details
        ("pipeline.sinks", logging.DEBUG, False),
        ("pipeline.scoring", logging.WARNING, True),  # the project's warnings
        ("infra.processes", logging.ERROR, True),
        ("mlflow.pyfunc", logging.WARNING, False),  # libraries: the log file
        ("py4j.clientserver", logging.ERROR, False),
        ("py.warnings", logging.WARNING, False),
        ("pipelines_of_another_package", logging.WARNING, False),
    ],
)
def test_a_quiet_terminal_shows_what_the_command_says_and_the_projects_warnings(
    name: str, level: int, shown: bool
) -> None:
    assert logs.for_the_terminal(record(name, level)) is shown


@pytest.mark.usefixtures("restore_logging")
def test_the_log_file_gets_everything_and_the_terminal_what_it_shows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mlflow = logging.getLogger("mlflow")  # as MLflow sets it up when imported
    mlflow.handlers, mlflow.propagate = [logging.StreamHandler()], False

    file = logs.configure_logging(state_dir=tmp_path)

    assert file == tmp_path / "logs" / "iotfraud.log"
    logging.getLogger("pipeline.sinks").info("creating Delta table telemetry")
    logging.getLogger("mlflow.models").warning("env_manager is deprecated")
    warnings.warn("cloudpickle version differs", UserWarning, stacklevel=1)
    logging.getLogger("pipeline.cli").info("pipeline running")
    logging.getLogger("pipeline.scoring").warning("no champion model")

    terminal = [line.split(": ", 1)[1] for line in capsys.readouterr().err.splitlines()]
    assert terminal == ["pipeline running", "no champion model"]
    text = file.read_text()
    for message in (
        "creating Delta table telemetry",
        "env_manager is deprecated",
        "cloudpickle version differs",
        "pipeline running",
        "no champion model",
    ):
        assert message in text


@pytest.mark.usefixtures("restore_logging")
def test_verbose_shows_everything_on_the_terminal_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    file = logs.configure_logging(verbose=True, state_dir=tmp_path)

    logging.getLogger("pipeline.sinks").debug("creating Delta table telemetry")
    logging.getLogger("mlflow.models").warning("env_manager is deprecated")

    terminal = capsys.readouterr().err
    assert "creating Delta table telemetry" in terminal and "env_manager is deprecated" in terminal
    assert file is not None and "env_manager is deprecated" in file.read_text()


@pytest.mark.usefixtures("restore_logging")
@pytest.mark.parametrize("verbose", [False, True])
def test_the_driver_jvm_gets_a_log4j2_configuration_that_writes_the_log_file(
    tmp_path: Path, verbose: bool
) -> None:
    state = tmp_path / "a state dir"  # spark-submit splits its option strings on spaces
    file = logs.configure_logging(verbose=verbose, state_dir=state)

    options = logs.spark_log_conf()["spark.driver.extraJavaOptions"]

    config = state / "logs" / ("log4j2-verbose.xml" if verbose else "log4j2.xml")
    assert options == (f'-Dlog4j2.configurationFile="{config}" -Diotfraud.log.file="{file}"')
    root = ET.parse(config).getroot()
    appenders = {a.get("ref") for a in root.iter("AppenderRef")}
    assert appenders == ({"file", "terminal"} if verbose else {"file"})
    assert root.find("Appenders/File").get("fileName") == "${sys:iotfraud.log.file}"  # type: ignore[union-attr]
    # Spark's warning for each batch longer than its trigger is left out unless verbose.
    levels = {logger.get("name"): logger.get("level") for logger in root.iter("Logger")}
    assert levels.get(logs.SPARK_FALLING_BEHIND) == (None if verbose else "ERROR")


def test_without_configured_logging_the_jvm_keeps_sparks_own() -> None:
    logs._active.setup = None
    assert logs.spark_log_conf() == {}
