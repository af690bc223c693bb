"""The registry the streaming joins read (``pipeline.registry``): held in Spark's cache, read
again when the ``devices`` table gets a new version; real Spark, Delta and deltalake writes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from pipeline.features import with_device
from pipeline.registry import PinnedRegistry
from tests.pipeline_helpers import write_registry

pytestmark = pytest.mark.integration


def test_a_stream_joins_the_cached_registry_and_a_new_version_after_a_refresh(
    spark: Any, lake: str, tmp_path: Path
) -> None:
    write_registry(lake, ["known"])  # as the simulator's registry commands write it
    registry = PinnedRegistry.load(spark, lake)
    folder = tmp_path / "events"
    folder.mkdir()
    batches: list[list[tuple[str, bool]]] = []

    def send(name: str, devices: list[str]) -> None:
        frame = pd.DataFrame({"device_id": devices, "event_time": pd.Timestamp("2026-12-05")})
        frame.to_parquet(folder / f"{name}.parquet")

    def joined(batch: Any, batch_id: int) -> None:
        batches.append(sorted((r.device_id, r.registered) for r in batch.collect()))

    events = spark.readStream.schema("device_id string, event_time timestamp").parquet(str(folder))
    query = (
        with_device(events, registry.frame)
        .select("device_id", "registered")
        .writeStream.foreachBatch(joined)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .start()
    )
    try:
        send("first", ["known", "newcomer"])
        query.processAllAvailable()
        # Each micro-batch reads the registry from memory: no plan over the table's log.
        plan = query._jsq.streamingQuery().lastExecution().executedPlan().toString()
        assert "InMemoryTableScan" in plan

        write_registry(lake, ["newcomer"], mode="append")
        send("before_refresh", ["newcomer"])
        query.processAllAvailable()
        assert registry.refresh()  # the table has a new version
        assert not registry.refresh()  # and no newer one
        send("after_refresh", ["newcomer"])
        query.processAllAvailable()
    finally:
        query.stop()
        registry.release()

    assert batches == [
        [("known", True), ("newcomer", False)],
        [("newcomer", False)],  # the cached version, until the refresh
        [("newcomer", True)],
    ]
    assert registry.version == 1
