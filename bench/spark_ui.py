"""The Spark UI's REST API, as the benchmarks read it (``spark.ui.enabled``)."""

from __future__ import annotations

import json
from typing import Any
from urllib.request import urlopen


def rest(ui: str, path: str) -> Any:
    """GET ``{ui}/api/v1{path}`` as JSON."""
    with urlopen(f"{ui}/api/v1{path}", timeout=60) as response:
        return json.load(response)


def application(ui: str) -> str:
    """The id of the application the UI shows (one per session)."""
    return str(rest(ui, "/applications")[0]["id"])


def stage_cpu_s(stage: dict[str, Any]) -> float:
    """Executor CPU seconds of a stage's tasks, deserialisation included."""
    return (stage["executorCpuTime"] + stage["executorDeserializeCpuTime"]) / 1e9
