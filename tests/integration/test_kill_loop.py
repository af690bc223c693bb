"""While the simulator streams, SIGKILL the pipeline three times at random moments and restart it:
the lake ends up as after an uninterrupted run of the same input.

Everything is on: the registered champion scores the windows the watermark closes, and the
firmware join checks reported firmware against the authorized updates. Once every window has
closed, both runs hold the same rows in every table, on every column but the ones that say when a
row was written (``RUN_DEPENDENT``). For alerts that means: the same standing alerts, of every
type, with the same values. A rule alert raised while its window was still filling, and withdrawn
when the finished window did not call for it, exists or not depending on how the input was cut
into micro-batches, in any live run, killed or not; the test checks that the two runs never
disagree about one: an alert both runs raised has the same status in both, and one that only
one run raised was withdrawn there. The killed run also publishes to an alerts topic: batches
replayed after the kills publish again, never something the table contradicts.
"""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from infra import contract as c
from infra import lake as tables
from pipeline import job
from pipeline.settings import PipelineSettings, seconds
from tests.lake_snapshots import Rows, delta_rows, snapshot
from tests.mlflow_helpers import MODEL, register_busy_window_model
from tests.pipeline_helpers import encoded, latest_alerts, make_event, produce_at, table_alerts

pytestmark = [pytest.mark.integration, pytest.mark.slow]

# Twice once a run has committed (inside or between micro-batches), once anywhere (start-up
# included). Each restart takes a minute or more to its first commit, so each kill costs the
# suite about that much; the simulator streams as long as the kills take on a machine of its own.
KILLS = 3
# The watermark closes the first windows of the 50 simulated minutes, for the model to score.
# Nothing arrives later than it (clock_skew, hours behind, is off), so no event is dropped as
# late in one run and kept in the other.
WINDOWING = {"IOT_PIPELINE_WINDOW": "10 minutes", "IOT_PIPELINE_SLIDE": "5 minutes",
             "IOT_PIPELINE_WATERMARK": "20 minutes",
             "IOT_PIPELINE_DEDUP_HORIZON": "3 hours"}  # fmt: skip


@pytest.mark.timeout(1500)
def test_sigkills_while_the_simulator_streams_change_nothing(
    spark: Any, bootstrap: str, tmp_path: Path
) -> None:
    rng = random.Random(20261123)
    topic, firmware_topic = f"killloop.{os.getpid()}", f"killloop.{os.getpid()}.firmware"
    alerts_topic = f"killloop.{os.getpid()}.alerts"
    killed_lake, reference_lake = str(tmp_path / "killed"), str(tmp_path / "reference")
    # A champion that scores busy windows high: model alerts on the windows the watermark closes.
    models = f"sqlite:///{tmp_path / 'models.db'}"
    register_busy_window_model(models, tmp_path, min_events=40)
    env = {
        **os.environ, **WINDOWING,
        "KAFKA_BOOTSTRAP_SERVERS": bootstrap, "IOT_TOPIC": topic,
        "IOT_FIRMWARE_TOPIC": firmware_topic, "IOT_PIPELINE_ALERTS_TOPIC": alerts_topic,
        "IOT_LAKE_ROOT": killed_lake, "IOT_PIPELINE_CHECKPOINT_ROOT": str(tmp_path / "cp"),
        "IOT_PIPELINE_MAX_OFFSETS_PER_TRIGGER": "2000",
        "MLFLOW_TRACKING_URI": models, "IOT_MODEL_NAME": MODEL,
        "IOT_SPARK_MASTER": "local[2]", "IOT_SPARK_SHUFFLE_PARTITIONS": "2",
        "IOT_SPARK_DRIVER_MEMORY": "1g",
        # At least once by design (tests/integration/test_fast_path.py restarts it); the tables
        # and the windowed messages compared here are the same with it on.
        "IOT_PIPELINE_FAST_PATH": "false",
        "IOT_SIM_DEVICES": "80", "IOT_SIM_PARTITIONS": "3",
        "IOT_PIPELINE_SILENCE": "true",
        # Its batches often enough to be cut by the kills (its default is a minute).
        "IOT_PIPELINE_SILENCE_TRIGGER_INTERVAL": "5 seconds",
    }  # fmt: skip
    simulator = subprocess.Popen(
        [sys.executable, "-m", "simulator", "simulate", "--rate", "75", "--duration", "200",
         "--accelerate", "10", "--seed", "5", "--scenario-rate", "30", "--rate-of", "replay=90",
         "--rate-of", "clock_skew=0", "--rate-of", "silence=90",
         "--rate-of", "store_and_forward=90", "--rate-of", "rogue_device=90",
         "--rate-of", "stuck_sensor=90", "--rate-of", "firmware_change=90", "--no-progress"],
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
    # The first two always do; the third does on a machine of its own (a restart takes a minute to
    # its first commit), or hit a run catching up after the stream (beside another test).
    assert sum(while_streaming) >= 2, f"kills must hit a streaming run: {while_streaming}"
    match = re.search(r"sent ([\d,]+) \| delivered ([\d,]+) \| failures 0", out.decode())
    assert match and match.group(1) == match.group(2), out.decode()[-500:]
    delivered = int(match.group(2).replace(",", ""))

    reference_settings = PipelineSettings(
        lake_root=reference_lake, checkpoint_root=str(tmp_path / "reference-cp"),
        bootstrap_servers=bootstrap, topic=topic, max_offsets_per_trigger=0,
        firmware_topic=firmware_topic, alerts_topic="", mlflow_tracking_uri=models,
        model_name=MODEL, silence=True,
        **{k.removeprefix("IOT_PIPELINE_").lower(): v for k, v in WINDOWING.items()},
    )  # fmt: skip
    # The killed run's own settings (its lake, checkpoints and alerts topic).
    killed_settings = reference_settings.model_copy(update={
        "lake_root": killed_lake, "checkpoint_root": env["IOT_PIPELINE_CHECKPOINT_ROOT"],
        "alerts_topic": alerts_topic,
    })  # fmt: skip
    spark.read.format("delta").load(tables.table_path(killed_lake, "devices")).write.format(
        "delta"
    ).save(tables.table_path(reference_lake, "devices"))
    # Last in the topic, one reading of a registered device later by a window and twice the
    # watermark: the watermark passes every window the simulator filled, and the rules decide on
    # each finished window; and it passes the time by which an authorized update could still
    # have matched a firmware change (the watermark after it).
    device = spark.read.format("delta").load(tables.table_path(killed_lake, "devices")).first()
    later = datetime.now(timezone.utc) + timedelta(
        seconds=seconds(reference_settings.window) + 2 * seconds(reference_settings.watermark) + 60
    )
    produce_at(bootstrap, topic, encoded([make_event(
        device.device_id, 10**6, later, firmware=device.expected_firmware,
        lat=device.site_lat, lon=device.site_lon,
    )]), timestamp=later)  # fmt: skip
    # What is in the topic, into both lakes: the killed run restarted once more, the
    # uninterrupted one (the same topic and registry, from the beginning) in one go. Both in this
    # session, without a limit per batch: where a micro-batch ends changes no standing alert (the
    # killed run's batches end wherever the kills cut them), and a store_and_forward burst is
    # never older than the watermark (its window, at most 20 minutes, is not longer than it), so
    # a bigger batch drops nothing a smaller one keeps. A run of the available input ends with a
    # batch of no data once the watermark has moved: the windows it closes are decided there.
    job.run_available_now(spark, killed_settings)
    job.run_available_now(spark, reference_settings)

    expected, actual = snapshot(spark, reference_lake), snapshot(spark, killed_lake)
    # Nothing lost, nothing twice: every message delivered is in telemetry or quarantine once.
    assert len(actual["telemetry"]) + len(actual["quarantine"]) == delivered + 1
    assert len({r["event_id"] for r in actual["telemetry"]}) == len(actual["telemetry"])
    for table in ("telemetry", "quarantine", "features"):
        assert actual[table] == expected[table], f"{table} differs after {KILLS} SIGKILLs"

    def standing(alerts: list[Any]) -> Rows:
        # Rows: a score computed from sums over other micro-batches differs in the last bits.
        return Rows(a for a in alerts if a["status"] == c.ALERT_RAISED)

    # Every standing alert, on every column but detected_at and batch_id (doubles to 1e-7).
    assert standing(actual["alerts"]) == standing(expected["alerts"])
    types = {a["alert_type"] for a in standing(expected["alerts"])}
    assert types >= {"rogue_device", "replay", "stuck_sensor", "model_anomaly", "firmware_tamper",
                     "device_silent", "late_burst"}  # fmt: skip
    # A silence that ended while the simulator streamed (the rest end with the run: silent now).
    assert any(a["alert_type"] == "device_silent" and a["window_end"] is not None
               for a in actual["alerts"])  # fmt: skip
    status = {name: {a["alert_id"]: a["status"] for a in rows["alerts"]}
              for name, rows in (("killed", actual), ("reference", expected))}  # fmt: skip
    both = status["killed"].keys() & status["reference"].keys()
    assert {k: status["killed"][k] for k in both} == {k: status["reference"][k] for k in both}
    for name, other in (("killed", "reference"), ("reference", "killed")):
        alone = {status[name][k] for k in status[name].keys() - status[other].keys()}
        assert alone <= {c.ALERT_WITHDRAWN}, f"alerts only the {name} run raised still stand"
    # The alerts topic of the killed run: each alert's latest message is its row in the table,
    # on every column, although batches were replayed after each kill.
    assert latest_alerts(bootstrap, alerts_topic) == table_alerts(killed_lake)
