"""Child processes that never outlive the command that started them.

The demo starts the broker, the pipeline, the simulator and the dashboard; the dashboard starts
its Streamlit server. Each way the parent can end must stop them:

- Ctrl-C, SIGTERM and a closed terminal (SIGHUP): the parent stops its children in reverse start
  order, SIGTERM first so that the pipeline finishes its micro-batch, then SIGKILL after a
  timeout (a Streamlit server was seen ignoring SIGTERM). ``stop_signals`` turns the three
  signals into ``Stopped``, so that ``finally`` blocks run on every one of them.
- A broken pipe on stdout or a crash: an exception, so the same ``finally`` blocks.
- SIGKILL of the parent, which runs no code: each child is started with Linux's parent-death
  signal, so the kernel kills it when the parent goes. SIGKILL, because every writer of the lake
  is exactly-once across SIGKILL (the kill-loop test) and a server ignoring SIGTERM must not
  survive.

Each child runs in its own session: a terminal's Ctrl-C or hang-up reaches the parent only, which
then stops the children in order instead of all of them at once.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import FrameType

log = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1  # linux/prctl.h
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


class Stopped(KeyboardInterrupt):
    """The process was asked to stop by a signal (a KeyboardInterrupt, so code that handles
    Ctrl-C handles SIGTERM and SIGHUP the same way)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def die_with_parent() -> Callable[[], None]:
    """A ``preexec_fn`` that has the kernel SIGKILL the child when this process dies.

    The parent-death signal follows the thread that forks, so start children from the main
    thread. Outside Linux it does nothing; the signal handlers still stop the children.
    """
    parent = os.getpid()

    def arm() -> None:
        if _LIBC is not None:
            _LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # the parent died before the signal was armed
            os._exit(1)

    return arm


def start_child(command: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """Start ``command`` in its own session, killed by the kernel if this process dies."""
    # preexec_fn is unsafe when another thread holds a lock the child needs; this one only
    # calls prctl and getppid, which take none.
    return subprocess.Popen(
        command,
        env=env,
        start_new_session=True,
        preexec_fn=die_with_parent(),  # noqa: PLW1509
    )


def run_child(name: str, command: list[str], env: dict[str, str] | None = None) -> None:
    """Run ``command`` to its end as a child (stopped if this process is asked to stop).

    Raises:
        subprocess.CalledProcessError: it exited with a failure.
    """
    proc = start_child(command, env)
    try:
        returncode = proc.wait()
    finally:
        stop_child(name, proc, timeout_s=30)
    if returncode != 0:
        raise subprocess.CalledProcessError(returncode, command)


def stop_child(name: str, proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    """SIGTERM, then SIGKILL to the child's process group if it has not exited in time."""
    if proc.poll() is not None:
        return
    log.info("stopping %s", name)
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        log.warning("%s did not stop in %.0fs; killing it", name, timeout_s)
        with contextlib.suppress(ProcessLookupError):  # it exited in between
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@dataclass
class Children:
    """A command's child processes, stopped in reverse start order."""

    procs: list[tuple[str, subprocess.Popen[bytes]]] = field(default_factory=list)

    def start(
        self, name: str, command: list[str], env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        log.info("starting %s", name)
        proc = start_child(command, env)
        self.procs.append((name, proc))
        return proc

    def failed(self) -> list[str]:
        return [
            f"{n} exited with {p.returncode}" for n, p in self.procs if p.poll() not in (None, 0)
        ]

    def stop(self, name: str | None = None, timeout_s: float = 90.0) -> None:
        for child, proc in reversed(self.procs):
            if name is None or child == name:
                stop_child(child, proc, timeout_s)


def _raise_stopped(signum: int, _frame: FrameType | None) -> None:
    raise Stopped(signum)


@contextmanager
def stop_signals(
    handler: Callable[[int, FrameType | None], None] = _raise_stopped,
) -> Iterator[None]:
    """Within the block, SIGINT, SIGTERM and SIGHUP call ``handler`` (by default: raise
    ``Stopped``); the previous handlers come back after it."""
    previous = {signum: signal.signal(signum, handler) for signum in STOP_SIGNALS}
    try:
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)
