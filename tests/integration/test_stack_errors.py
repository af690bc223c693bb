"""Bad set-ups fail at start with a message that says what to fix."""

from __future__ import annotations

import socket
import stat
from pathlib import Path

import pytest

from infra.errors import BrokerStartError, JarResolutionError, JavaError, PortInUseError
from infra.jars import Artifact, JarBundle, resolve
from infra.java import check_java, parse_java_major
from infra.kafka import KafkaBroker
from infra.ports import free_port
from infra.settings import StackSettings

pytestmark = pytest.mark.integration


def fake_java(tmp_path: Path, version: str) -> Path:
    home = tmp_path / "jdk"
    (home / "bin").mkdir(parents=True)
    java = home / "bin" / "java"
    java.write_text(f"#!/bin/sh\necho 'openjdk version \"{version}\" 2019-01-15' >&2\n")
    java.chmod(java.stat().st_mode | stat.S_IEXEC)
    return home


@pytest.mark.parametrize(
    ("output", "major"),
    [('openjdk version "17.0.15" 2025-04-15', 17), ('java version "1.8.0_392"', 8),
     ('openjdk version "21" 2023-09-19', 21)],
)  # fmt: skip
def test_java_major_version_is_parsed(output: str, major: int) -> None:
    assert parse_java_major(output) == major


def test_old_java_is_refused_with_a_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JAVA_HOME", str(fake_java(tmp_path, "11.0.2")))
    with pytest.raises(JavaError, match=r"Java 17\+ is required, found Java 11"):
        check_java()


def test_missing_java_is_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(JavaError, match="no 'java' was found"):
        check_java()


def test_port_in_use_is_named(stack_settings: StackSettings, tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        broker = KafkaBroker(tmp_path / "b", stack_settings.cache_dir, port=port,
                             controller_port=free_port())  # fmt: skip
        with pytest.raises(PortInUseError, match=f"127.0.0.1:{port}"):
            broker.start()


def test_unresolvable_jars_are_named_with_offline_instructions(tmp_path: Path) -> None:
    bundle = JarBundle("bogus", (Artifact("org.example.iotfraud", "no-such-artifact", "0.0.1"),))
    with pytest.raises(JarResolutionError) as err:
        resolve(bundle, tmp_path)
    message = str(err.value)
    assert "org.example.iotfraud:no-such-artifact:0.0.1" in message
    assert "To provide them offline" in message and ".complete" in message


def test_broker_that_does_not_come_up_shows_its_log(
    stack_settings: StackSettings, tmp_path: Path
) -> None:
    # 8 MB of heap is not enough for the broker to boot: it dies with OutOfMemoryError.
    broker = KafkaBroker(tmp_path / "b", stack_settings.cache_dir, host="127.0.0.1",
                         port=free_port(), controller_port=free_port(), heap="8m")  # fmt: skip
    with pytest.raises(BrokerStartError) as err:
        broker.start(timeout_s=60)
    assert "Last lines of its log" in str(err.value)
    assert "OutOfMemoryError" in str(err.value)
    assert not broker.is_running()
