"""A new user's terminal stays quiet (issue 23): ``iotfraud pipeline run`` prints its own progress
line and names its log file once; Spark's log lines, console progress bars and library warnings
go to that file. ``-v`` brings them back to the terminal. SIGTERM stops it cleanly.

Before, the terminal showed Spark's WARN lines (a "Current batch is falling behind" per
micro-batch), ``[Stage 12:>  (0 + 2) / 2]`` bars and MLflow's warnings.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from deltalake import DeltaTable

from tests.integration.test_pipeline_cli import pipeline_env
from tests.pipeline_helpers import device_series, encoded, produce, write_registry

pytestmark = [pytest.mark.integration, pytest.mark.slow]

WARN_LINE = re.compile(r"^.*\bWARN\b.*$", re.MULTILINE)  # log4j's level; Python says WARNING
# A line of the JVM's log4j: its level, then a class name (Python's logger names have dots).
JVM_LINE = re.compile(r"^\S+ \S+ (WARN|ERROR) +[\w$]+: ", re.MULTILINE)


def run_pipeline(
    tmp_path: Path,
    bootstrap: str,
    topic: str,
    *options: str,
    until: str = "ingest: batch",
    whole_group: bool = False,
) -> str:
    """``iotfraud pipeline [options] run`` until its terminal shows ``until`` (by default, its
    progress line an ingest micro-batch), then SIGTERM (``whole_group``: to every process of its
    process group, Spark's JVM included, as ``kill -- -PGID`` does); what it printed (stdout and
    stderr)."""
    write_registry(str(tmp_path / "lake"), ["dev-1"])
    start = datetime.now(timezone.utc) - timedelta(minutes=30)
    produce(bootstrap, topic, encoded(device_series("dev-1", start, 30)))
    env = pipeline_env(tmp_path, bootstrap, topic, IOT_STACK_STATE_DIR=str(tmp_path / "state"))
    terminal = tmp_path / "terminal.txt"
    with terminal.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "iotfraud", "pipeline", *options, "run"],
            env=env, stdout=out, stderr=subprocess.STDOUT, text=True, start_new_session=True,
        )  # fmt: skip
    deadline = time.monotonic() + 180
    try:
        while until not in terminal.read_text():
            assert proc.poll() is None, terminal.read_text()[-3000:]
            assert time.monotonic() < deadline, "no progress line\n" + terminal.read_text()[-3000:]
            time.sleep(0.5)
        if whole_group:
            os.killpg(proc.pid, signal.SIGTERM)
        else:
            proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
    finally:
        with contextlib.suppress(ProcessLookupError):  # what is left of the group
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    output = terminal.read_text()
    assert proc.returncode == 0, output[-3000:]
    return output


@pytest.mark.timeout(600)
def test_the_terminal_shows_progress_and_names_the_log_file(
    tmp_path: Path, bootstrap: str, make_topic: Callable[..., str]
) -> None:
    quiet = run_pipeline(tmp_path / "quiet", bootstrap, make_topic(), whole_group=True)

    # SIGTERM to all its processes (the JVM's did not stop under it) stopped it cleanly (exit
    # status 0, in run_pipeline), once its first batch was in.
    assert "received SIGTERM" in quiet
    assert "pipeline stopped" in quiet
    telemetry = DeltaTable(str(tmp_path / "quiet" / "lake" / "telemetry"))
    assert telemetry.to_pyarrow_table().num_rows == 30
    assert "ingest: batch" in quiet  # the pipeline's own progress line
    assert WARN_LINE.findall(quiet) == []
    assert JVM_LINE.findall(quiet) == []
    assert "[Stage" not in quiet
    named = re.findall(r"(/\S+\.log)\b", quiet)
    assert len(named) == 1, quiet[-3000:]
    log_file = Path(named[0])
    assert log_file.is_relative_to(tmp_path / "quiet" / "state")
    text = log_file.read_text()
    assert JVM_LINE.search(text), text[-3000:]  # Spark's (the JVM's) lines
    # but not its warning for each batch longer than its trigger (1 s here; the first batches
    # take longer): the pipeline's own warning says when a query really falls behind.
    assert "Current batch is falling behind" not in text
    assert "pipeline.metrics: query ingest started" in text  # the project's own INFO lines

    # Stopped once its first query has started: Spark has logged its start-up by then.
    started = "pipeline.metrics: query ingest started"
    verbose = run_pipeline(tmp_path / "verbose", bootstrap, make_topic(), "-v", until=started)

    assert WARN_LINE.search(verbose), verbose[-3000:]  # Spark's WARN lines are back
    assert "[Stage" not in verbose
