"""Where a JVM's CPU went: a summary of a Java Flight Recorder file from a pipeline run.

Usage: while a pipeline runs (``bench/pipeline_latency.py ...``), record its JVM (the
``SparkSubmit`` process whose parent is ``python -m pipeline run``) for a while, then read it::

    jcmd <pid> JFR.start settings=profile filename=/tmp/rec.jfr duration=180s
    .venv/bin/python bench/jfr_profile.py /tmp/rec.jfr

(Not through ``spark.driver.defaultJavaOptions``: a local session sets that option itself,
``infra.spark``.)

Reads the recording with the JDK's ``jfr`` tool and prints:

- the share of Java execution samples by thread (Spark's task threads, each query's stream
  execution thread, where it plans its micro-batches, the Python callbacks' threads, ...);
- the share of samples whose stack holds each of ``MARKERS`` (a sample counts for every marker
  its stack holds, so the shares overlap: the parse runs inside the Kafka scan's stage);
- the methods most often on top of the stack;
- what the JIT compiled (seconds per package, the longest compilations) and the methods it
  threw compiled code away for (deoptimizations), most often first.

Samples are of threads running Java code: time in native code (RocksDB) and in the JVM's own
threads (the compilers, GC) is not in them; the compilations are.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import subprocess
from typing import Any

# Marker (a regular expression on "class.method" of a frame) -> what it stands for.
MARKERS = {
    r"JsonToStructs|JacksonParser": "JSON parse (from_json)",
    r"JsonExpressionUtils\.jsonObjectKeys": "JSON keys (json_object_keys)",
    r"KafkaDataConsumer": "Kafka consumer",
    r"AggregationIterator": "aggregation, interpreted (sort or object hash)",
    r"UnsafeExternalRowSorter": "sort",
    r"HashAggregateExec|GeneratedIteratorForCodegenStage\d+\.agg_": "hash aggregation",
    r"StreamingDeduplicate": "dropDuplicates state",
    r"StateStoreSave|StateStoreRestore": "window state",
    r"parquet\.hadoop|ParquetOutputWriter": "Parquet write",
    r"VectorizedParquet|parquet\.column": "Parquet read",
    r"io\.delta|sql\.delta": "Delta",
    r"ArrowConverters|org\.apache\.arrow": "Arrow",
    r"catalyst\.(analysis|optimizer|rules)|QueryExecution": "planning",
    r"codehaus\.janino|CodeGenerator": "code generation",
    r"GeneratedClass": "generated code",
}


def events(recording: str, kinds: str, depth: int = 64) -> list[dict[str, Any]]:
    out = subprocess.run(
        ["jfr", "print", "--json", "--stack-depth", str(depth), "--events", kinds, recording],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    found: list[dict[str, Any]] = json.loads(out)["recording"]["events"]
    return found


def frame_name(frame: dict[str, Any]) -> str:
    return f"{frame['method']['type']['name'].replace('/', '.')}.{frame['method']['name']}"


def thread_group(name: str) -> str:
    query = re.match(r"stream execution thread for (\S+)", name)
    if query:
        return f"planning and driver work: {query.group(1)}"
    if name.startswith("Executor task launch"):
        return "tasks"
    return re.sub(r"[-#\d ]+$", "", name) or "?"


def seconds(duration: str) -> float:
    """An ISO-8601 duration as ``jfr`` prints it (PT1.5S, PT2M3.1S) in seconds."""
    parts = re.match(r"PT(?:(\d+)H)?(?:(\d+)M)?(?:([\d.]+)S)?", duration)
    assert parts is not None, duration
    hours, minutes, secs = parts.groups()
    return int(hours or 0) * 3600 + int(minutes or 0) * 60 + float(secs or 0)


def shares(counts: collections.Counter[str], total: int, top: int) -> None:
    for name, count in counts.most_common(top):
        print(f"  {count / total:6.1%}  {name}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recording")
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args()

    samples = events(args.recording, "jdk.ExecutionSample")
    threads: collections.Counter[str] = collections.Counter()
    marked: collections.Counter[str] = collections.Counter()
    tops: collections.Counter[str] = collections.Counter()
    for sample in samples:
        values = sample["values"]
        thread = values.get("sampledThread") or {}
        threads[thread_group(thread.get("javaName") or thread.get("osName") or "")] += 1
        frames = [frame_name(f) for f in (values.get("stackTrace") or {}).get("frames", [])]
        for marker, meaning in MARKERS.items():
            if any(re.search(marker, f) for f in frames):
                marked[meaning] += 1
        if frames:
            tops[frames[0]] += 1
    print(f"{len(samples)} execution samples\nby thread:")
    shares(threads, len(samples), args.top)
    print("stacks holding (overlapping):")
    shares(marked, len(samples), len(MARKERS))
    print("on top of the stack:")
    shares(tops, len(samples), args.top)

    compiled = events(args.recording, "jdk.Compilation,jdk.Deoptimization", depth=1)
    by_package: collections.Counter[str] = collections.Counter()
    longest: list[tuple[float, str]] = []
    thrown_away: collections.Counter[str] = collections.Counter()
    for event in compiled:
        values = event["values"]
        method = f"{values['method']['type']['name']}.{values['method']['name']}"
        if event["type"] == "jdk.Compilation":
            took = seconds(values["duration"])
            by_package["/".join(method.split("$", maxsplit=1)[0].split("/")[:5])] += took
            longest.append((took, method))
        else:
            thrown_away[f"{method} ({values.get('reason')})"] += 1
    print(f"compilations the recorder kept (the long ones): {sum(by_package.values()):.1f} s")
    for package, took in by_package.most_common(args.top // 2):
        print(f"  {took:7.1f} s  {package}")
    for took, method in sorted(longest, reverse=True)[: args.top // 2]:
        print(f"  {took:7.2f} s  {method}")
    print(f"deoptimizations: {sum(thrown_away.values())}")
    for method, count in thrown_away.most_common(args.top // 2):
        print(f"  {count:5d}  {method}")


if __name__ == "__main__":
    main()
