"""While the simulator streams, SIGKILL the pipeline five times at random moments and restart it:
the lake ends up as after an uninterrupted run of the same input.

Exact equality holds for telemetry, quarantine and features, and for the alerts of rules whose
verdict only grows as a window fills (rogue device, replay, firmware mismatch, flood). The other
rules (stuck sensor, impossible travel, tampering, cloned device) can fire on a window that is
still filling and not on the finished one, so which of those alerts exist depends on how the
input was cut into micro-batches, in any live run, killed or not; for them the test checks that
both runs raised every alert the finished windows call for.
"""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from infra import lake as tables
from models.dataset import scoring_rows
from pipeline import job
from pipeline.detection import window_states
from pipeline.settings import PipelineSettings, seconds
from tests.integration.test_exactly_once import delta_rows, key_snapshot

pytestmark = [pytest.mark.integration, pytest.mark.slow]

KILLS = 5
# The verdict of these rules can only turn from no to yes as a window receives more events.
GROWING_RULES = {"rogue_device", "replay", "firmware_mismatch", "flood"}
WINDOWING = {"IOT_PIPELINE_WINDOW": "10 minutes", "IOT_PIPELINE_SLIDE": "5 minutes",
             "IOT_PIPELINE_WATERMARK": "2 hours",
             "IOT_PIPELINE_DEDUP_HORIZON": "3 hours"}  # fmt: skip


@pytest.mark.timeout(1500)
def test_five_sigkills_while_the_simulator_streams_change_nothing(
    spark: Any, bootstrap: str, tmp_path: Path
) -> None:
    rng = random.Random(20261123)
    topic = f"killloop.{os.getpid()}"
    killed_lake, reference_lake = str(tmp_path / "killed"), str(tmp_path / "reference")
    env = {
        **os.environ, **WINDOWING,
        "KAFKA_BOOTSTRAP_SERVERS": bootstrap, "IOT_TOPIC": topic, "IOT_FIRMWARE_TOPIC": "",
        "IOT_LAKE_ROOT": killed_lake, "IOT_PIPELINE_CHECKPOINT_ROOT": str(tmp_path / "cp"),
        "IOT_PIPELINE_MAX_OFFSETS_PER_TRIGGER": "2000",
        "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'none.db'}",
        "IOT_SPARK_MASTER": "local[2]", "IOT_SPARK_SHUFFLE_PARTITIONS": "2",
        "IOT_SPARK_DRIVER_MEMORY": "1g",
        "IOT_SIM_DEVICES": "80", "IOT_SIM_PARTITIONS": "3",
    }  # fmt: skip
    simulator = subprocess.Popen(
        [sys.executable, "-m", "simulator", "simulate", "--rate", "50", "--duration", "300",
         "--accelerate", "10", "--seed", "5", "--scenario-rate", "30", "--rate-of", "replay=90",
         "--no-progress"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    pipeline_log = (tmp_path / "pipeline.log").open("ab")
    command = [sys.executable, "-m", "pipeline", "run"]
    while_streaming: list[bool] = []
    try:
        deadline = time.monotonic() + 60
        while not (Path(killed_lake) / "devices").exists():
            assert time.monotonic() < deadline, "the simulator did not create the registry"
            time.sleep(0.5)
        time.sleep(2)  # the simulator creates the topic before it sends
        for kill in range(KILLS):
            proc = subprocess.Popen(command, env=env, stdout=pipeline_log, stderr=pipeline_log,
                                    start_new_session=True)  # fmt: skip
            if kill % 2 == 0:  # inside or between micro-batches, once this run has committed
                before, deadline = delta_rows(killed_lake, "telemetry"), time.monotonic() + 240
                while delta_rows(killed_lake, "telemetry") <= before:
                    assert proc.poll() is None, (tmp_path / "pipeline.log").read_text()[-3000:]
                    assert time.monotonic() < deadline, "the pipeline made no progress"
                    time.sleep(0.5)
                time.sleep(rng.uniform(0.0, 10.0))
            else:  # anywhere, start-up included
                time.sleep(rng.uniform(5.0, 40.0))
            assert proc.poll() is None, (tmp_path / "pipeline.log").read_text()[-3000:]
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            while_streaming.append(simulator.poll() is None)
        out, _ = simulator.communicate(timeout=300)
    finally:
        if simulator.poll() is None:
            os.killpg(simulator.pid, signal.SIGKILL)
        pipeline_log.close()
    assert simulator.returncode == 0
    assert sum(while_streaming) >= 4, f"kills must hit a streaming run: {while_streaming}"
    match = re.search(r"sent ([\d,]+) \| delivered ([\d,]+) \| failures 0", out.decode())
    assert match and match.group(1) == match.group(2), out.decode()[-500:]
    delivered = int(match.group(2).replace(",", ""))

    finish = subprocess.run([*command, "--available-now"], env=env, capture_output=True,
                            text=True, timeout=900, check=False)  # fmt: skip
    assert finish.returncode == 0, finish.stderr[-3000:]

    # The uninterrupted run: the same topic, the same registry, from the beginning.
    job_settings = PipelineSettings(
        lake_root=reference_lake, checkpoint_root=str(tmp_path / "reference-cp"),
        bootstrap_servers=bootstrap, topic=topic, max_offsets_per_trigger=2000,
        firmware_topic="", mlflow_tracking_uri=f"sqlite:///{tmp_path / 'none.db'}",
        **{k.removeprefix("IOT_PIPELINE_").lower(): v for k, v in WINDOWING.items()},
    )  # fmt: skip
    spark.read.format("delta").load(tables.table_path(killed_lake, "devices")).write.format(
        "delta"
    ).save(tables.table_path(reference_lake, "devices"))
    job.run_available_now(spark, job_settings)

    expected, actual = key_snapshot(spark, reference_lake), key_snapshot(spark, killed_lake)
    # Nothing lost, nothing twice: every message delivered is in telemetry or quarantine once.
    assert len(actual["telemetry"]) + len(actual["quarantine"]) == delivered
    assert len({r[0] for r in actual["telemetry"]}) == len(actual["telemetry"])
    for table in ("telemetry", "quarantine", "features"):
        assert actual[table] == expected[table], f"{table} differs after {KILLS} SIGKILLs"

    def growing(alerts: list[Any]) -> list[Any]:
        return [a for a in alerts if a[1] in GROWING_RULES]

    assert growing(actual["alerts"]) == growing(expected["alerts"])
    assert {a[1] for a in expected["alerts"]} >= {"rogue_device", "replay"}
    features = window_states(spark, reference_lake)
    # The rules on each final window, against its device's profile as the stream has it then.
    _, final_alerts = scoring_rows(features.toPandas(), job_settings.profile_spec(),
                                   watermark_s=seconds(job_settings.watermark))  # fmt: skip
    called_for = set(final_alerts["alert_id"])
    for name, alerts in (("killed", actual["alerts"]), ("reference", expected["alerts"])):
        missing = called_for - {a[0] for a in alerts}
        assert not missing, f"the {name} run lacks alerts its finished windows call for: {missing}"
