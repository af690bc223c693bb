"""A real Apache Kafka broker (KRaft, single node) run from the Maven Central jars.

The broker keeps everything in one folder: ``server.properties``, ``data/``, ``broker.log`` and
``broker.pid``. ``stop`` only ever signals the process whose pid it recorded, after checking that
it is still our broker.

With a ``secure_port`` the broker also listens with SASL_SSL there: SCRAM-SHA-512 and
SCRAM-SHA-256 logins over TLS (certificate from ``infra.kafka_tls``, in ``tls/``). The SCRAM user
is created, or its password updated, through the plaintext listener at every start, so no
password is ever written to a file or a command line. The plaintext listener stays for local tools
and for the broker itself.
"""

from __future__ import annotations

import base64
import logging
import os
import signal
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from infra import processes
from infra.errors import BrokerStartError, ConfigError, KafkaAccessError
from infra.jars import KAFKA_BUNDLE, resolve
from infra.java import check_java
from infra.kafka_client import connect
from infra.kafka_tls import TlsFiles, ensure_tls
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


SCRAM_MECHANISMS = ("SCRAM-SHA-512", "SCRAM-SHA-256")
SCRAM_ITERATIONS = 8192
_SCRAM_LOGIN = "org.apache.kafka.common.security.scram.ScramLoginModule required;"


@dataclass(frozen=True)
class SaslUser:
    """The SCRAM user the secured listener accepts."""

    username: str
    password: str = field(repr=False)


def secure_listener_properties(tls: TlsFiles) -> str:
    """The SASL_SSL listener: SCRAM logins over TLS, no client certificates."""
    lines = [
        "listener.name.sasl_ssl.sasl.enabled.mechanisms=" + ",".join(SCRAM_MECHANISMS),
        *(
            f"listener.name.sasl_ssl.{m.lower()}.sasl.jaas.config={_SCRAM_LOGIN}"
            for m in SCRAM_MECHANISMS
        ),
        "listener.name.sasl_ssl.ssl.keystore.type=PKCS12",
        f"listener.name.sasl_ssl.ssl.keystore.location={tls.keystore.resolve()}",
        f"listener.name.sasl_ssl.ssl.keystore.password={tls.keystore_password()}",
        "listener.name.sasl_ssl.ssl.client.auth=none",
    ]
    return "\n".join(lines) + "\n"


LOOPBACK = "127.0.0.1"


def server_properties(
    host: str,
    port: int,
    controller_port: int,
    data_dir: Path,
    *,
    secure_port: int | None = None,
    tls: TlsFiles | None = None,
) -> str:
    """Minimal single-node KRaft configuration (static quorum), with a SASL_SSL listener on
    ``secure_port`` when given.

    With SASL_SSL, the plaintext and controller listeners bind loopback only: on ``host`` they
    would let anyone who reaches it produce and consume without credentials.
    """
    plain = LOOPBACK if secure_port is not None else host
    listeners = f"PLAINTEXT://{plain}:{port},CONTROLLER://{plain}:{controller_port}"
    advertised = f"PLAINTEXT://{plain}:{port}"
    protocols = "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT"
    secure = ""
    if secure_port is not None:
        if tls is None:
            raise ValueError("a secure_port needs the TLS files")
        listeners += f",SASL_SSL://{host}:{secure_port}"
        advertised += f",SASL_SSL://{host}:{secure_port}"
        protocols += ",SASL_SSL:SASL_SSL"
        secure = secure_listener_properties(tls)
    return f"""\
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@{plain}:{controller_port}
listeners={listeners}
advertised.listeners={advertised}
inter.broker.listener.name=PLAINTEXT
controller.listener.names=CONTROLLER
listener.security.protocol.map={protocols}
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
{secure}"""


@dataclass
class KafkaBroker:
    """One local broker process and the folder it lives in."""

    home: Path
    cache_dir: Path
    host: str = "127.0.0.1"
    port: int = 9092
    controller_port: int = 9093
    heap: str = "512m"
    secure_port: int | None = None
    sasl_user: SaslUser | None = None

    @property
    def plain_host(self) -> str:
        """Where the plaintext and controller listeners bind: loopback once SASL_SSL is on."""
        return LOOPBACK if self.secure_port is not None else self.host

    @property
    def bootstrap_servers(self) -> str:
        """The plaintext endpoint (loopback only when the broker has a SASL_SSL listener)."""
        return f"{self.plain_host}:{self.port}"

    @property
    def secure_bootstrap_servers(self) -> str | None:
        """The SASL_SSL endpoint, when the broker has one."""
        return None if self.secure_port is None else f"{self.host}:{self.secure_port}"

    @property
    def tls(self) -> TlsFiles:
        return TlsFiles(self.home / "tls")

    def secure_client_options(self) -> dict[str, str]:
        """librdkafka options that log in as ``sasl_user`` on the SASL_SSL listener."""
        if self.secure_bootstrap_servers is None or self.sasl_user is None:
            raise ConfigError("this broker has no SASL_SSL listener and user")
        return {
            "bootstrap.servers": self.secure_bootstrap_servers,
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": SCRAM_MECHANISMS[0],
            "sasl.username": self.sasl_user.username,
            "sasl.password": self.sasl_user.password,
            "ssl.ca.location": str(self.tls.ca_pem.resolve()),
        }

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

    def start(self, timeout_s: float = 60.0, *, die_with_parent: bool = False) -> None:
        """Start the broker unless it already runs, and wait until it answers metadata requests.

        A broker that does not come up, or whose start is interrupted, is stopped again. With
        ``die_with_parent`` the kernel kills it when this process dies (the demo's broker);
        without, it runs until ``stop`` (``iotfraud stack up``).

        Raises:
            PortInUseError: a port is taken by another process.
            BrokerStartError: the broker exited or did not answer in time (with its log tail).
        """
        if self.secure_port is not None and self.sasl_user is None:
            raise ConfigError("a broker with a SASL_SSL listener needs its SCRAM user")
        if self.is_running():
            log.info("broker already running at %s", self.bootstrap_servers)
            wait_until_ready(self.bootstrap_servers, timeout_s, self)
            self._ready_secured(timeout_s)
            return
        java = check_java()
        require_free(self.plain_host, self.port, "Kafka broker")
        require_free(self.plain_host, self.controller_port, "Kafka controller")
        if self.secure_port is not None:
            require_free(self.host, self.secure_port, "Kafka SASL_SSL listener")
        classpath = os.pathsep.join(str(p) for p in resolve(KAFKA_BUNDLE, self.cache_dir))

        data_dir = self.home / "data"
        self.home.mkdir(parents=True, exist_ok=True)
        data_dir.mkdir(exist_ok=True)
        tls = ensure_tls(self.tls.folder, java, self.host) if self.secure_port else None
        # The file holds the keystore password when secured: readable by the owner only.
        self.config_file.touch(mode=0o600)
        self.config_file.chmod(0o600)
        self.config_file.write_text(
            server_properties(self.host, self.port, self.controller_port, data_dir.resolve(),
                              secure_port=self.secure_port, tls=tls)
        )  # fmt: skip
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
                preexec_fn=processes.die_with_parent() if die_with_parent else None,  # noqa: PLW1509
            )  # fmt: skip
        self.pid_file.write_text(str(proc.pid))
        log.info("started Kafka broker pid %d at %s", proc.pid, self.bootstrap_servers)
        try:
            wait_until_ready(self.bootstrap_servers, timeout_s, self, proc)
            self._ready_secured(timeout_s)
        except BaseException:
            self.stop()
            raise

    def _ready_secured(self, timeout_s: float) -> None:
        """Create or update the SCRAM user, then wait until it can log in on SASL_SSL."""
        if self.secure_port is None or self.sasl_user is None:
            return
        if f"SASL_SSL://{self.host}:{self.secure_port}" not in self.config_file.read_text():
            raise BrokerStartError(
                f"The broker at {self.bootstrap_servers} runs without the SASL_SSL listener on "
                f"port {self.secure_port}. Stop it ('iotfraud stack down') and start it again."
            )
        upsert_scram_user(self.bootstrap_servers, self.sasl_user, timeout_s)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                connect(self.secure_client_options(), max(1.0, deadline - time.monotonic()))
            except KafkaAccessError:
                # A credential just written can take a moment to reach the listener.
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.5)
                continue
            except ConfigError as exc:
                tail = self.log_tail()
                raise BrokerStartError(f"{exc}\nLast lines of its log:\n{tail}") from None
            log.info("SASL_SSL listener ready at %s", self.secure_bootstrap_servers)
            return

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
        """The last ``lines`` lines of the broker's log, Java stack frames folded away.

        A fatal error's frames alone can fill the tail and push out the line that names it
        (``java.lang.OutOfMemoryError: ...``).
        """
        try:
            text = self.log_file.read_text(errors="replace")
        except FileNotFoundError:
            return "(no broker log)"
        return "\n".join(fold_stack_frames(text.splitlines())[-lines:])

    def _cluster_id(self) -> str:
        id_file = self.home / "cluster.id"
        # An id starting with "-" never formatted any storage (see new_cluster_id): replace it.
        if not id_file.exists() or id_file.read_text().startswith("-"):
            id_file.write_text(new_cluster_id())
        return id_file.read_text().strip()


def fold_stack_frames(lines: list[str]) -> list[str]:
    """Each run of Java stack frames (``\tat ...``, ``\t... N more``) as one line counting them."""
    folded: list[str] = []
    frames = 0
    for line in [*lines, ""]:
        if line.startswith("\tat ") or line.startswith("\t... "):
            frames += 1
            continue
        if frames:
            folded.append(f"\t({frames} stack frames)")
            frames = 0
        folded.append(line)
    return folded[:-1]


def new_cluster_id() -> str:
    """A random cluster id: a UUID in URL-safe base64 (22 characters), never starting with "-".

    The storage tool would read such an id as an option and refuse to format (1 id in 64);
    Kafka's own ``Uuid.randomUuid`` skips them for the same reason.
    """
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


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


def upsert_scram_user(bootstrap: str, user: SaslUser, timeout_s: float = 30.0) -> None:
    """Create the SCRAM user (every mechanism the listener offers) or set its password."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import (  # type: ignore[attr-defined]
        AdminClient,
        ScramCredentialInfo,
        ScramMechanism,
        UserScramCredentialUpsertion,
    )

    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    # The broker refuses two changes to one user in a request: one request per mechanism.
    for mechanism in (ScramMechanism.SCRAM_SHA_512, ScramMechanism.SCRAM_SHA_256):
        upsert = UserScramCredentialUpsertion(
            user.username,
            ScramCredentialInfo(mechanism, SCRAM_ITERATIONS),
            user.password.encode(),
        )
        try:
            for future in admin.alter_user_scram_credentials([upsert]).values():
                future.result(timeout=timeout_s)
        except KafkaException as exc:
            raise BrokerStartError(
                f"Creating the SCRAM user {user.username!r} on {bootstrap} failed: {exc}"
            ) from None
    log.info("SCRAM user %s ready (%s)", user.username, ", ".join(SCRAM_MECHANISMS))


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
