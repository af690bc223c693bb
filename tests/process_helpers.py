"""Process trees read from /proc: which processes a command started, and whether they are gone."""

from __future__ import annotations

import time
from pathlib import Path


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, parent pid) of ``pid``, or None when it does not exist."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = text[text.rindex(")") + 2 :].split()  # the command name may hold spaces
    return fields[0], int(fields[1])


def alive(pid: int) -> bool:
    """True while ``pid`` runs; a zombie (exited, not yet reaped) counts as gone."""
    stat = _stat(pid)
    return stat is not None and stat[0] != "Z"


def descendants(pid: int) -> set[int]:
    """Every living process below ``pid`` (children, their children, ...)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (stat := _stat(int(entry.name))) and stat[0] != "Z":
            parents[int(entry.name)] = stat[1]
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def wait_gone(pids: set[int], timeout_s: float) -> set[int]:
    """The pids still alive after waiting up to ``timeout_s`` for all of them to end."""
    deadline = time.monotonic() + timeout_s
    while (left := {p for p in pids if alive(p)}) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left
