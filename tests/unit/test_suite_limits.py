"""The suite's own time limits: every test has one, and the whole run has one (issue 24).

A test stuck in a blocking call (a Spark query that never finishes, a socket that never
answers) must fail on its own and let the next test run, instead of running into CI's limit.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pytest brings tomli
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
HANG = """
import socket

def test_waits_for_an_answer_that_never_comes():
    quiet, _ = socket.socketpair()
    quiet.recv(1)

def test_after_it():
    pass
"""


def test_every_test_and_the_whole_suite_have_a_time_limit() -> None:
    options = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert 0 < float(options["timeout"]) <= 900
    # make test must stay within 45 minutes, so the session limit sits at or below that.
    assert 0 < float(options["session_timeout"]) <= 45 * 60
    assert options["timeout_method"] == "signal"


def test_a_hanging_test_fails_with_a_timeout_and_the_next_one_still_runs(tmp_path: Path) -> None:
    (tmp_path / "test_hang.py").write_text(HANG)
    # The repository's own configuration, with a short limit so that this test is quick.
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-c", str(ROOT / "pyproject.toml"),
         "--rootdir", str(tmp_path), "-p", "no:cacheprovider", "-o", "timeout=2",
         str(tmp_path / "test_hang.py")],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert run.returncode == 1, run.stdout[-2000:]
    assert "Timeout (>2.0s)" in run.stdout
    assert "1 failed, 1 passed" in run.stdout
