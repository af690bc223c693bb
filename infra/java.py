"""Find Java and check that it is recent enough for Kafka 4 and Spark 4."""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess

from infra.errors import JavaError

log = logging.getLogger(__name__)

MIN_JAVA = 17


def java_executable() -> str:
    """Return the java binary, preferring ``$JAVA_HOME/bin/java``.

    Raises:
        JavaError: no java binary can be found.
    """
    java_home = os.environ.get("JAVA_HOME")
    if java_home:
        candidate = os.path.join(java_home, "bin", "java")
        if os.access(candidate, os.X_OK):
            return candidate
    found = shutil.which("java")
    if not found:
        raise JavaError(
            f"Java {MIN_JAVA}+ is required but no 'java' was found on PATH. Install a JDK "
            "(for example 'apt-get install openjdk-17-jre-headless') or set JAVA_HOME."
        )
    return found


def parse_java_major(version_output: str) -> int:
    """Extract the major version from ``java -version`` output (``1.8.0_x`` is 8)."""
    match = re.search(r'version "(\d+)(?:\.(\d+))?', version_output)
    if not match:
        raise JavaError(f"Cannot read the Java version from: {version_output.strip()[:200]!r}")
    major = int(match.group(1))
    if major == 1 and match.group(2):
        return int(match.group(2))
    return major


def check_java() -> str:
    """Return the java binary after checking it is at least Java 17.

    Raises:
        JavaError: java is missing or older than 17.
    """
    java = java_executable()
    result = subprocess.run([java, "-version"], capture_output=True, text=True, check=False)
    major = parse_java_major(result.stderr + result.stdout)
    if major < MIN_JAVA:
        raise JavaError(
            f"Java {MIN_JAVA}+ is required, found Java {major} at {java}. "
            "Install a newer JDK and put it first on PATH or point JAVA_HOME at it."
        )
    log.debug("using %s (Java %d)", java, major)
    return java
