"""Detection quality of the live pipeline, on the path a user runs: ``iotfraud demo``.

Usage::

    .venv/bin/python bench/live_quality.py [--seeds 11 12] [--duration 240] [--accelerate 15] \\
        [--devices 200] [--scenario-rate 40]
    .venv/bin/python bench/live_quality.py --duration 1500 --accelerate 1 --devices 1000
    .venv/bin/python bench/live_quality.py --interrupt-after 600 --seeds 31   # make demo, 10 min

``--interrupt-after S`` runs the demo as ``make demo`` does (real time, 2,000 devices unless
``--devices``, no end, the simulator's default scenario rate unless ``--scenario-rate``) and
presses Ctrl-C (SIGINT) S seconds after its first progress line, i.e. after S seconds of the
pipeline and simulator running; the demo then prints its summary as it does for a user.

For each seed, in a fresh state folder with its own broker ports: ``iotfraud demo --no-dashboard``
with the given fleet, duration and clock (the real stack: a Kafka broker, the simulator, ``pipeline
run`` live, Delta; the demo trains and registers its first model). Scenarios are injected at
``--scenario-rate`` per simulated hour per 1,000 devices (``IOT_SIM_SCENARIO_RATE``); the demo
holds value scenarios back for the detector's cold start and keeps a quiet tail (see
``iotfraud.demo.scenario_timing``). Then it prints, per seed:

- the demo's own summary (its per-scenario table: injected, detected, precision, recall, median
  time to detect; alert latency);
- false alerts per 10,000 clean device-windows, by alert type: an alert is false when no
  injection explains it, as ``models.evaluation`` decides (mostly: its window overlaps no
  injection on its device); clean device-windows are the ``features`` windows that overlap none;
- silences: per ``device_silent`` alert that a ``silence`` or ``store_and_forward`` injection
  explains, the event time from the device's last reading to the detection (its
  ``last_event_time``), against ``IOT_PIPELINE_SILENCE_K`` x the device's interval (the median
  gap between its readings in ``telemetry`` in the hour before) and against that plus two
  trigger intervals of the silence query in event time (1 s of wall clock is ``--accelerate`` s
  of event time).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

from infra import lake
from infra.ports import free_port
from models.evaluation import CLEAN, window_labels
from models.evaluation import false_alerts as false_alerts_of
from models.live_eval import read_table, standing_alerts


def false_alerts(lake_root: str) -> tuple[int, pd.Series]:
    """(clean device-windows, false alerts by type) of a lake."""
    truth = read_table(lake_root, lake.GROUND_TRUTH, ["device_id", "scenario", "start_time",
                                                      "end_time"])  # fmt: skip
    windows = read_table(lake_root, lake.FEATURES, ["device_id", "window_start", "window_end"])
    alerts = standing_alerts(lake_root, ["device_id", "alert_type", "window_start",
                                         "window_end"])  # fmt: skip
    if truth is None or windows is None or alerts is None:
        return 0, pd.Series(dtype="int64")
    clean = int((window_labels(windows, truth, 0.0) == CLEAN).sum())
    return clean, false_alerts_of(alerts, truth)["alert_type"].value_counts()


def silence_timing(lake_root: str, accelerate: float) -> str:
    """How long after a device's last reading its silence was detected (module docstring)."""
    from iotfraud.demo import SILENCE_TRIGGER, pipeline_timing
    from pipeline.settings import PipelineSettings, seconds

    truth = read_table(lake_root, lake.GROUND_TRUTH, ["device_id", "scenario", "start_time",
                                                      "end_time"])  # fmt: skip
    alerts = standing_alerts(lake_root, ["device_id", "alert_type", "window_start", "window_end",
                                         "first_event_time", "last_event_time"])  # fmt: skip
    events = read_table(lake_root, lake.TELEMETRY, ["device_id", "event_time"])
    if truth is None or alerts is None or events is None:
        return "silences: no alerts"
    silent = alerts[alerts["alert_type"] == "device_silent"]
    absent = truth[truth["scenario"].isin(["silence", "store_and_forward"])]
    pairs = silent.merge(absent, on="device_id")
    for name in ("window_start", "window_end", "first_event_time", "last_event_time",
                 "start_time", "end_time"):  # fmt: skip
        pairs[name] = pd.to_datetime(pairs[name], utc=True)
    open_ended = pairs["window_end"].isna()  # still silent
    pairs = pairs[(pairs["window_start"] < pairs["end_time"])
                  & (open_ended | (pairs["window_end"] > pairs["start_time"]))]  # fmt: skip
    if pairs.empty:
        return "silences: none detected"
    events = events.assign(event_time=pd.to_datetime(events["event_time"], utc=True))
    events = events.sort_values("event_time")
    events["gap_s"] = events.groupby("device_id")["event_time"].diff().dt.total_seconds()

    def interval(device_id: str, before: pd.Timestamp) -> float:
        """The device's median gap in the hour before its silence (not a flood or clone of it
        elsewhere in the run)."""
        own = events[(events["device_id"] == device_id) & (events["event_time"] <= before)
                     & (events["event_time"] > before - pd.Timedelta(hours=1))]  # fmt: skip
        return float(own["gap_s"].median())

    settings = PipelineSettings()
    # The demo's silence trigger (iotfraud.demo), or the setting's.
    trigger = pipeline_timing(accelerate).get(SILENCE_TRIGGER, settings.silence_trigger_interval)
    k, trigger_s = settings.silence_k, seconds(trigger)
    took = (pairs["last_event_time"] - pairs["first_event_time"]).dt.total_seconds()
    bound = k * pd.Series(
        [
            interval(d, t)
            for d, t in zip(pairs["device_id"], pairs["first_event_time"], strict=True)
        ],
        index=pairs.index,
    )
    over = took - bound
    return (
        f"silences: {len(pairs)} detected; from the last reading to detection (event time) median "
        f"{took.median():.0f} s, against k x interval median {bound.median():.0f} s: "
        f"{over.median():+.0f} s (max {over.max():+.0f} s); 2 trigger intervals are "
        f"{2 * trigger_s * accelerate:.0f} s of event time at {accelerate:g}x; within k x interval "
        f"+ 2 triggers: {(over <= 2 * trigger_s * accelerate).sum()} of {len(pairs)}"
    )


def run(seed: int, args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="live-quality-") as scratch:
        tmp = str(args.keep / f"seed-{seed}") if args.keep else scratch
        Path(tmp).mkdir(parents=True, exist_ok=True)
        env = {
            **os.environ,
            "IOT_STACK_STATE_DIR": f"{tmp}/state", "IOT_LAKE_ROOT": f"{tmp}/lake",
            "IOT_PIPELINE_CHECKPOINT_ROOT": f"{tmp}/checkpoints",
            "IOT_MODEL_WORKDIR": f"{tmp}/training",
            "IOT_STACK_KAFKA_PORT": str(free_port()),
            "IOT_STACK_KAFKA_CONTROLLER_PORT": str(free_port()),
        }  # fmt: skip
        if args.scenario_rate is not None:
            env["IOT_SIM_SCENARIO_RATE"] = str(args.scenario_rate)
        command = [sys.executable, "-m", "iotfraud", "demo", "--no-dashboard",
                   "--devices", str(args.devices), "--seed", str(seed)]  # fmt: skip
        if args.interrupt_after is None:
            command += ["--duration", str(args.duration), "--accelerate", str(args.accelerate)]
        try:
            out = demo(command, tmp, env, args)
        finally:
            subprocess.run([sys.executable, "-m", "iotfraud", "stack", "down"], env=env,
                           cwd=tmp, capture_output=True, timeout=120, check=False)  # fmt: skip
        rate = "default" if args.scenario_rate is None else f"{args.scenario_rate:g}"
        how = (f"interrupted {args.interrupt_after:g} s after the first progress line (real time)"
               if args.interrupt_after is not None
               else f"{args.duration:g} s at {args.accelerate:g}x")  # fmt: skip
        print(f"=== seed {seed}: {args.devices} devices, {how}, scenario rate {rate}")
        start = out.find("produced to Kafka")
        print(out[start:] if start >= 0 else out[-3000:])
        clean, false = false_alerts(f"{tmp}/lake")
        per_10k = {t: round(10_000 * n / clean, 2) for t, n in false.items()} if clean else {}
        print(
            f"false alerts per 10,000 clean device-windows ({clean:,} clean): "
            f"{sum(per_10k.values()):.2f} in all; by type {per_10k or 'none'}",
            flush=True,
        )
        accelerate = 1.0 if args.interrupt_after is not None else args.accelerate
        print(silence_timing(f"{tmp}/lake", accelerate), flush=True)


def demo(command: list[str], cwd: str, env: dict[str, str], args: argparse.Namespace) -> str:
    """The demo's standard output; with ``--interrupt-after``, Ctrl-C once it has run that long."""
    if args.interrupt_after is None:
        done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True,
                              check=False, timeout=args.duration + 3600)  # fmt: skip
        if args.keep:
            Path(cwd, "demo.log").write_text(done.stderr)
        return done.stdout
    proc = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)  # fmt: skip
    assert proc.stdout is not None
    lines: list[str] = []
    deadline = None
    for line in proc.stdout:  # the demo prints a progress line every 10 s
        lines.append(line)
        if deadline is None and line.startswith("telemetry "):
            deadline = time.monotonic() + args.interrupt_after
        if deadline is not None and time.monotonic() >= deadline:
            proc.send_signal(signal.SIGINT)
            break
    lines += proc.stdout.readlines()
    proc.wait(timeout=600)
    return "".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[11, 12])
    parser.add_argument("--duration", type=float, default=240.0)
    parser.add_argument("--accelerate", type=float, default=15.0)
    parser.add_argument("--devices", type=int, help="200; 2,000 with --interrupt-after")
    parser.add_argument(
        "--scenario-rate",
        type=float,
        help="injections per simulated hour per "
        "1,000 devices: 40; the simulator's default with --interrupt-after",
    )
    parser.add_argument("--interrupt-after", type=float, help="run as `make demo` does and "
                        "press Ctrl-C after this many seconds")  # fmt: skip
    parser.add_argument("--keep", type=Path,
                        help="keep each run's state, lake and log (demo.log) here")  # fmt: skip
    args = parser.parse_args(argv)
    if args.interrupt_after is None:
        args.devices = args.devices or 200
        args.scenario_rate = args.scenario_rate or 40.0
    else:
        args.devices = args.devices or 2000
    for seed in args.seeds:
        run(seed, args)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.exit(main())
