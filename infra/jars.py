"""Resolve Maven artifacts with the Ivy jar that pyspark ships, into a cache reused offline.

Two bundles: the Spark connectors (Kafka source and Delta) and the Kafka broker itself. A bundle
is resolved once into ``<cache>/jars/<bundle>-<digest>/`` and marked complete; later calls return
the cached jars without touching the network. Ivy's own cache (``<cache>/ivy``) lets a bundle be
retrieved again offline.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from infra.errors import JarResolutionError
from infra.java import check_java

log = logging.getLogger(__name__)

# The JVM-bound stack is pinned as one set; pyproject.toml pins pyspark and delta-spark to match.
SPARK_VERSION = "4.2.0"
DELTA_VERSION = "4.4.0"
KAFKA_VERSION = "4.1.1"
LOG4J_VERSION = "2.24.3"  # the log4j-core that kafka_2.13 4.1.1 brings

COMPLETE_MARKER = ".complete"


@dataclass(frozen=True)
class Artifact:
    """A Maven coordinate."""

    group: str
    name: str
    version: str

    def __str__(self) -> str:
        return f"{self.group}:{self.name}:{self.version}"


@dataclass(frozen=True)
class JarBundle:
    """A set of artifacts resolved together, with the modules to leave out of the closure."""

    name: str
    artifacts: tuple[Artifact, ...]
    excludes: tuple[tuple[str, str], ...] = field(default=())

    def digest(self) -> str:
        text = (
            "|".join(map(str, self.artifacts)) + "|" + "|".join(":".join(e) for e in self.excludes)
        )
        return hashlib.sha256(text.encode()).hexdigest()[:12]


SPARK_BUNDLE = JarBundle(
    name="spark",
    artifacts=(
        Artifact("org.apache.spark", "spark-sql-kafka-0-10_2.13", SPARK_VERSION),
        Artifact("io.delta", f"delta-spark_{SPARK_VERSION.rsplit('.', 1)[0]}_2.13", DELTA_VERSION),
    ),
    # pyspark already ships the Hadoop client.
    excludes=(
        ("org.apache.hadoop", "hadoop-client-runtime"),
        ("org.apache.hadoop", "hadoop-client-api"),
    ),
)

KAFKA_BUNDLE = JarBundle(
    name="kafka",
    artifacts=(
        Artifact("org.apache.kafka", "kafka_2.13", KAFKA_VERSION),
        # Kafka 4.x logs through SLF4J 1.x: without this binding the broker prints nothing.
        Artifact("org.apache.logging.log4j", "log4j-slf4j-impl", LOG4J_VERSION),
    ),
)


def pyspark_jars_dir() -> Path:
    """The ``jars`` folder inside the installed pyspark package."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or not spec.submodule_search_locations:
        raise JarResolutionError(
            "pyspark is not installed; it provides the Ivy jar used to fetch Maven artifacts. "
            "Install the project with 'pip install -e .[all]' (make test does this)."
        )
    return Path(next(iter(spec.submodule_search_locations))) / "jars"


def ivy_jar() -> Path:
    jars = sorted(pyspark_jars_dir().glob("ivy-*.jar"))
    if not jars:
        raise JarResolutionError(f"No ivy-*.jar in {pyspark_jars_dir()}; reinstall pyspark.")
    return jars[-1]


def ivy_module_xml(bundle: JarBundle) -> str:
    """An ivy.xml that asks for the runtime closure of the bundle's artifacts."""
    deps = "\n".join(
        f'    <dependency org="{a.group}" name="{a.name}" rev="{a.version}"'
        ' conf="default->default"/>'
        for a in bundle.artifacts
    )
    excludes = "\n".join(
        f'    <exclude org="{group}" module="{module}"/>' for group, module in bundle.excludes
    )
    return (
        '<ivy-module version="2.0">\n'
        f'  <info organisation="iotfraud" module="{bundle.name}-jars"/>\n'
        "  <dependencies>\n"
        f"{deps}\n{excludes}\n"
        "  </dependencies>\n"
        "</ivy-module>\n"
    )


def bundle_dir(bundle: JarBundle, cache_dir: Path) -> Path:
    return cache_dir / "jars" / f"{bundle.name}-{bundle.digest()}"


def resolve(bundle: JarBundle, cache_dir: Path) -> list[Path]:
    """Return the jars of ``bundle``, resolving them from Maven Central on first use.

    Raises:
        JarResolutionError: Ivy could not resolve the artifacts; the message names them and says
            how to provide them offline.
    """
    target = bundle_dir(bundle, cache_dir)
    if (target / COMPLETE_MARKER).exists():
        return sorted(target.glob("*.jar"))

    java = check_java()
    target.mkdir(parents=True, exist_ok=True)
    log.info(
        "resolving %s jars (%s) into %s", bundle.name, ", ".join(map(str, bundle.artifacts)), target
    )
    with tempfile.TemporaryDirectory() as tmp:
        module_file = Path(tmp) / "ivy.xml"
        module_file.write_text(ivy_module_xml(bundle))
        cmd = [
            java, "-jar", str(ivy_jar()),
            "-cache", str(cache_dir / "ivy"),
            "-ivy", str(module_file),
            "-confs", "default",
            "-retrieve", str(target / "[artifact]-[revision](-[classifier]).[ext]"),
        ]  # fmt: skip
        result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        problems = [
            line.strip()
            for line in result.stdout.splitlines()
            if "not found" in line or "UNRESOLVED" in line or "FAILED" in line
        ]
        raise JarResolutionError(
            f"Could not resolve the {bundle.name} jars {', '.join(map(str, bundle.artifacts))} "
            f"from Maven Central.\n  "
            + "\n  ".join(problems[:10] or result.stdout.splitlines()[-10:])
            + f"\nTo provide them offline, copy the jars of these artifacts and their runtime "
            f"dependencies into {target} and create the empty file {target / COMPLETE_MARKER}."
        )
    (target / COMPLETE_MARKER).touch()
    return sorted(target.glob("*.jar"))


def spark_connector_jars(cache_dir: Path) -> list[Path]:
    """Jars to add to Spark for the Kafka source and Delta, minus those pyspark already ships."""
    check_pyspark_version()
    shipped = {_artifact_name(p) for p in pyspark_jars_dir().glob("*.jar")}
    return [p for p in resolve(SPARK_BUNDLE, cache_dir) if _artifact_name(p) not in shipped]


def check_pyspark_version() -> None:
    import pyspark

    if pyspark.__version__ != SPARK_VERSION:
        raise JarResolutionError(
            f"pyspark {pyspark.__version__} is installed but the connector jars are pinned to "
            f"Spark "
            f"{SPARK_VERSION}; install pyspark=={SPARK_VERSION} (pip install -e .[all])."
        )


def _artifact_name(jar: Path) -> str:
    """``kafka-clients-3.9.0.jar`` -> ``kafka-clients``."""
    parts = jar.stem.split("-")
    for i, part in enumerate(parts):
        if part[:1].isdigit():
            return "-".join(parts[:i])
    return jar.stem
