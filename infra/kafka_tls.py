"""TLS material of the local broker's SASL_SSL listener, made with the JDK's ``keytool``.

A throw-away CA signs the broker's certificate (valid for localhost, 127.0.0.1 and the broker's
host); clients trust the CA through ``ca.pem`` (librdkafka ``ssl.ca.location``, Java client
``ssl.truststore.type=PEM``). The CA's private key is deleted once it has signed, and the
broker's keystore password is random and kept beside the keystore, readable by the owner only.
Everything lives in the broker's state folder, which is never committed.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import secrets
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from infra.errors import BrokerStartError, JavaError

log = logging.getLogger(__name__)

VALIDITY_DAYS = "825"
_PASSWORD_VARIABLE = "IOT_KAFKA_KEYSTORE_PASSWORD"


@dataclass(frozen=True)
class TlsFiles:
    """Where the material of one broker lives."""

    folder: Path

    @property
    def ca_pem(self) -> Path:
        return self.folder / "ca.pem"

    @property
    def keystore(self) -> Path:
        return self.folder / "broker.p12"

    @property
    def password_file(self) -> Path:
        return self.folder / "keystore.password"

    @property
    def names_file(self) -> Path:
        return self.folder / "subject-alt-names"

    def keystore_password(self) -> str:
        return self.password_file.read_text().strip()


def subject_alt_names(host: str) -> str:
    """keytool's SAN extension value for the names a client may use to reach the broker."""
    names = ["localhost", "127.0.0.1"]
    if host not in names and host not in ("0.0.0.0", "::", ""):
        names.append(host)
    entries = []
    for name in names:
        try:
            ipaddress.ip_address(name)
            entries.append(f"ip:{name}")
        except ValueError:
            entries.append(f"dns:{name}")
    return ",".join(entries)


def keytool_executable(java: str) -> str:
    """The ``keytool`` beside ``java``, else the one on PATH."""
    beside = Path(java).resolve().with_name("keytool")
    if os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("keytool")
    if not found:
        raise JavaError(
            "The secured Kafka listener needs 'keytool' (part of every JDK and JRE) to make its "
            "TLS certificate, and none was found beside java or on PATH."
        )
    return found


def ensure_tls(folder: Path, java: str, host: str) -> TlsFiles:
    """The CA certificate and broker keystore in ``folder``, made now unless already there for
    the same names."""
    files = TlsFiles(folder)
    names = subject_alt_names(host)
    complete = all(p.exists() for p in (files.ca_pem, files.keystore, files.password_file))
    if complete and files.names_file.exists() and files.names_file.read_text() == names:
        return files
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True, mode=0o700)
    password = secrets.token_urlsafe(24)
    files.password_file.write_text(password)
    files.password_file.chmod(0o600)
    keytool = keytool_executable(java)
    ca_store, csr, signed = folder / "ca.p12", folder / "broker.csr", folder / "broker.pem"
    store = ["-storetype", "PKCS12", "-storepass:env", _PASSWORD_VARIABLE]
    key = ["-keyalg", "EC", "-groupname", "secp256r1", "-validity", VALIDITY_DAYS]
    steps = [
        ["-genkeypair", "-alias", "ca", *key, "-dname", "CN=iotfraud local Kafka CA",
         "-ext", "bc:c", "-keystore", str(ca_store), *store],
        ["-exportcert", "-rfc", "-alias", "ca", "-keystore", str(ca_store), *store,
         "-file", str(files.ca_pem)],
        ["-genkeypair", "-alias", "broker", *key, "-dname", "CN=localhost",
         "-keystore", str(files.keystore), *store],
        ["-certreq", "-alias", "broker", "-keystore", str(files.keystore), *store,
         "-file", str(csr)],
        ["-gencert", "-rfc", "-alias", "ca", "-keystore", str(ca_store), *store,
         "-infile", str(csr), "-outfile", str(signed), "-validity", VALIDITY_DAYS,
         "-ext", f"SAN={names}", "-ext", "KU=digitalSignature,keyEncipherment",
         "-ext", "EKU=serverAuth"],
        ["-importcert", "-noprompt", "-alias", "ca", "-file", str(files.ca_pem),
         "-keystore", str(files.keystore), *store],
        ["-importcert", "-noprompt", "-alias", "broker", "-file", str(signed),
         "-keystore", str(files.keystore), *store],
    ]  # fmt: skip
    env = {**os.environ, _PASSWORD_VARIABLE: password}
    for step in steps:
        result = subprocess.run(
            [keytool, *step], capture_output=True, text=True, env=env, check=False
        )
        if result.returncode != 0:
            raise BrokerStartError(
                f"Making the broker's TLS certificate failed at 'keytool {step[0]}':\n"
                f"{result.stdout}{result.stderr}"
            )
    for leftover in (ca_store, csr, signed):
        leftover.unlink()
    files.keystore.chmod(0o600)
    files.names_file.write_text(names)
    log.info("made a CA and the broker's TLS certificate (%s) in %s", names, folder)
    return files
