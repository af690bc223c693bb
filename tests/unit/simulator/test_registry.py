"""Device registry: a deterministic Faker fleet, Delta writes, changes as a new table version."""

from __future__ import annotations

from datetime import datetime, timezone

from deltalake import DeltaTable

from infra import contract as c
from infra import lake
from simulator import registry as reg

NOW = datetime(2026, 1, 4, tzinfo=timezone.utc)


def test_same_seed_gives_the_same_registry() -> None:
    first = reg.build_registry(300, seed=4, now=NOW)
    assert first.equals(reg.build_registry(300, seed=4, now=NOW))
    assert not first.equals(reg.build_registry(300, seed=5, now=NOW))
    assert first.schema == c.arrow_schema(c.DEVICES_COLUMNS)
    rows = first.to_pylist()
    assert len({r["device_id"] for r in rows}) == 300
    assert {r["device_type"] for r in rows} == set(c.DEVICE_TYPES)
    assert {r["status"] for r in rows} <= {"active", "retired"}
    assert all(r["owner"] and r["site_address"] and r["expected_firmware"] for r in rows)
    assert all(-90 <= r["site_lat"] <= 90 and -180 <= r["site_lon"] <= 180 for r in rows)


def test_change_writes_a_new_version_with_the_changed_rows(tmp_path: str) -> None:
    root = str(tmp_path)
    reg.write_registry(reg.build_registry(100, seed=1, now=NOW), root)
    before = {r["device_id"]: r for r in reg.read_registry(root).to_pylist()}  # type: ignore[union-attr]
    later = datetime(2026, 2, 1, tzinfo=timezone.utc)
    changed = reg.change_devices(root, 9, seed=2, now=later)
    table = DeltaTable(lake.table_path(root, lake.DEVICES))
    assert table.version() == 1
    after = {r["device_id"]: r for r in reg.read_registry(root).to_pylist()}  # type: ignore[union-attr]
    assert len(after) == 100
    ids = changed.column("device_id").to_pylist()
    assert len(ids) == 9
    kinds = {"owner": 0, "moved": 0, "retired": 0}
    for device_id in ids:
        old, new = before[device_id], after[device_id]
        assert old["status"] == "active" and new["updated_at"] == later
        if new["owner"] != old["owner"]:
            kinds["owner"] += 1
        elif new["site_lat"] != old["site_lat"]:
            assert new["site_address"] != old["site_address"]
            kinds["moved"] += 1
        else:
            assert new["status"] == "retired"
            kinds["retired"] += 1
    assert kinds == {"owner": 3, "moved": 3, "retired": 3}
    untouched = set(after) - set(ids)
    assert all(after[d] == before[d] for d in untouched)


def test_register_devices_inserts_only_new_ones(tmp_path: str) -> None:
    root = str(tmp_path)
    reg.write_registry(reg.build_registry(5, seed=1, now=NOW), root)
    rows = [
        reg.unknown_device_row("dev-000001", device_type="thermostat", lat=1.0, lon=2.0,
                               firmware="x", now=NOW),
        reg.unknown_device_row("home-7", device_type="thermostat", lat=1.0, lon=2.0,
                               firmware="x", now=NOW),
    ]  # fmt: skip
    reg.register_devices(root, rows)
    after = {r["device_id"]: r for r in reg.read_registry(root).to_pylist()}  # type: ignore[union-attr]
    assert len(after) == 6
    assert after["home-7"]["owner"] == "unknown (replayed)"
    assert after["dev-000001"]["owner"] != "unknown (replayed)"
