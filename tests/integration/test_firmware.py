"""The firmware tamper check: reported firmware changes joined, stream to stream, with the
authorized updates on their own topic; real broker, Spark and Delta."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from infra import lake as lake_tables
from pipeline import job
from pipeline.settings import PipelineSettings
from simulator import cli as simulator_cli
from tests.pipeline_helpers import device_series, encoded, produce, write_registry

pytestmark = pytest.mark.integration


def update(device_id: str, firmware: str, at: datetime) -> tuple[str, bytes]:
    body = {"update_id": f"{device_id}-{firmware}", "device_id": device_id,
            "firmware": firmware, "authorized_at": at.isoformat()}  # fmt: skip
    return device_id, json.dumps(body).encode()


def settings_for(
    lake: str, tmp_path: Path, bootstrap: str, topic: str, updates_topic: str
) -> PipelineSettings:
    """Ten-minute windows, a five-minute watermark, no model; the firmware join on."""
    return PipelineSettings(
        lake_root=lake, checkpoint_root=str(tmp_path / "cp"), bootstrap_servers=bootstrap,
        topic=topic, firmware_topic=updates_topic, window="10 minutes", slide="5 minutes",
        watermark="5 minutes", mlflow_tracking_uri=f"sqlite:///{tmp_path / 'none.db'}",
        firmware_trigger_interval="1 second",
        fast_path=False,  # its tasks need slots the shared local[2] session lacks
    )  # fmt: skip


def test_tamper_alert_only_without_an_authorized_update(
    spark: Any, bootstrap: str, make_topic: Callable[..., str], lake: str, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    topic, updates_topic = make_topic(partitions=2), make_topic(partitions=1, prefix="firmware")
    start = datetime.now(timezone.utc).replace(microsecond=0) - timedelta(hours=2)
    devices = ["steady", "rolled_out", "tampered", "wrong_version"]
    write_registry(lake, devices)  # every device is expected to run 1.0.0
    # The way an operator authorizes a rollout, then the same through the raw topic.
    monkeypatch.setenv("IOT_FIRMWARE_TOPIC", updates_topic)
    authorized_at = (start - timedelta(minutes=10)).isoformat()
    assert simulator_cli.main(["firmware", "authorize", "rolled_out", "2.0.0", "--at",
                               authorized_at, "--bootstrap-servers", bootstrap]) == 0  # fmt: skip
    produce(bootstrap, updates_topic, [
        update("wrong_version", "2.0.0", start - timedelta(minutes=10)),
        ("tampered", b"{not json"),
        ("tampered", json.dumps({"device_id": "tampered", "firmware": "6.6.6"}).encode()),
    ])  # fmt: skip
    pipeline = job.start(spark, settings_for(lake, tmp_path, bootstrap, topic, updates_topic))

    def table(name: str) -> Any:
        return spark.read.format("delta").load(lake_tables.table_path(lake, name))

    def tamper_alerts() -> list[Any]:
        return table("alerts").where("alert_type = 'firmware_tamper'").collect()

    try:
        reported = {"steady": "1.0.0", "rolled_out": "2.0.0", "tampered": "6.6.6",
                    "wrong_version": "3.0.0"}  # fmt: skip
        events = [
            event
            for device, firmware in reported.items()
            for event in device_series(device, start, 120, every_s=60, firmware=firmware)
        ]
        produce(bootstrap, topic, encoded(events))
        deadline = time.monotonic() + 180
        while True:
            for query in pipeline.queries:
                query.processAllAvailable()
            alerts = tamper_alerts()
            # Unmatched changes come out as the watermark passes them: wait for the early windows.
            early = {a.device_id for a in alerts if a.window_start < (start + timedelta(hours=1))
                     .replace(tzinfo=None)}  # fmt: skip
            if early >= {"tampered", "wrong_version"} or time.monotonic() > deadline:
                break
            time.sleep(2)
    finally:
        pipeline.stop()

    assert {a.device_id for a in alerts} == {"tampered", "wrong_version"}
    tampered = [a for a in alerts if a.device_id == "tampered"]
    assert all(a.severity == "critical" for a in alerts)
    assert "firmware 6.6.6 reported with no authorized update" in tampered[0].reasons[0]
    # One alert per device and 10-minute window, however many micro-batches fed it.
    assert len(tampered) == len({a.window_start for a in tampered})
    # The valid updates are kept; the malformed ones are quarantined with a reason.
    assert {r.device_id for r in table("firmware_updates").collect()} == {
        "rolled_out",
        "wrong_version",
    }
    reasons = {r.reason for r in table("quarantine").collect()}
    assert reasons == {"invalid_json", "missing_field"}


def test_a_change_no_later_reading_repeats_is_decided_once_the_fleet_moves_on(
    spark: Any, bootstrap: str, make_topic: Callable[..., str], lake: str, tmp_path: Path
) -> None:
    """A device that reports a rogue firmware a few times and then goes quiet (or back): its
    change is decided when the fleet's event time passes it, not when another change comes."""
    topic, updates_topic = make_topic(partitions=2), make_topic(partitions=1, prefix="firmware")
    # A minute into a ten-minute window: the three rogue readings (a minute) fall in one window,
    # hence one alert. From the clock alone, they crossed a window's end in one run of ten.
    two_hours_ago = datetime.now(timezone.utc).replace(microsecond=0) - timedelta(hours=2)
    start = two_hours_ago - timedelta(minutes=two_hours_ago.minute % 10 - 1,
                                      seconds=two_hours_ago.second)  # fmt: skip
    write_registry(lake, ["tampered", "steady"])
    pipeline = job.start(spark, settings_for(lake, tmp_path, bootstrap, topic, updates_topic))
    alerts: list[Any] = []
    try:
        # No update was ever published; the rest of the fleet reports on for two hours.
        produce(bootstrap, topic, encoded(
            device_series("tampered", start, 3, firmware="6.6.6")
            + device_series("steady", start, 120, every_s=60)
        ))  # fmt: skip
        deadline = time.monotonic() + 120
        while not alerts and time.monotonic() < deadline:
            for query in pipeline.queries:
                query.processAllAvailable()
            alerts = (
                spark.read.format("delta").load(lake_tables.table_path(lake, "alerts"))
                .where("alert_type = 'firmware_tamper'").collect()
            )  # fmt: skip
            time.sleep(2)
    finally:
        pipeline.stop()
    assert [a.device_id for a in alerts] == ["tampered"]
    assert alerts[0].window_start <= start.replace(tzinfo=None) < alerts[0].window_end
