"""Logging set-up for the command-line entry points (library code only calls getLogger).

A command's terminal shows what the command itself says and the project's warnings. Everything
else goes to one log file under the state folder (``<state dir>/logs/iotfraud.log``, shared by
the demo and its children): the project's INFO lines, the libraries' loggers (py4j, MLflow),
Python warnings, and the Spark driver JVM's log4j2 output, for which ``build_spark_session``
hands the JVM the configuration from ``spark_log_conf``. ``-v`` shows it all on the terminal too.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from infra.settings import StackSettings, load_settings

log = logging.getLogger(__name__)

FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"
PROJECT_PACKAGES = frozenset({"infra", "simulator", "pipeline", "models", "dashboard", "iotfraud"})
NOISY = ("py4j", "urllib3", "alembic", "mlflow.store")
# MLflow, when imported, gives these loggers a stderr handler of its own and stops them from
# propagating (unless MLFLOW_CONFIGURE_LOGGING is false): their records would miss the log file.
MLFLOW_LOGGERS = ("mlflow", "sqlalchemy.engine", "alembic", "huey")

# Spark warns "Current batch is falling behind" for every micro-batch longer than its trigger
# interval: on a small machine, nearly every detection batch, burying the lines a reader of the
# log file looks for. A query that really falls behind is told once, by the pipeline's own
# warning (``pipeline.progress``). ``-v`` shows Spark's.
SPARK_FALLING_BEHIND = "org.apache.spark.sql.execution.streaming.runtime.ProcessingTimeExecutor"
# The JVM's lines in the format of the Python ones (log4j's WARN where Python says WARNING).
LOG4J2_CONFIG = """\
<?xml version="1.0" encoding="UTF-8"?>
<Configuration status="WARN">
  <Appenders>
    <File name="file" fileName="${{sys:iotfraud.log.file}}" append="true">
      <PatternLayout pattern="%d{{yyyy-MM-dd HH:mm:ss,SSS}} %-7p %c{{1}}: %m%n%ex"/>
    </File>
    <Console name="terminal" target="SYSTEM_ERR">
      <PatternLayout pattern="%d{{yyyy-MM-dd HH:mm:ss,SSS}} %-7p %c{{1}}: %m%n%ex"/>
    </Console>
  </Appenders>
  <Loggers>
    <Root level="WARN">
      <AppenderRef ref="file"/>{terminal}
    </Root>
    <Logger name="org.apache.parquet" level="ERROR"/>
    <Logger name="parquet" level="ERROR"/>{falling_behind}
  </Loggers>
</Configuration>
"""


@dataclass(frozen=True)
class LogSetup:
    """Where the running command logs, and whether its terminal shows everything."""

    file: Path
    verbose: bool


@dataclass
class _Active:
    """The process's logging, as the last ``configure_logging`` set it (one per process, like
    the logging module's own configuration and the driver JVM)."""

    setup: LogSetup | None = None


_active = _Active()


def log_file(state_dir: Path) -> Path:
    return state_dir / "logs" / "iotfraud.log"


def configure_logging(verbose: bool = False, state_dir: Path | None = None) -> Path | None:
    """Send log records to the log file, and to the terminal the command's own (INFO from its
    ``*.cli`` or ``iotfraud.*`` module) and the project's warnings; all of them with ``verbose``.

    Returns:
        The log file, or None when it cannot be written (everything goes to the terminal then).
    """
    level = logging.DEBUG if verbose else getattr(logging, os.environ.get("IOT_LOG_LEVEL", "INFO"))
    path = log_file(state_dir or load_settings(StackSettings).state_dir).absolute()
    terminal = logging.StreamHandler()
    handlers: list[logging.Handler] = [terminal]
    problem = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handlers.append(logging.FileHandler(path, encoding="utf-8"))
        file: Path | None = path
    except OSError as exc:
        problem, file = f"cannot write {path} ({exc.strerror}): logging to the terminal", None
    if file is not None and not verbose:
        terminal.addFilter(for_the_terminal)
    logging.basicConfig(level=level, format=FORMAT, handlers=handlers, force=True)
    os.environ.setdefault("MLFLOW_CONFIGURE_LOGGING", "false")  # for this process's children too
    for name in MLFLOW_LOGGERS:  # mlflow may have been imported already
        logger = logging.getLogger(name)
        logger.handlers, logger.propagate = [], True
        logger.setLevel(logging.NOTSET)
    for noisy in NOISY:
        logging.getLogger(noisy).setLevel(logging.WARNING)
    logging.captureWarnings(True)  # the libraries' warnings.warn: to the file, like their logs
    _active.setup = None if file is None else LogSetup(file, verbose)
    if problem:
        log.warning(problem)
    return file


def for_the_terminal(record: logging.LogRecord) -> bool:
    """True for the records a quiet terminal shows: the project's warnings and errors, and what
    a command says (its entry module's INFO, such as "received SIGTERM: stopping")."""
    name = record.name
    if name.split(".", 1)[0] not in PROJECT_PACKAGES:
        return False
    command = name.endswith(".cli") or name.startswith("iotfraud.")
    return record.levelno >= (logging.INFO if command else logging.WARNING)


def spark_log_conf() -> dict[str, str]:
    """Spark configuration that gives the driver JVM a log4j2 configuration writing to the log
    file (and to the terminal with ``-v``); empty when no command configured logging.

    It takes effect where pyspark starts the driver JVM (local mode, or a client started from
    Python), not in a JVM that runs already (spark-submit).
    """
    setup = _active.setup
    if setup is None:
        return {}
    config = setup.file.parent / ("log4j2-verbose.xml" if setup.verbose else "log4j2.xml")
    terminal = '\n      <AppenderRef ref="terminal"/>'
    falling_behind = f'\n    <Logger name="{SPARK_FALLING_BEHIND}" level="ERROR"/>'
    text = LOG4J2_CONFIG.format(
        terminal=terminal if setup.verbose else "",
        falling_behind="" if setup.verbose else falling_behind,
    )
    # The demo's children write it at the same time: each writes a whole file, then renames it.
    partial = config.with_name(f"{config.name}.{os.getpid()}")
    partial.write_text(text)
    partial.replace(config)
    options = [
        f"-Dlog4j2.configurationFile={_java_option_value(config)}",
        f"-Diotfraud.log.file={_java_option_value(setup.file)}",
    ]
    return {"spark.driver.extraJavaOptions": " ".join(options)}


@contextmanager
def jvm_output() -> Iterator[Path | None]:
    """Within the block, standard output and error are the log file, so that a JVM started
    there (pyspark's driver) keeps it as its own: what it writes past log4j (the Java launcher's
    notes, its Python workers' stderr) stays off a quiet terminal. This process gets its own
    back at the end. Yields the log file; None, and nothing changes, when logging was not
    configured or is verbose."""
    setup = _active.setup
    if setup is None or setup.verbose:
        yield None
        return
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with setup.file.open("ab") as log_out:
        os.dup2(log_out.fileno(), 1)
        os.dup2(log_out.fileno(), 2)
    try:
        yield setup.file
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, original in zip((1, 2), saved, strict=True):
            os.dup2(original, fd)
            os.close(original)


def _java_option_value(path: Path) -> str:
    """``path`` as one word of spark-submit's option strings (quotes and backslashes escaped)."""
    text = str(path)
    if not any(ch.isspace() or ch in "\"'\\" for ch in text):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
