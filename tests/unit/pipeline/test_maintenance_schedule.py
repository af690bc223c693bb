"""Maintenance runs every interval beside the queries, one run at a time, never at start."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from pipeline import job
from pipeline.settings import PipelineSettings


def test_maintenance_runs_once_per_interval_and_never_twice_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    release, runs = threading.Event(), []

    def maintain(spark: Any, settings: PipelineSettings, **kwargs: Any) -> None:
        runs.append(settings.maintenance_interval)
        release.wait(5)

    monkeypatch.setattr("pipeline.maintenance.maintain", maintain)
    now = [1000.0]
    due = job.Maintenance(None, PipelineSettings(maintenance_interval="1 hour"),  # type: ignore[arg-type]
                          clock=lambda: now[0])  # fmt: skip
    due.start_when_due()
    assert runs == [], "not at start: the first run is one interval later"
    now[0] += 3599
    due.start_when_due()
    assert runs == []
    now[0] += 1
    due.start_when_due()
    assert due.thread is not None
    due.thread.join(0.5)
    assert runs == ["1 hour"]
    now[0] += 7200  # still running: no second run beside it
    due.start_when_due()
    assert runs == ["1 hour"]
    release.set()
    due.thread.join(5)
    due.start_when_due()
    due.thread.join(5)
    assert runs == ["1 hour", "1 hour"]


def test_an_interval_of_zero_switches_maintenance_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("pipeline.maintenance.maintain", lambda *a, **k: pytest.fail("ran"))
    now = [0.0]
    off = job.Maintenance(None, PipelineSettings(maintenance_interval="0 seconds"),  # type: ignore[arg-type]
                          clock=lambda: now[0])  # fmt: skip
    for _ in range(3):
        off.start_when_due()
        now[0] += 10**6
    assert off.thread is None
