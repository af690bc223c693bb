"""A real Apache Kafka broker (KRaft, single node) run from the Maven Central jars.

The broker keeps everything in one folder: ``server.properties``, ``data/``, ``broker.log`` and
``broker.pid``. ``stop`` only ever signals the process whose pid it recorded, after checking that
it is still our broker.
"""

from __future__ import annotations

import base64
import logging
import os
import signal
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from infra.errors import BrokerStartError
from infra.jars import KAFKA_BUNDLE, resolve
from infra.java import check_java
from infra.ports import require_free

log = logging.getLogger(__name__)

LOG4J2_CONFIG = """\
<?xml version="1.0" encoding="UTF-8"?>
<Configuration status="WARN">
  <Appenders>
    <Console name="stdout" target="SYSTEM_OUT">
      <PatternLayout pattern="[%d] %p %m (%c)%n"/>
    </Console>
  </Appenders>
  <Loggers>
    <Root level="INFO"><AppenderRef ref="stdout"/></Root>
    <Logger name="kafka.request.logger" level="WARN"/>
    <Logger name="org.apache.kafka.storage" level="WARN"/>
    <Logger name="kafka.log" level="WARN"/>
  </Loggers>
</Configuration>
"""


def server_properties(host: str, port: int, controller_port: int, data_dir: Path) -> str:
    """Minimal single-node KRaft configuration (static quorum)."""
    return f"""\
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@{host}:{controller_port}
listeners=PLAINTEXT://{host}:{port},CONTROLLER://{host}:{controller_port}
advertised.listeners=PLAINTEXT://{host}:{port}
inter.broker.listener.name=PLAINTEXT
controller.listener.names=CONTROLLER
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
log.dirs={data_dir}
num.partitions=4
offsets.topic.replication.factor=1
offsets.topic.num.partitions=4
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
auto.create.topics.enable=false
message.max.bytes=2097152
"""


@dataclass
class KafkaBroker:
    """One local broker process and the folder it lives in."""

    home: Path
    cache_dir: Path
    host: str = "127.0.0.1"
    port: int = 9092
    controller_port: int = 9093
    heap: str = "512m"

    @property
    def bootstrap_servers(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def pid_file(self) -> Path:
        return self.home / "broker.pid"

    @property
    def log_file(self) -> Path:
        return self.home / "broker.log"

    @property
    def config_file(self) -> Path:
        return self.home / "server.properties"

    def pid(self) -> int | None:
        """The pid of our running broker, or None (a stale pid file is removed)."""
        try:
            pid = int(self.pid_file.read_text().strip())
        except (FileNotFoundError, ValueError):
            return None
        if _is_our_broker(pid, self.config_file):
            return pid
        self.pid_file.unlink(missing_ok=True)
        return None

    def is_running(self) -> bool:
        return self.pid() is not None

    def start(self, timeout_s: float = 60.0) -> None:
        """Start the broker unless it already runs, and wait until it answers metadata requests.

        Raises:
            PortInUseError: a port is taken by another process.
            BrokerStartError: the broker exited or did not answer in time (with its log tail).
        """
        if self.is_running():
            log.info("broker already running at %s", self.bootstrap_servers)
            wait_until_ready(self.bootstrap_servers, timeout_s, self)
            return
        java = check_java()
        require_free(self.host, self.port, "Kafka broker")
        require_free(self.host, self.controller_port, "Kafka controller")
        classpath = os.pathsep.join(str(p) for p in resolve(KAFKA_BUNDLE, self.cache_dir))

        data_dir = self.home / "data"
        self.home.mkdir(parents=True, exist_ok=True)
        data_dir.mkdir(exist_ok=True)
        self.config_file.write_text(
            server_properties(self.host, self.port, self.controller_port, data_dir.resolve())
        )
        log4j = self.home / "log4j2.xml"
        log4j.write_text(LOG4J2_CONFIG)
        jvm_opts = [f"-Dlog4j2.configurationFile={log4j.resolve()}"]

        cluster_id = self._cluster_id()
        fmt = subprocess.run(
            [java, *jvm_opts, "-cp", classpath, "kafka.tools.StorageTool", "format",
             "-t", cluster_id, "-c", str(self.config_file), "--ignore-formatted"],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        if fmt.returncode != 0:
            raise BrokerStartError(
                f"Formatting the broker storage in {data_dir} failed:\n{fmt.stdout}{fmt.stderr}"
            )

        with self.log_file.open("ab") as out:
            proc = subprocess.Popen(
                [java, f"-Xmx{self.heap}", f"-Xms{self.heap}", *jvm_opts,
                 "-cp", classpath, "kafka.Kafka", str(self.config_file.resolve())],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True,
            )  # fmt: skip
        self.pid_file.write_text(str(proc.pid))
        log.info("started Kafka broker pid %d at %s", proc.pid, self.bootstrap_servers)
        wait_until_ready(self.bootstrap_servers, timeout_s, self, proc)

    def stop(self, timeout_s: float = 30.0) -> bool:
        """Stop our broker (SIGTERM, then SIGKILL). Returns whether one was running."""
        pid = self.pid()
        if pid is None:
            return False
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and _alive(pid):
            time.sleep(0.2)
        if _alive(pid):
            log.warning("broker pid %d did not stop in %.0fs; killing it", pid, timeout_s)
            os.kill(pid, signal.SIGKILL)
        self.pid_file.unlink(missing_ok=True)
        return True

    def kill(self) -> None:
        """SIGKILL the broker (for fault tests)."""
        pid = self.pid()
        if pid is not None:
            os.kill(pid, signal.SIGKILL)
            while _alive(pid):
                time.sleep(0.05)

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no broker log)"

    def _cluster_id(self) -> str:
        id_file = self.home / "cluster.id"
        if not id_file.exists():
            id_file.write_text(base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("="))
        return id_file.read_text().strip()


def wait_until_ready(
    bootstrap: str,
    timeout_s: float,
    broker: KafkaBroker | None = None,
    proc: subprocess.Popen[bytes] | None = None,
) -> None:
    """Poll with an admin client until the broker answers a metadata request."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    deadline = time.monotonic() + timeout_s
    while True:
        if proc is not None and proc.poll() is not None:
            tail = broker.log_tail() if broker else ""
            raise BrokerStartError(
                f"The Kafka broker exited with code {proc.returncode} during start-up. "
                f"Last lines of its log:\n{tail}"
            )
        try:
            metadata = admin.list_topics(timeout=1.0)
            if metadata.brokers:
                return
        except Exception as exc:
            log.debug("broker not ready yet: %s", exc)
        if time.monotonic() > deadline:
            tail = broker.log_tail() if broker else ""
            raise BrokerStartError(
                f"The Kafka broker at {bootstrap} did not answer within {timeout_s:.0f}s. "
                f"Last lines of its log:\n{tail}"
            )
        time.sleep(0.3)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child still answers kill(0); reap it if it is ours.
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
        return done == 0
    except ChildProcessError:
        return True


def _is_our_broker(pid: int, config_file: Path) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except (FileNotFoundError, PermissionError):
        return _alive(pid) and not Path("/proc").exists()
    return "kafka.Kafka" in cmdline and str(config_file.resolve()) in cmdline
