"""Replay recorded telemetry (JSON lines or CSV) into Kafka, in file order, mapped to the contract.

``read_records(path, mapping)`` yields ``Mapped`` (a contract event dict) or ``Rejected`` (line
number, reason, raw text) per row; nothing is dropped silently. Mapping: ``{contract field:
source column}``; a source column named like a contract field (or a metric) maps by itself, and
JSON lines may carry metrics flat or nested under ``metrics``. Missing ``event_id`` gets a
deterministic UUID (file name + line), so replaying a file twice re-sends the same ids; missing
``seq`` counts per device in file order. ``event_time`` may be ISO-8601 or epoch seconds/ms.
"""

from __future__ import annotations

import csv
import json
import logging
import math
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from infra import contract as c
from simulator.events import event_json

log = logging.getLogger(__name__)

_NAMESPACE = uuid.UUID("6f1c7e2e-5d0b-4a55-9f57-2b1f3c9d1e10")
_NUMERIC = {"lat", "lon", *c.METRICS}
_CONTRACT_FIELDS = {name for name, _ in c.EVENT_FIELDS} | set(c.METRICS)


@dataclass
class Mapped:
    line: int
    event: dict[str, Any]
    event_time: datetime


@dataclass
class Rejected:
    line: int
    reason: str
    raw: str


@dataclass
class ReplayReport:
    sent: int = 0
    rejected: int = 0
    examples: list[Rejected] = field(default_factory=list)
    devices: dict[str, dict[str, Any]] = field(default_factory=dict)

    def add_rejected(self, row: Rejected, keep: int = 5) -> None:
        self.rejected += 1
        if len(self.examples) < keep:
            self.examples.append(row)


def parse_mapping(items: list[str]) -> dict[str, str]:
    """``["device_id=dev,event_time=ts", "seq=n"]`` -> ``{"device_id": "dev", ...}``."""
    mapping: dict[str, str] = {}
    for item in items:
        for pair in item.split(","):
            if not pair.strip():
                continue
            target, sep, source = pair.partition("=")
            if not sep or not source.strip():
                raise ValueError(f"--map expects field=column, got {pair!r}")
            if target.strip() not in _CONTRACT_FIELDS:
                known = ", ".join(sorted(_CONTRACT_FIELDS))
                raise ValueError(f"--map: {target.strip()!r} is not a contract field ({known})")
            mapping[target.strip()] = source.strip()
    return mapping


def parse_time(value: Any) -> datetime:
    """ISO-8601 (a missing zone means UTC) or epoch seconds / milliseconds."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value) / 1000.0 if float(value) > 1e11 else float(value)
        return datetime.fromtimestamp(seconds, tz=timezone.utc)
    text = str(value).strip()
    try:
        number = float(text)
    except ValueError:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
        return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)
    return parse_time(number)


def iso(value: datetime) -> str:
    """The contract's event_time text: UTC, milliseconds, ``Z``."""
    return value.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.") + (
        f"{value.microsecond // 1000:03d}Z"
    )


def to_event(
    row: dict[str, Any], mapping: dict[str, str], line: int, source: str, seqs: dict[str, int]
) -> dict[str, Any]:
    """Map one source row to a contract event; raises ValueError saying what cannot be mapped."""

    def get(name: str) -> Any:
        column = mapping.get(name, name)
        value = row.get(column)
        if value is None and name in c.METRICS and isinstance(row.get("metrics"), dict):
            value = row["metrics"].get(mapping.get(name, name))
        return None if value == "" else value

    device_id = get("device_id")
    if device_id is None:
        raise ValueError(f"no device_id (column {mapping.get('device_id', 'device_id')!r})")
    device_id = str(device_id)
    raw_time = get("event_time")
    if raw_time is None:
        raise ValueError(f"no event_time (column {mapping.get('event_time', 'event_time')!r})")
    try:
        when = parse_time(raw_time)
    except (ValueError, OverflowError, OSError):
        raise ValueError(f"event_time {raw_time!r} is not ISO-8601 or epoch") from None
    numbers: dict[str, float | None] = {}
    for name in _NUMERIC:
        value = get(name)
        if value is None:
            numbers[name] = None
            continue
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise ValueError(f"{name} {value!r} is not a number") from None
        if math.isnan(number) or math.isinf(number):
            raise ValueError(f"{name} {value!r} is not a finite number")
        numbers[name] = number
    seq_raw = get("seq")
    if seq_raw is None:
        seq = seqs.get(device_id, 0) + 1
    else:
        try:
            seq = int(float(seq_raw))
        except (TypeError, ValueError):
            raise ValueError(f"seq {seq_raw!r} is not an integer") from None
    seqs[device_id] = seq
    event_id = get("event_id") or str(uuid.uuid5(_NAMESPACE, f"{source}:{line}"))
    firmware = get("firmware")
    return {
        "event_id": str(event_id),
        "device_id": device_id,
        "event_time": iso(when),
        "seq": seq,
        "firmware": None if firmware is None else str(firmware),
        "lat": numbers["lat"],
        "lon": numbers["lon"],
        "metrics": {m: numbers[m] for m in c.METRICS},
    }


def _rows(path: Path) -> Iterator[tuple[int, dict[str, Any] | None, str]]:
    """(line number, row or None when unreadable, raw text)."""
    if path.suffix.lower() == ".csv":
        with path.open(newline="", encoding="utf-8") as handle:
            reader = csv.DictReader(handle)
            for row in reader:
                yield reader.line_num, dict(row), ",".join(str(v) for v in row.values())
        return
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            text = raw.decode("utf-8", errors="replace").rstrip("\r\n")
            if not text.strip():
                continue
            try:
                parsed = json.loads(text)
            except json.JSONDecodeError:
                yield number, None, text
                continue
            yield number, parsed if isinstance(parsed, dict) else None, text


def read_records(path: str | Path, mapping: dict[str, str]) -> Iterator[Mapped | Rejected]:
    """Every row of a JSON-lines or CSV file, mapped to the contract or rejected with a reason."""
    source = Path(path)
    seqs: dict[str, int] = {}
    for number, row, raw in _rows(source):
        if row is None:
            yield Rejected(number, "not a JSON object", raw[:200])
            continue
        try:
            event = to_event(row, mapping, number, source.name, seqs)
        except ValueError as exc:
            yield Rejected(number, str(exc), raw[:200])
            continue
        yield Mapped(number, event, parse_time(event["event_time"]))


def replay(
    path: str | Path,
    send: Callable[[bytes, bytes], None],
    *,
    mapping: dict[str, str] | None = None,
    speed: float = 0.0,
    stop: Callable[[], bool] = lambda: False,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> ReplayReport:
    """Send every mappable row with ``send(key, value)`` in file order; report the others.

    ``speed`` 0 sends as fast as possible; otherwise gaps between event times are slept,
    divided by ``speed`` (2 = twice as fast as recorded).
    """
    report = ReplayReport()
    first_time: datetime | None = None
    started = clock()
    for record in read_records(path, mapping or {}):
        if stop():
            break
        if isinstance(record, Rejected):
            report.add_rejected(record)
            continue
        if speed > 0:
            if first_time is None:
                first_time = record.event_time
            due = (record.event_time - first_time).total_seconds() / speed
            wait = due - (clock() - started)
            if wait > 0:
                sleep(wait)
        event = record.event
        send(event["device_id"].encode(), event_json(event))
        report.sent += 1
        report.devices.setdefault(event["device_id"], event)
    return report


def guess_device_type(event: dict[str, Any]) -> str:
    """The device type whose sensors best match the metrics a replayed event carries."""
    present = {m for m, v in event["metrics"].items() if v is not None}
    return max(
        c.DEVICE_TYPES,
        key=lambda t: (len(present & set(c.DEVICE_TYPES[t])), -len(set(c.DEVICE_TYPES[t]))),
    )
