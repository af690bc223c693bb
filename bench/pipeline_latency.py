"""End-to-end latency and resource use of the live pipeline at a fixed event rate.

Usage::

    .venv/bin/python bench/pipeline_latency.py [--rate 5000] [--seconds 300] [--devices 2000]

Starts its own broker (free ports, temp folder) unless KAFKA_BOOTSTRAP_SERVERS is set, creates a
registry, starts the pipeline live (``python -m pipeline run``, 1 s trigger, the ingest's 5 s
unless set, rules only, local[2] unless ``--master`` says otherwise, the shuffle partitions a user
gets: half the driver's cores unless IOT_SPARK_SHUFFLE_PARTITIONS says otherwise) and,
once it has started, the simulator at ``--rate`` events/s for ``--seconds`` (all scenarios).
Then it lets the pipeline drain (at most ``--drain`` seconds) and prints a JSON object:

- ingest latency: ``telemetry.ingest_time - kafka_timestamp`` (message in Kafka -> micro-batch
  that wrote it to ``telemetry`` started), p50/p95/max;
- alert latency: ``iotfraud.demo.alert_latency`` (a device's newest message in the Kafka offsets
  of the detection micro-batch that raised the alert -> the commit that first held the alert in
  ``alerts``), p50/p95; and from the device's first message in that batch;
- per query, from ``pipeline_metrics``: batches, batch duration p50/p95, input rows/s, state rows
  at the start and at the end (None where RocksDB holds the state: it counts rows only with
  ``IOT_SPARK_ROCKSDB_COUNT_ROWS=true``), late rows dropped;
- the pipeline's resident memory (Python driver, JVM, Python workers) sampled every 5 s: first,
  max, last;
- its CPU seconds by process (Python driver, JVM, Python workers) from the simulator's start,
  when sending ended (``cpu_s_while_sending``) and at the end (``cpu_s``): the same input, so
  runs compare by it even when their batches were cut differently; with ``--cpu-by-query``, the
  executor CPU seconds of each query's tasks (Spark UI REST API);
- a timeline in ``--bucket``-second steps (for long runs: is anything growing?): memory (median
  and max of the samples), state rows of each stateful query whose rows are counted, and the
  ingest latency p95 of the rows written in that step;
- whether the pipeline kept up: rows in the lake at the end of sending vs messages sent;
- with ``--health-every S``, every S seconds: the resident memory by process (which one grows),
  per table the data files a reader opens (the current snapshot) and the Parquet files on disk,
  the time the dashboard's overview page takes to read the lake (``bench/dashboard_reads.py``:
  its default range, the last 24 hours, per read and in all; and its last 15 minutes, which a
  long run fills early), and the time an analyst's look at the newest alert takes (its window's
  features, the device's telemetry in the window); set ``IOT_PIPELINE_MAINTENANCE_INTERVAL``
  and ``IOT_PIPELINE_VACUUM_RETENTION`` in the environment to see maintenance at work in a
  short run (``0 seconds`` switches it off, to compare).

A device reports every 10-30 s by default (about 20 s on average; ``IOT_SIM_INTERVAL_MIN_S`` and
``IOT_SIM_INTERVAL_MAX_S`` in the environment change it), so ``--devices`` of about 20 x
``--rate`` runs the simulated clock in real time, as in production; with intervals of 4-6 s, 5 x
``--rate`` does (the soak: ``--rate 5000 --devices 25000``). With fewer devices it runs faster,
behind the wall clock until the end; clock-skew injections (a device clock up to 3 hours ahead)
then pass the pipeline's clock check (``IOT_PIPELINE_MAX_CLOCK_AHEAD``, against the Kafka
timestamp), move the features watermark ahead and make other devices' events late (the ``late
rows dropped`` figure).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
from bench_broker import bench_broker
from spark_ui import application, rest, stage_cpu_s

from infra.logs import log_file
from iotfraud.demo import alert_latency, table_rows
from pipeline.sinks import AfterBatch

CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass
class ProcessTree:
    """Resident memory and CPU time of a process and its descendants, from /proc (Linux).

    Memory: a descendant counts only from its second sample on. The JVM starts short-lived child
    processes several times a second, and until such a child calls exec it shares the JVM's
    address space, so /proc shows it with the JVM's whole RSS: counted, one sample in dozens would
    read about 3 GB too high (docs/PERFORMANCE.md, the soak).

    CPU: each process's user + system time at its last sample, less what it had used at
    ``mark``, by role: ``driver`` (the pipeline's Python process), ``jvm``, ``python_workers``
    (Spark's Python workers: only the silence query runs Python code on executors). A process
    that ends between two samples loses what it used since its last one (at most 5 s).
    """

    pid: int
    _seen: set[int] = field(default_factory=set)
    _cpu: dict[int, tuple[str, float]] = field(default_factory=dict)
    _base: dict[int, float] = field(default_factory=dict)
    # The resident memory of the last sample by role (MB), to tell which process grows.
    rss_mb_by_role: dict[str, float] = field(default_factory=dict)

    def _tree(self) -> list[int]:
        children: dict[int, list[int]] = {}
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                except (OSError, IndexError, ValueError):
                    continue
                children.setdefault(ppid, []).append(int(entry.name))
        tree, todo = [self.pid], list(children.get(self.pid, []))
        while todo:
            current = todo.pop()
            tree.append(current)
            todo.extend(children.get(current, []))
        return tree

    def _role(self, pid: int, stat: str) -> str:
        if pid == self.pid:
            return "driver"
        return "jvm" if stat.split("(", 1)[1].rsplit(")", 1)[0] == "java" else "python_workers"

    def sample(self) -> float:
        """Record every process's CPU time; the resident memory now, in MB."""
        tree = self._tree()
        total_kb = 0
        by_role = dict.fromkeys(("driver", "jvm", "python_workers"), 0)
        for current in tree:
            role = None
            try:
                stat = Path(f"/proc/{current}/stat").read_text()
                fields = stat.rsplit(")", 1)[1].split()
                used = (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
                role = self._role(current, stat)
                self._cpu[current] = (role, used)
            except (OSError, IndexError, ValueError):
                pass
            if current != self.pid and current not in self._seen:
                continue
            try:
                status = Path(f"/proc/{current}/status").read_text()
            except OSError:
                continue
            match = re.search(r"VmRSS:\s+(\d+) kB", status)
            rss_kb = int(match.group(1)) if match else 0
            total_kb += rss_kb
            if role is not None:
                by_role[role] += rss_kb
        self._seen = set(tree)
        self.rss_mb_by_role = {role: round(kb / 1024) for role, kb in by_role.items()}
        return total_kb / 1024

    def mark(self) -> None:
        """CPU time counts from here."""
        self.sample()
        self._base = {pid: used for pid, (_, used) in self._cpu.items()}

    def cpu_s(self) -> dict[str, float]:
        out: dict[str, float] = {"driver": 0.0, "jvm": 0.0, "python_workers": 0.0}
        for pid, (role, used) in self._cpu.items():
            out[role] += used - self._base.get(pid, 0.0)
        out["total"] = sum(out.values())
        return {role: round(value, 1) for role, value in out.items()}


def executor_cpu_by_query(lake: str, ui: str = "http://localhost:4040") -> dict[str, Any]:
    """Executor CPU seconds (tasks' CPU time, deserialisation included) and task run time per
    query, from the Spark UI's REST API: a streaming query's jobs carry its run id as their job
    group, its foreachBatch's jobs included. Driver work (planning, pandas, Delta's commit
    protocol) is not in it."""
    names = {
        str(row["run_id"]): str(row["query_name"])
        for row in table_rows(lake, "pipeline_metrics", ["run_id", "query_name"])
    }
    app = application(ui)
    # The writes a detection batch leaves to run after it have a group of their own.
    after = AfterBatch.JOB_GROUP_SUFFIX
    group_of = {
        stage: names.get((job.get("jobGroup") or "").removesuffix(after), "other")
        for job in rest(ui, f"/applications/{app}/jobs")
        for stage in job["stageIds"]
    }
    out: dict[str, dict[str, float]] = {}
    for stage in rest(ui, f"/applications/{app}/stages?status=complete"):
        query = out.setdefault(group_of.get(stage["stageId"], "other"),
                               {"cpu_s": 0.0, "run_s": 0.0, "tasks": 0})  # fmt: skip
        query["cpu_s"] += stage_cpu_s(stage)
        query["run_s"] += stage["executorRunTime"] / 1000
        query["tasks"] += stage["numCompleteTasks"]
    return {name: {k: round(v, 1) for k, v in row.items()} for name, row in sorted(out.items())}


def lake_rows(lake: str) -> int:
    return len(table_rows(lake, "telemetry", ["event_id"])) + len(
        table_rows(lake, "quarantine", ["reason"])
    )


def quantiles(values: pd.Series) -> dict[str, float]:
    return {"p50": round(float(values.quantile(0.5)), 2),
            "p95": round(float(values.quantile(0.95)), 2),
            "max": round(float(values.max()), 2)}  # fmt: skip


def _rows(value: Any) -> int | None:
    return None if pd.isna(value) else int(value)


def query_metrics(lake: str) -> dict[str, Any]:
    metrics = pd.DataFrame(table_rows(lake, "pipeline_metrics"))
    out: dict[str, Any] = {}
    for name, rows in metrics.sort_values("timestamp").groupby("query_name"):
        busy = rows[rows["num_input_rows"] > 0]
        out[str(name)] = {
            "batches": len(rows),
            "batch_duration_s": quantiles(busy["batch_duration_ms"] / 1000) if len(busy) else None,
            "input_rows_per_s_p50": round(float(busy["input_rows_per_second"].median()), 1)
            if len(busy) else None,
            # None where the store does not count them (RocksDB: infra.spark).
            "state_rows_first_last": [_rows(rows["state_rows"].iloc[0]),
                                      _rows(rows["state_rows"].iloc[-1])],
            "late_rows_dropped": int(rows["late_rows_dropped"].fillna(0).sum()),
        }  # fmt: skip
    return out


def timeline(
    lake: str, ingest: pd.DataFrame, memory: list[tuple[float, float]], bucket_s: float
) -> list[dict[str, Any]]:
    """Per ``bucket_s`` since the first memory sample: memory median and max (a steady level
    tells growth from short peaks), last state rows per stateful query, ingest latency p95 of the
    rows written then."""
    if not memory:
        return []
    start = memory[0][0]
    origin = pd.Timestamp(start, unit="s", tz="UTC")

    def step_of(times: pd.Series) -> pd.Series:
        return (pd.to_datetime(times, utc=True) - origin).dt.total_seconds() // bucket_s

    metrics = pd.DataFrame(table_rows(lake, "pipeline_metrics"))
    metrics["step"] = step_of(metrics["timestamp"])
    ingest = ingest.assign(step=step_of(ingest["ingested"]))
    rss = pd.DataFrame(memory, columns=["t", "mb"]).assign(step=lambda d: (d.t - start) // bucket_s)
    out = []
    for step in sorted(rss["step"].unique()):
        mem = rss[rss["step"] == step]
        at = metrics[metrics["step"] == step].sort_values("timestamp")
        state = {
            str(q): _rows(rows["state_rows"].iloc[-1])
            for q, rows in at.groupby("query_name")
            if rows["state_rows"].fillna(0).any()
        }
        latency = ingest.loc[ingest["step"] == step, "latency_s"]
        out.append({"minute": round(float(step) * bucket_s / 60, 1),
                    "rss_mb_p50": round(mem.mb.median()), "rss_mb_max": round(mem.mb.max()),
                    "state_rows": state,
                    "ingest_latency_p95_s": round(float(latency.quantile(0.95)), 1)
                    if len(latency) else None})  # fmt: skip
    return out


def stop(pipeline: subprocess.Popen[bytes]) -> None:
    """SIGTERM, as an operator stops it; SIGKILL to its group when it has not ended in 2 min."""
    pipeline.send_signal(signal.SIGTERM)
    try:
        pipeline.wait(120)
    except subprocess.TimeoutExpired:
        os.killpg(pipeline.pid, signal.SIGKILL)


def check_running(
    pipeline: subprocess.Popen[bytes], log: Path, simulator: subprocess.Popen[bytes] | None = None
) -> None:
    """Stop the measurement when the pipeline has died: nothing it reports after that is true."""
    if pipeline.poll() is None:
        return
    if simulator is not None:
        simulator.terminate()
    kept = Path(tempfile.gettempdir()) / f"pipeline-failed-{os.getpid()}.log"
    kept.write_bytes(log.read_bytes())  # the run's folder goes away with it
    lines = log.read_text(errors="replace").splitlines()
    errors = [line for line in lines if "Error" in line or "Exception" in line][:5]
    errors.append(f"(the whole log: {kept})")
    raise SystemExit(
        f"the pipeline exited with code {pipeline.returncode} during the run; first errors:\n"
        + "\n".join(errors)
        + "\nlast lines:\n"
        + "\n".join(lines[-15:])
    )


HEALTH_TABLES = ("telemetry", "quarantine", "feature_changes", "features", "alerts",
                 "pipeline_metrics")  # fmt: skip


def alert_files_vacuumed(lake: str) -> bool:
    """Whether VACUUM removed files of ``alerts``: an alert's commit time is read from the first
    table version whose files hold it (``infra.lake.first_commit_times``), so with the first
    versions' files gone it would be the time of a later compaction."""
    from deltalake import DeltaTable

    try:
        history = DeltaTable(str(Path(lake) / "alerts")).history()
    except Exception:  # no alerts table
        return False
    return any(
        entry.get("operation") == "VACUUM END"
        and int((entry.get("operationMetrics") or {}).get("numDeletedFiles", 0) or 0) > 0
        for entry in history
    )


SHORT_RANGE_H = 0.25  # the dashboard's "Last 15 minutes"


def table_health(lake: str) -> dict[str, Any]:
    """Files per table (in the snapshot / on disk), and the read times of the dashboard overview
    and of an alert's detail (``bench/dashboard_reads.py``)."""
    from dashboard_reads import alert_detail_reads, overview_reads
    from deltalake import DeltaTable

    from dashboard import data

    files: dict[str, list[int]] = {}
    for name in HEALTH_TABLES:
        path = Path(lake) / name
        try:
            active = len(DeltaTable(str(path)).file_uris())
        except Exception:  # not created yet
            continue
        files[name] = [active, sum(1 for _ in path.rglob("*.parquet"))]
    now = data.utcnow()
    # The page's default range (24 hours: the whole run) and its shortest, which a long run fills
    # early: past that, its read time should stay flat.
    overview = overview_reads(lake, now)
    recent = overview_reads(lake, now, hours=SHORT_RANGE_H)
    detail = alert_detail_reads(lake, now)
    return {
        "files_snapshot_disk": files,
        "overview_read_s": round(sum(overview.values()), 2),
        "overview_reads_s": {name: round(s, 2) for name, s in overview.items()},
        "overview_15_min_read_s": round(sum(recent.values()), 2),
        "alert_detail_read_s": detail and {name: round(s, 2) for name, s in detail.items()},
    }


def run(
    root: Path, bootstrap: str, args: argparse.Namespace
) -> tuple[int, int, float, float, list[tuple[float, float]], dict[str, Any]]:
    """Registry, pipeline and simulator against ``bootstrap``; what the measurement needs:
    messages sent, rows in the lake when sending ended, seconds to send and to catch up, memory
    samples, and the rest (table health, CPU)."""
    lake = str(root / "lake")
    env = {**os.environ, "KAFKA_BOOTSTRAP_SERVERS": bootstrap, "IOT_LAKE_ROOT": lake,
           "IOT_TOPIC": "bench.telemetry", "IOT_PIPELINE_CHECKPOINT_ROOT": str(root / "cp"),
           "MLFLOW_TRACKING_URI": f"sqlite:///{root / 'none.db'}",
           "IOT_SPARK_MASTER": args.master,
           "IOT_PIPELINE_TRIGGER_INTERVAL": "1 second", "IOT_SIM_DEVICES": str(args.devices),
           "IOT_SIM_PARTITIONS": "4",
           # The log file (Spark's lines, the project's DEBUG lines) in the run's folder.
           "IOT_STACK_STATE_DIR": str(root / "state")}  # fmt: skip
    if args.cpu_by_query:
        env["IOT_SPARK_UI_ENABLED"] = "true"
        # Every job and stage of the run kept for the REST API (Spark keeps the last 1,000).
        env["PYSPARK_SUBMIT_ARGS"] = (
            "--conf spark.ui.retainedJobs=1000000 "
            "--conf spark.ui.retainedStages=1000000 pyspark-shell"
        )
    subprocess.run([sys.executable, "-m", "simulator", "registry", "create"], env=env,
                   check=True, capture_output=True)  # fmt: skip
    # The topics exist before the pipeline checks them: a zero-length simulator run.
    subprocess.run([sys.executable, "-m", "simulator", "simulate", "--count", "1",
                    "--no-scenarios", "--no-progress"], env=env, check=True,
                   capture_output=True)  # fmt: skip
    log = (root / "pipeline.log").open("wb")
    pipeline = subprocess.Popen([sys.executable, "-m", "pipeline", "run"], env=env,
                                stdout=log, stderr=log, start_new_session=True)  # fmt: skip
    memory: list[tuple[float, float]] = []  # (unix time, MB)
    health: list[dict[str, Any]] = []
    extra: dict[str, Any] = {"table_health": health}
    tree = ProcessTree(pipeline.pid)
    try:
        while lake_rows(lake) < 1:  # the single warm-up message is through: it runs
            assert pipeline.poll() is None, (root / "pipeline.log").read_text()[-3000:]
            time.sleep(1)
        tree.mark()  # learns the processes; from the next sample on they count
        started = time.monotonic()
        simulator = subprocess.Popen(
            [sys.executable, "-m", "simulator", "simulate", "--rate", str(args.rate),
             "--duration", str(args.seconds), "--no-progress"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        next_health = time.monotonic() + (args.health_every or 0)
        while simulator.poll() is None:
            check_running(pipeline, root / "pipeline.log", simulator)
            memory.append((time.time(), tree.sample()))
            if args.health_every and time.monotonic() >= next_health:
                health.append({"minute": round((time.monotonic() - started) / 60, 1),
                               "rss_mb_by_process": tree.rss_mb_by_role,
                               **table_health(lake)})  # fmt: skip
                print(json.dumps(health[-1]), file=sys.stderr, flush=True)
                next_health += args.health_every
            time.sleep(5)
        out, _ = simulator.communicate()
        final = out.decode().strip().splitlines()[-1]
        match = re.search(r"sent ([\d,]+)", final)
        assert match, final
        sent = int(match.group(1).replace(",", "")) + 1  # and the warm-up message
        in_lake_at_end = lake_rows(lake)
        extra["cpu_s_while_sending"] = tree.cpu_s()
        send_s = time.monotonic() - started
        deadline = time.monotonic() + args.drain
        while lake_rows(lake) < sent and time.monotonic() < deadline:
            check_running(pipeline, root / "pipeline.log")
            memory.append((time.time(), tree.sample()))
            time.sleep(5)
        drained_s = time.monotonic() - started
        time.sleep(30)  # the detection query finishes its last batches
        tree.sample()
        extra["cpu_s"] = tree.cpu_s()
        if args.cpu_by_query:
            extra["executor_cpu_by_query"] = executor_cpu_by_query(lake)
    finally:
        stop(pipeline)
        log.close()
        if args.keep_log:
            # The terminal's lines (progress, warnings), then the log file's.
            logged = log_file(root / "state")
            args.keep_log.write_bytes(
                (root / "pipeline.log").read_bytes()
                + (logged.read_bytes() if logged.exists() else b"")
            )
    return sent, in_lake_at_end, send_s, drained_s, memory, extra


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rate", type=float, default=5000)
    parser.add_argument("--seconds", type=float, default=300)
    parser.add_argument("--devices", type=int, default=2000)
    parser.add_argument("--drain", type=float, default=600)
    parser.add_argument(
        "--master",
        default="local[2]",
        help="the pipeline's Spark master (task slots; this machine has 2 cores)",
    )
    parser.add_argument("--bucket", type=float, default=300, help="timeline step, seconds")
    parser.add_argument("--health-every", type=float, default=0,
                        help="seconds between table-health samples (0: none)")  # fmt: skip
    parser.add_argument("--keep-log", type=Path, default=None,
                        help="copy the pipeline's terminal and log file here at the end "
                        "(IOT_LOG_LEVEL=DEBUG in the environment adds where each ingest and "
                        "detection batch's time went)")  # fmt: skip
    parser.add_argument("--keep-lake", type=Path, default=None,
                        help="copy the lake's tables to this new folder at the end (to time "
                        "maintenance on them: bench/maintenance_cost.py)")  # fmt: skip
    parser.add_argument("--cpu-by-query", action="store_true",
                        help="start the Spark UI and report each query's executor CPU time "
                        "from its REST API")  # fmt: skip
    args = parser.parse_args()
    if args.keep_log is not None:
        # Checked now by writing it: the copy is made after the run, when a path it cannot
        # write (a folder, a missing folder, no permission) would lose the run's results.
        try:
            if args.keep_log.is_dir():
                raise IsADirectoryError(21, "is a folder")
            args.keep_log.touch()
        except OSError as error:
            parser.error(f"--keep-log {args.keep_log}: {error.strerror}; give a file path to write")
    if args.keep_lake is not None and (
        args.keep_lake.exists() or not args.keep_lake.parent.is_dir()
    ):
        parser.error(f"--keep-lake {args.keep_lake}: give a new folder in an existing one")

    with tempfile.TemporaryDirectory(prefix="latbench-") as tmp:
        root = Path(tmp)
        with bench_broker(root / "kafka") as bootstrap:
            sent, in_lake_at_end, send_s, drained_s, memory, extra = run(root, bootstrap, args)
        lake = str(root / "lake")

        telemetry = pd.DataFrame(table_rows(lake, "telemetry", ["ingest_time", "kafka_timestamp"]))
        ingested = pd.to_datetime(telemetry["ingest_time"], utc=True)
        ingest = (
            ingested - pd.to_datetime(telemetry["kafka_timestamp"], utc=True)
        ).dt.total_seconds()
        steps = timeline(lake, pd.DataFrame({"ingested": ingested, "latency_s": ingest}),
                         memory, args.bucket)  # fmt: skip
        alerts = by_telemetry = None
        if not alert_files_vacuumed(lake):
            alerts = alert_latency(lake)
            by_telemetry = alert_latency(lake, by_batch=False)
        else:
            print(
                "alert latency not measured: VACUUM removed files of alerts (a retention "
                "shorter than the run), so their first commit times are lost",
                file=sys.stderr,
            )
        result = {
            "rate": args.rate, "seconds": args.seconds, "devices": args.devices,
            "master": args.master,
            "sent": sent, "send_s": round(send_s, 1),
            "in_lake_when_sending_ended": in_lake_at_end,
            "in_lake_at_end": lake_rows(lake), "caught_up_after_s": round(drained_s, 1),
            "ingest_latency_s": quantiles(ingest),
            "alert_latency_s": None if alerts is None else {
                "p50": round(alerts.p50, 2), "p95": round(alerts.p95, 2)},
            # From the device's first message in the batch that raised the alert: the message's
            # wait for the micro-batch that reads it is in it.
            "alert_latency_from_first_message_s": None
            if alerts is None or alerts.first_p50 is None or alerts.first_p95 is None
            else {"p50": round(alerts.first_p50, 2), "p95": round(alerts.first_p95, 2)},
            # The estimate that needs no batch offsets: it takes the device's newest message
            # telemetry held before the alert, which with detection ahead of ingest is often an
            # earlier one.
            "alert_latency_by_telemetry_s": None if by_telemetry is None else {
                "p50": round(by_telemetry.p50, 2), "p95": round(by_telemetry.p95, 2)},
            "queries": query_metrics(lake),
            "pipeline_rss_mb": {"first": round(memory[0][1]),
                                "max": round(max(mb for _, mb in memory)),
                                "last": round(memory[-1][1])} if memory else None,
            "timeline": steps,
            **extra,
        }  # fmt: skip
        if args.keep_lake is not None:
            shutil.copytree(lake, args.keep_lake)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
