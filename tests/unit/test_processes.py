"""A command's children end with it, whichever way it ends (issue 24: no orphans).

A real parent process starts a real child through ``infra.processes`` and is then stopped by a
signal, a crash, a closed stdout or SIGKILL; the child must be gone each time.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.process_helpers import alive, wait_gone

ROOT = Path(__file__).resolve().parents[2]
PARENT = textwrap.dedent("""
    import sys, time
    from infra.processes import Children, Stopped, stop_signals

    children = Children()
    try:
        with stop_signals():
            sleeper = [sys.executable, "-c", "import time; time.sleep(300)"]
            child = children.start("sleeper", sleeper)
            print(child.pid, flush=True)
            while True:
                time.sleep(0.1)
                if sys.argv[1] == "crash":
                    raise RuntimeError("the parent crashed")
                if sys.argv[1] == "pipe":
                    print("progress", flush=True)
    except Stopped:
        sys.exit(0)
    finally:
        children.stop(timeout_s=5)
""")


def start_parent(tmp_path: Path, mode: str) -> tuple[subprocess.Popen[bytes], int]:
    script = tmp_path / "parent.py"
    script.write_text(PARENT)
    parent = subprocess.Popen(
        [sys.executable, str(script), mode],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": str(ROOT)}, start_new_session=True,
    )  # fmt: skip
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    assert alive(child)
    return parent, child


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_stop_signal_stops_the_children_and_exits_cleanly(
    tmp_path: Path, signum: signal.Signals
) -> None:
    parent, child = start_parent(tmp_path, "wait")
    parent.send_signal(signum)
    assert parent.wait(30) == 0
    assert not wait_gone({child}, 10), f"the child outlived a {signum.name} to its parent"


def test_sigkill_of_the_parent_takes_the_children_with_it(tmp_path: Path) -> None:
    parent, child = start_parent(tmp_path, "wait")
    parent.kill()
    parent.wait(30)
    assert not wait_gone({child}, 10), "the child outlived its SIGKILLed parent"


def test_a_crash_of_the_parent_stops_the_children(tmp_path: Path) -> None:
    parent, child = start_parent(tmp_path, "crash")
    assert parent.wait(30) == 1
    assert not wait_gone({child}, 10)


def test_a_closed_stdout_stops_the_children(tmp_path: Path) -> None:
    parent, child = start_parent(tmp_path, "pipe")
    assert parent.stdout is not None
    parent.stdout.close()  # the reader goes away: the parent's next print fails
    assert parent.wait(30) != 0
    assert not wait_gone({child}, 10)
