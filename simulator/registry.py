"""The device registry: a seeded, deterministic Faker fleet written to the Delta table ``devices``.

Public API (stable):

- ``build_registry(n, seed, now=None) -> pa.Table``: the fleet (schema of ``DEVICES_COLUMNS``).
- ``write_registry(table, lake_root, mode="overwrite")``: write it to ``<lake>/devices``.
- ``read_registry(lake_root) -> pa.Table | None``: the current version, None when absent.
- ``change_devices(lake_root, n, seed, now=None) -> pa.Table``: new owner, moved site or retired
  for ``n`` active devices, merged into the table as one new version; returns the changed rows.
- ``register_devices(lake_root, rows)``: insert devices that are not in the registry yet.

Faker is only used here, never per event. Same ``n`` and ``seed`` give the same table (except
``updated_at``, which is ``now``).
"""

from __future__ import annotations

import logging
from datetime import date, datetime, timedelta, timezone
from typing import Any, Literal

import numpy as np
import pyarrow as pa
from faker import Faker

from infra import contract as c
from infra import lake

log = logging.getLogger(__name__)

DEVICE_TYPE_WEIGHTS = {
    "smart_meter": 0.45,
    "gps_tracker": 0.2,
    "industrial_sensor": 0.15,
    "thermostat": 0.2,
}
FIRMWARE = {
    "smart_meter": "sm-4.2.1",
    "gps_tracker": "gt-2.8.0",
    "industrial_sensor": "is-7.1.3",
    "thermostat": "th-3.0.5",
}
PLANS = {
    "smart_meter": ("residential", "residential-green", "business"),
    "gps_tracker": ("fleet-basic", "fleet-pro"),
    "industrial_sensor": ("industrial", "industrial-critical"),
    "thermostat": ("home", "home-plus"),
}
RETIRED_SHARE = 0.02
ID_PREFIX = "dev-"
_POOL = 3000
# Sites are spread around real places, at most this far (degrees) from the place.
_SITE_JITTER_DEG = 0.08


def _place(fake: Faker) -> tuple[float, float, str]:
    """(lat, lon, town) of a real US place from Faker's list, so sites sit where people live."""
    place = fake.local_latlng(country_code="US")
    if place is None:
        return 39.8283, -98.5795, "Lebanon"
    return float(place[0]), float(place[1]), str(place[2])


def device_id(index: int) -> str:
    return f"{ID_PREFIX}{index:06d}"


def build_registry(n: int, seed: int, now: datetime | None = None) -> pa.Table:
    """The fleet of ``n`` devices as a pyarrow Table with the ``devices`` schema."""
    now = now or datetime.now(timezone.utc)
    rng = np.random.default_rng(seed)
    fake = Faker("en_US")
    fake.seed_instance(seed)
    types = list(DEVICE_TYPE_WEIGHTS)
    type_idx = rng.choice(len(types), size=n, p=list(DEVICE_TYPE_WEIGHTS.values()))
    places = [_place(fake) for _ in range(min(n, 200))]
    place_idx = rng.integers(0, len(places), size=n)
    base = np.array([(lat, lon) for lat, lon, _ in places])[place_idx]
    coords = base + rng.uniform(-_SITE_JITTER_DEG, _SITE_JITTER_DEG, size=(n, 2))
    install_days = rng.integers(30, 5 * 365, size=n)
    retired = rng.random(n) < RETIRED_SHARE
    plan_pick = rng.random(n)
    device_types = [types[i] for i in type_idx]
    # Faker is slow (~0.1-0.5 ms a call): draw pools once, combine them with numpy for 100k rows.
    pool = min(n, _POOL)
    people = [fake.name() for _ in range(pool)]
    companies = [fake.company() for _ in range(max(1, pool // 4))]
    streets = [fake.street_name() for _ in range(pool)]
    zips = [fake.zipcode() for _ in range(pool)]
    person = rng.integers(0, len(people), size=n)
    company = rng.integers(0, len(companies), size=n)
    street = rng.integers(0, len(streets), size=n)
    number = rng.integers(1, 9999, size=n)
    zip_idx = rng.integers(0, len(zips), size=n)
    # Companies own trackers and industrial sensors, people own meters and thermostats.
    owners = [
        companies[company[i]] if t in ("gps_tracker", "industrial_sensor") else people[person[i]]
        for i, t in enumerate(device_types)
    ]
    addresses = [
        f"{number[i]} {streets[street[i]]}, {places[place_idx[i]][2]} {zips[zip_idx[i]]}"
        for i in range(n)
    ]
    today = now.date()
    columns: dict[str, Any] = {
        "device_id": [device_id(i) for i in range(n)],
        "device_type": device_types,
        "owner": owners,
        "site_address": addresses,
        "site_lat": np.round(coords[:, 0], 6),
        "site_lon": np.round(coords[:, 1], 6),
        "expected_firmware": [FIRMWARE[t] for t in device_types],
        "plan": [
            PLANS[t][int(p * len(PLANS[t]))] for t, p in zip(device_types, plan_pick, strict=True)
        ],
        "install_date": [today - timedelta(days=int(d)) for d in install_days],
        "status": ["retired" if r else "active" for r in retired],
        "updated_at": [now] * n,
    }
    return pa.Table.from_pydict(columns, schema=c.arrow_schema(c.DEVICES_COLUMNS))


def write_registry(
    table: pa.Table, lake_root: str, mode: Literal["overwrite", "append"] = "overwrite"
) -> None:
    """Write the registry to ``<lake_root>/devices`` (a new Delta version)."""
    from deltalake import write_deltalake

    lake.ensure_lake(lake_root)
    path = lake.table_path(lake_root, lake.DEVICES)
    data = table.cast(c.arrow_schema(c.DEVICES_COLUMNS))
    if mode == "overwrite":
        write_deltalake(path, data, mode="overwrite", schema_mode="overwrite")
    else:
        write_deltalake(path, data, mode="append")
    log.info("registry: %d devices written to %s", table.num_rows, lake_root)


def read_registry(lake_root: str) -> pa.Table | None:
    """The current registry, or None when the table does not exist yet."""
    table = lake.open_table(lake_root, lake.DEVICES)
    if table is None:
        return None
    return table.to_pyarrow_table().cast(c.arrow_schema(c.DEVICES_COLUMNS))


def _merge(lake_root: str, rows: pa.Table, *, update: bool) -> None:
    from deltalake import DeltaTable

    table = DeltaTable(lake.table_path(lake_root, lake.DEVICES))
    merger = table.merge(
        source=rows.cast(c.arrow_schema(c.DEVICES_COLUMNS)),
        predicate="t.device_id = s.device_id",
        source_alias="s",
        target_alias="t",
    )
    if update:
        merger = merger.when_matched_update_all()
    merger.when_not_matched_insert_all().execute()


def change_devices(lake_root: str, n: int, seed: int, now: datetime | None = None) -> pa.Table:
    """Give ``n`` active devices a new owner, a moved site or retire them, as one new version.

    The kind of change cycles owner -> moved -> retired. Returns the changed rows as written.
    """
    now = now or datetime.now(timezone.utc)
    current = read_registry(lake_root)
    if current is None:
        raise FileNotFoundError(f"no devices table under {lake_root}; run `registry create`")
    rows = current.to_pylist()
    active = [i for i, row in enumerate(rows) if row["status"] == "active"]
    rng = np.random.default_rng(seed)
    picked = rng.choice(len(active), size=min(n, len(active)), replace=False)
    fake = Faker("en_US")
    fake.seed_instance(seed)
    changed: list[dict[str, Any]] = []
    for k, position in enumerate(sorted(int(p) for p in picked)):
        row = dict(rows[active[position]])
        kind = ("owner", "moved", "retired")[k % 3]
        if kind == "owner":
            row["owner"] = fake.name()
        elif kind == "moved":
            lat, lon, town = _place(fake)
            row["site_lat"] = round(lat + float(rng.uniform(-0.05, 0.05)), 6)
            row["site_lon"] = round(lon + float(rng.uniform(-0.05, 0.05)), 6)
            row["site_address"] = f"{fake.building_number()} {fake.street_name()}, {town}"
        else:
            row["status"] = "retired"
        row["updated_at"] = now
        changed.append(row)
    table = pa.Table.from_pylist(changed, schema=c.arrow_schema(c.DEVICES_COLUMNS))
    if changed:
        _merge(lake_root, table, update=True)
    log.info("registry: %d devices changed", len(changed))
    return table


def register_devices(lake_root: str, rows: list[dict[str, Any]]) -> int:
    """Insert devices not yet in the registry (creating the table if needed); returns rows given."""
    if not rows:
        return 0
    table = pa.Table.from_pylist(rows, schema=c.arrow_schema(c.DEVICES_COLUMNS))
    if read_registry(lake_root) is None:
        write_registry(table, lake_root)
    else:
        _merge(lake_root, table, update=False)
    return len(rows)


def unknown_device_row(
    device_id_: str,
    *,
    device_type: str,
    lat: float | None,
    lon: float | None,
    firmware: str | None,
    now: datetime,
) -> dict[str, Any]:
    """A registry row for a device first seen in replayed telemetry."""
    return {
        "device_id": device_id_,
        "device_type": device_type,
        "owner": "unknown (replayed)",
        "site_address": "unknown",
        "site_lat": lat,
        "site_lon": lon,
        "expected_firmware": firmware,
        "plan": "replayed",
        "install_date": date(now.year, now.month, now.day),
        "status": "active",
        "updated_at": now,
    }
