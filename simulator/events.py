"""The wire format: how a reading becomes the JSON value sent to Kafka (one definition).

Two encoders share it. ``encode`` turns a whole slice of readings (``Events``, one numpy array per
field) into values at once: each field becomes a fixed-width block of ASCII bytes and a batch is
one byte matrix per device type (a sensor the type lacks is the literal ``null``), far faster than
``json.dumps`` or ``%``-formatting one event at a time. ``event_json`` writes one event held as a
dict (``event_dict``): the messages built one by one, malformed and replayed ones.

Wire format (``json.loads`` gives the contract's event)::

    {"event_id":"<uuid4>","device_id":"dev-000042","event_time":"2026-01-05T10:00:00.000Z",
     "seq":17,"firmware":"sm-4.2.1","lat":40.712800,"lon":-74.006000,
     "metrics":{"temperature_c":24.31,"humidity_pct":null,...}}

``event_time`` is ISO-8601 UTC with millisecond precision and a ``Z`` suffix; coordinates carry
``LATLON_DECIMALS`` decimals and metrics ``METRIC_DECIMALS``. In a batch, numbers are
right-aligned to the widest value of their batch and string fields padded after their closing
quote, with spaces (insignificant whitespace in JSON), so that a whole batch is one byte matrix.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from infra import contract as c

log = logging.getLogger(__name__)

TYPES = tuple(c.DEVICE_TYPES)
METRIC_INDEX = {m: i for i, m in enumerate(c.METRICS)}
LATLON_DECIMALS = 6
METRIC_DECIMALS = 2
_UUID_HEX_POS = np.array([i for i in range(36) if i not in (8, 13, 18, 23)])
_SPACE, _ZERO, _MINUS, _DOT = ord(" "), ord("0"), ord("-"), ord(".")


@dataclass
class Events:
    """One array per field; ``dev`` indexes the fleet, ``t`` is send time in simulated seconds."""

    dev: np.ndarray  # int64
    t: np.ndarray  # float64, when the device sends it
    t_event: np.ndarray  # float64, the device clock stamped in event_time
    lat: np.ndarray
    lon: np.ndarray
    metrics: np.ndarray  # float64 (n, len(METRICS))
    firmware: np.ndarray  # int64 index into the firmware table
    seq: np.ndarray  # int64
    tag: np.ndarray  # int8: 0 normal, else SCENARIOS index + 1
    clone: np.ndarray  # int64: injection index of a clone's reading, -1 otherwise

    def __len__(self) -> int:
        return int(self.dev.shape[0])

    def take(self, index: np.ndarray) -> Events:
        return Events(**{f.name: getattr(self, f.name)[index] for f in fields(self)})


def _digits(x: np.ndarray, width: int, spaces: np.ndarray | None = None) -> np.ndarray:
    """Zero-padded decimal digits (ASCII) of non-negative ints as ``(n, width)`` uint8; with
    ``spaces``, that many leading digits of each row are spaces instead.

    Built digit-major (one contiguous row per digit) and returned transposed: writing columns
    of a row-major matrix is slower.
    """
    out = np.empty((width, x.shape[0]), dtype=np.uint8)
    for j in range(width - 1, -1, -1):
        q = x // 10
        out[j] = x - q * 10
        x = q
    out += _ZERO
    if spaces is not None:
        for j in range(int(spaces.max(initial=0))):
            np.copyto(out[j], _SPACE, where=spaces > j)
    return out.T


def fixed_point(values: np.ndarray, decimals: int) -> np.ndarray:
    """Numbers as right-aligned ASCII text, one row each: ``(n, width)`` uint8.

    The width is the widest value of this batch; shorter numbers are left-padded with spaces,
    which JSON allows between tokens. Vectorised: ``"%.2f" % v`` per value is far slower.
    """
    n = values.shape[0]
    x = np.rint(np.abs(values) * 10**decimals).astype(np.int64)
    negative = (values < 0) & (x > 0)
    top = int(x.max(initial=0))
    if top < 2**31:
        x = x.astype(np.int32)  # int32 division is faster
    width_digits = max(len(str(top)), decimals + 1)
    width_int = width_digits - decimals
    # Leading zeros of the integer part become spaces: ``lead`` of them, found by comparing
    # with powers of ten (a cumulative product over the digit columns is slower).
    lead = np.zeros(n, dtype=np.intp)
    if width_int > 1:
        powers = 10 ** np.arange(decimals + 1, width_digits, dtype=np.int64)
        lead = (width_int - 1) - np.searchsorted(powers, x, side="right")
    digits = _digits(x, width_digits, spaces=lead)
    sign = int(negative.any())
    out = np.full((n, sign + width_digits + (1 if decimals else 0)), _SPACE, dtype=np.uint8)
    out[:, sign : sign + width_int] = digits[:, :width_int]
    if decimals:
        out[:, sign + width_int] = _DOT
        out[:, sign + width_int + 1 :] = digits[:, width_int:]
    if sign:
        rows = np.flatnonzero(negative)
        out[rows, lead[rows] + sign - 1] = _MINUS
    return out


@dataclass
class StringTable:
    """JSON string literals (quoted) as rows of a uint8 table, space-padded after the quote."""

    rows: np.ndarray
    lengths: np.ndarray

    def take(self, codes: np.ndarray) -> np.ndarray:
        """Rows of ``codes``, only as wide as the longest of them."""
        width = int(self.lengths[codes].max(initial=2))
        return self.rows[codes, :width]

    def extended(self, strings: list[str]) -> StringTable:
        """This table with ``strings`` appended (widened when one of them is longer)."""
        more = padded_strings(strings)
        width = max(self.rows.shape[1], more.rows.shape[1])
        rows = np.full((self.rows.shape[0] + more.rows.shape[0], width), _SPACE, np.uint8)
        rows[: self.rows.shape[0], : self.rows.shape[1]] = self.rows
        rows[self.rows.shape[0] :, : more.rows.shape[1]] = more.rows
        return StringTable(rows, np.concatenate([self.lengths, more.lengths]))


def padded_strings(strings: list[str]) -> StringTable:
    quoted = [json.dumps(s).encode() for s in strings]
    width = max((len(q) for q in quoted), default=2)
    table = np.full((len(quoted), width), _SPACE, dtype=np.uint8)
    for i, q in enumerate(quoted):
        table[i, : len(q)] = np.frombuffer(q, dtype=np.uint8)
    return StringTable(table, np.asarray([len(q) for q in quoted], dtype=np.int64))


def _assemble(parts: list[str | np.ndarray], n: int) -> np.ndarray:
    """One ``(n, width)`` byte matrix from literal texts and per-row blocks, in order.

    Adjacent literals are merged, so a run of ``null`` sensors costs one copy.
    """
    merged: list[str | np.ndarray] = []
    for part in parts:
        if isinstance(part, str) and merged and isinstance(merged[-1], str):
            merged[-1] += part
        else:
            merged.append(part)
    widths = [len(p) if isinstance(p, str) else p.shape[1] for p in merged]
    matrix = np.empty((n, sum(widths)), dtype=np.uint8)
    start = 0
    for part, width in zip(merged, widths, strict=True):
        block = np.frombuffer(part.encode(), np.uint8) if isinstance(part, str) else part
        matrix[:, start : start + width] = block
        start += width
    return matrix


def _zero_padded(values: np.ndarray, width: int) -> np.ndarray:
    return _digits(values.astype(np.int32), width)


def iso_times(epoch_ms: np.ndarray) -> np.ndarray:
    """ISO-8601 UTC times with milliseconds and ``Z`` (``2026-01-05T10:00:00.000Z``), as
    ``(n, 24)`` uint8 rows; digit arithmetic, since numpy's own string conversion is slow."""
    days = (epoch_ms // 86_400_000).astype("datetime64[D]")
    year_start = days.astype("datetime64[Y]")
    month_start = days.astype("datetime64[M]")
    year = year_start.astype(np.int64) + 1970
    month = (month_start - year_start.astype("datetime64[M]")).astype(np.int64) + 1
    day = (days - month_start.astype("datetime64[D]")).astype(np.int64) + 1
    ms_of_day = epoch_ms % 86_400_000
    n = epoch_ms.shape[0]
    out = np.empty((n, 24), dtype=np.uint8)
    out[:, 0:4] = _zero_padded(year, 4)
    out[:, 5:7] = _zero_padded(month, 2)
    out[:, 8:10] = _zero_padded(day, 2)
    out[:, 11:13] = _zero_padded(ms_of_day // 3_600_000, 2)
    out[:, 14:16] = _zero_padded(ms_of_day // 60_000 % 60, 2)
    out[:, 17:19] = _zero_padded(ms_of_day // 1000 % 60, 2)
    out[:, 20:23] = _zero_padded(ms_of_day % 1000, 3)
    out[:, [4, 7]] = _MINUS
    out[:, 10] = ord("T")
    out[:, [13, 16]] = ord(":")
    out[:, 19] = _DOT
    out[:, 23] = ord("Z")
    return out


def uuid4_rows(rng: np.random.Generator, n: int) -> np.ndarray:
    """``n`` random (version 4) UUIDs drawn from ``rng`` as ``(n, 36)`` uint8 text rows."""
    raw = np.frombuffer(rng.bytes(16 * n), dtype=np.uint8).reshape(n, 16).copy()
    raw[:, 6] = (raw[:, 6] & 0x0F) | 0x40
    raw[:, 8] = (raw[:, 8] & 0x3F) | 0x80
    # bytes.hex() is C-speed; numpy fancy indexing through a hex table is slower.
    hexed = np.frombuffer(raw.tobytes().hex().encode(), dtype=np.uint8).reshape(n, 32)
    out = np.empty((n, 36), dtype=np.uint8)
    out[:, _UUID_HEX_POS] = hexed
    out[:, [8, 13, 18, 23]] = _MINUS
    return out


def clamp_to_contract(events: Events) -> None:
    """Keep generated readings inside the contract's valid ranges (in place)."""
    for name, i in METRIC_INDEX.items():
        low, high = c.VALID_RANGES[name]
        np.clip(events.metrics[:, i], low, high, out=events.metrics[:, i])
    np.clip(events.lat, -90.0, 90.0, out=events.lat)
    events.lon[:] = (events.lon + 180.0) % 360.0 - 180.0


def encode(
    events: Events,
    *,
    type_code: np.ndarray,
    device_ids: StringTable,
    firmware_table: StringTable,
    start_ms: int,
    event_ids: np.ndarray,
) -> list[bytes]:
    """JSON values (UTF-8 bytes) in the order of ``events``, built as one byte matrix per type.

    ``type_code`` is per fleet device, ``device_ids`` and ``firmware_table`` are ``padded_strings``
    tables indexed by ``events.dev`` and ``events.firmware``; ``event_ids`` is ``uuid4_rows``.
    """
    n = len(events)
    if n == 0:
        return []
    out = np.empty(n, dtype=object)
    times = event_times(start_ms, events.t_event)
    types = type_code[events.dev]
    for code, device_type in enumerate(TYPES):
        idx = np.flatnonzero(types == code)
        if idx.size == 0:
            continue
        sensors = c.DEVICE_TYPES[device_type]
        parts: list[str | np.ndarray] = [
            '{"event_id":"', event_ids[idx],
            '","device_id":', device_ids.take(events.dev[idx]),
            ',"event_time":"', times[idx],
            '","seq":', fixed_point(events.seq[idx], 0),
            ',"firmware":', firmware_table.take(events.firmware[idx]),
            ',"lat":', fixed_point(events.lat[idx], LATLON_DECIMALS),
            ',"lon":', fixed_point(events.lon[idx], LATLON_DECIMALS),
            ',"metrics":{',
        ]  # fmt: skip
        for j, metric in enumerate(c.METRICS):
            comma = "," if j else ""
            if metric in sensors:
                parts.append(f'{comma}"{metric}":')
                parts.append(
                    fixed_point(events.metrics[idx, METRIC_INDEX[metric]], METRIC_DECIMALS)
                )
            else:
                parts.append(f'{comma}"{metric}":null')
        parts.append("}}")
        matrix = _assemble(parts, idx.size)
        out[idx] = matrix.view(f"S{matrix.shape[1]}").ravel().tolist()
    values: list[bytes] = out.tolist()
    return values


def event_times(start_ms: int, t: np.ndarray) -> np.ndarray:
    """``event_time`` text (``iso_times`` rows) of ``t`` simulated seconds after ``start_ms``."""
    return iso_times(start_ms + np.round(t * 1000.0).astype(np.int64))


def event_dict(
    *,
    event_id: str,
    device_id: str,
    event_time: str,
    seq: int,
    firmware: str,
    lat: float,
    lon: float,
    metrics: dict[str, float | None],
) -> dict[str, Any]:
    """One event as a dict in the contract's field order, rounded as ``encode`` rounds it."""
    return {
        "event_id": event_id,
        "device_id": device_id,
        "event_time": event_time,
        "seq": seq,
        "firmware": firmware,
        "lat": round(lat, LATLON_DECIMALS),
        "lon": round(lon, LATLON_DECIMALS),
        "metrics": {
            m: None if (value := metrics.get(m)) is None else round(value, METRIC_DECIMALS)
            for m in c.METRICS
        },
    }


def event_json(event: dict[str, Any]) -> bytes:
    """One event (a dict, as ``event_dict`` builds it or as read from a file) as compact JSON."""
    return json.dumps(event, separators=(",", ":")).encode()
