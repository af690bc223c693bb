"""A broker that dies at start-up is reported with the line that names its error."""

from __future__ import annotations

from pathlib import Path

from infra.kafka import KafkaBroker

FATAL = [
    "[2026-11-25 03:14:50,103] ERROR Exiting Kafka due to fatal exception (kafka.Kafka$)",
    "java.lang.OutOfMemoryError: Java heap space",
    *[f"\tat java.base/java.util.jar.Manifest.read(Manifest.java:{n}) ~[?:?]" for n in range(32)],
    "Caused by: java.lang.IllegalStateException: boom",
    "\tat kafka.Kafka.main(Kafka.scala) [kafka_2.13-4.1.1.jar:?]",
    "\t... 12 more",
]


def test_the_tail_keeps_the_error_line_that_a_long_stack_trace_would_push_out(
    tmp_path: Path,
) -> None:
    broker = KafkaBroker(home=tmp_path, cache_dir=tmp_path / "cache")
    broker.log_file.write_text("\n".join(["INFO starting"] * 40 + FATAL) + "\n")
    tail = broker.log_tail(lines=5).splitlines()
    assert tail == [
        "[2026-11-25 03:14:50,103] ERROR Exiting Kafka due to fatal exception (kafka.Kafka$)",
        "java.lang.OutOfMemoryError: Java heap space",
        "\t(32 stack frames)",
        "Caused by: java.lang.IllegalStateException: boom",
        "\t(2 stack frames)",
    ]


def test_a_missing_log_is_said_plainly(tmp_path: Path) -> None:
    assert KafkaBroker(home=tmp_path, cache_dir=tmp_path / "cache").log_tail() == "(no broker log)"
