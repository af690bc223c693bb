"""How long the dashboard's reads of a lake take: the overview page, and an analyst opening the
newest alert.

Usage::

    .venv/bin/python bench/pipeline_latency.py --rate 3000 --seconds 720 --devices 6000 \\
        --keep-lake DIR
    .venv/bin/python bench/dashboard_reads.py --lake DIR [--repeat 5] [--now ISO-TIME]

The overview page's reads are those of ``dashboard/views/overview.py`` over its default range
(the last 24 hours) and, with ``--hours``, over other ranges of its picker, each timed alone:
alerts, verdicts, the fast path's first messages, pipeline metrics, quarantined records,
silences, the registry, devices reporting. The newest alert's detail is its window's features
(the changelog while the window is open) and the device's telemetry in that window. ``--now``
is the moment the page is read at; by default the newest ``pipeline_metrics`` row of the lake
plus a second, so a lake kept from a past run reads as it did when the run ended. Each read
runs ``--repeat`` times (the first pays the cold file cache); the JSON printed gives per read
the median and the range in seconds, and the same for their sum (``total``).
``bench/pipeline_latency.py --health-every`` times the same reads while the pipeline writes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import polars as pl

from dashboard import data
from dashboard.settings import DashboardSettings
from infra import lake as tables

# The page's default range (``IOT_DASH_LOOKBACK_HOURS``).
PAGE_HOURS = DashboardSettings.model_fields["lookback_hours"].default


def overview_reads(lake: str, now: datetime, hours: float = PAGE_HOURS) -> dict[str, float]:
    """Seconds per read of the overview page at ``now`` over the last ``hours``, in the page's
    order."""
    since = data.lookback(hours, now)
    reads: dict[str, Callable[[], object]] = {
        "alerts": lambda: data.read_alerts(lake, since=since, columns=data.OVERVIEW_ALERT_COLUMNS),
        "feedback": lambda: data.read_feedback(lake),
        "fast_path": lambda: data.read_fast_path(lake, since=since),
        "pipeline_metrics": lambda: data.read_pipeline_metrics(lake, since),
        "quarantined": lambda: data.count_quarantined(lake, since),
        "silences": lambda: data.read_silences(lake),
        "devices": lambda: data.read_devices(lake),
        "devices_reporting": lambda: data.devices_reporting(lake, since),
    }
    return {name: _timed(read) for name, read in reads.items()}


def alert_detail_reads(lake: str, now: datetime) -> dict[str, float] | None:
    """Seconds per read of the newest windowed alert at ``now``: its window's features, then the
    device's telemetry in the window. None when there is no such alert."""
    alerts = data.read_alerts(lake, since=data.lookback(PAGE_HOURS, now))
    windowed = alerts.filter(pl.col("window_end").is_not_null())
    if windowed.is_empty():
        return None
    newest = windowed.sort("detected_at").row(-1, named=True)
    device, start, end = newest["device_id"], newest["window_start"], newest["window_end"]
    return {
        "features": _timed(lambda: data.read_features(lake, device, window_start=start)),
        "telemetry": _timed(lambda: data.read_telemetry(lake, device, since=start, until=end)),
    }


def _timed(read: Callable[[], object]) -> float:
    started = time.perf_counter()
    read()
    return time.perf_counter() - started


def last_run_time(lake: str) -> datetime:
    """A second after the newest ``pipeline_metrics`` row: when the lake's pipeline stopped."""
    metrics = data.read_table(lake, tables.PIPELINE_METRICS, columns=["timestamp"])
    if metrics.is_empty():
        raise SystemExit(f"{lake} has no pipeline_metrics rows: give --now")
    newest: datetime = metrics["timestamp"].max()  # type: ignore[assignment]
    return newest + timedelta(seconds=1)


def summary(samples: list[dict[str, float]]) -> dict[str, dict[str, float]]:
    """Per read, and for the sum of the reads (``total``): median, min and max seconds."""
    runs = {name: [sample[name] for sample in samples] for name in samples[0]}
    runs["total"] = [sum(sample.values()) for sample in samples]
    return {name: _spread(values) for name, values in runs.items()}


def _spread(values: list[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(values), 3),
        "min": round(min(values), 3),
        "max": round(max(values), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lake", type=Path, required=True, help="a lake folder")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--hours", type=float, nargs="+", default=[PAGE_HOURS],
                        help="the page's time ranges to read (default: its default)")  # fmt: skip
    parser.add_argument(
        "--now",
        type=datetime.fromisoformat,
        default=None,
        help="when the page is read (default: when the lake's run stopped)",
    )
    args = parser.parse_args()
    lake = str(args.lake)
    if not data.table_exists(lake, tables.TELEMETRY):
        raise SystemExit(f"{lake} holds no telemetry table: give a lake folder")
    now = args.now or last_run_time(lake)
    result: dict[str, Any] = {"lake": lake, "now": now.isoformat()}
    for hours in args.hours:
        since = data.lookback(hours, now)
        rows = data.count_rows(lake, tables.TELEMETRY, data.time_filter("event_time", since))
        samples = [overview_reads(lake, now, hours) for _ in range(args.repeat)]
        result[f"overview_last_{hours:g}_h"] = {"telemetry_rows": rows, "s": summary(samples)}
    details = [d for d in (alert_detail_reads(lake, now) for _ in range(args.repeat)) if d]
    result["alert_detail_s"] = summary(details) if details else None
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
