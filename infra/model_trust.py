"""Which registered models the pipeline may load: those whose files match what was recorded.

Loading an MLflow pyfunc unpickles it, and unpickling runs code. So a registered version is
loaded only after its files, downloaded to a private folder, match the digest recorded in the
version's tag ``iotfraud.artifact_digest`` when it was registered (``iotfraud train``, or
``iotfraud models sign VERSION`` for a model registered some other way).

The trust boundary: without ``IOT_MODEL_SIGNING_KEY`` the digest is a plain SHA-256, which
catches files changed in the artifact store after registration, but whoever can write the
registry can also write the tag. With the key the digest is an HMAC: only a holder of the key can
make a version the pipeline loads, whatever else they can write.
"""

from __future__ import annotations

import hashlib
import hmac
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

DIGEST_TAG = "iotfraud.artifact_digest"
SHA256, HMAC_SHA256 = "sha256", "hmac-sha256"
# What loading a model from a local artifact store writes into the store's own folder, so not part
# of the model: MLflow's note of its name and version (``models:/`` URIs; nothing reads it back),
# and Python's bytecode cache beside the model's code (``mlflow models serve`` imports it from
# there). Left out of the digest; caches are deleted from the checked copy, so none runs.
MLFLOW_NOTE = "registered_model_meta"
BYTECODE_CACHE = "__pycache__"


class UntrustedModelError(Exception):
    """A registered version's files do not match its recorded digest; the message says why."""


def folder_digest(folder: Path, key: str | None = None) -> str:
    """``sha256:<hex>`` (or ``hmac-sha256:<hex>`` with ``key``) over every file below ``folder``
    but ``MLFLOW_NOTE`` and bytecode caches: its path relative to the folder and its bytes, in
    path order."""
    mac = hmac.new(key.encode(), digestmod="sha256") if key else hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        relative = path.relative_to(folder)
        if relative.as_posix() == MLFLOW_NOTE or BYTECODE_CACHE in relative.parts:
            continue
        name = relative.as_posix().encode()
        data = path.read_bytes()
        # Lengths first, so that no two different sets of files feed the same bytes.
        mac.update(f"{len(name)}:{len(data)}:".encode() + name + data)
    return f"{HMAC_SHA256 if key else SHA256}:{mac.hexdigest()}"


def check_digest(folder: Path, recorded: str | None, key: str | None, what: str) -> None:
    """Raise UntrustedModelError unless ``folder``'s files match ``recorded``.

    ``what`` names the version in the messages ("model iot-fraud version 3").
    """
    if not recorded:
        raise UntrustedModelError(
            f"{what} has no {DIGEST_TAG} tag: it was not registered by `iotfraud train` (or by an "
            "earlier release). Check its files, then run `iotfraud models sign VERSION`"
        )
    scheme = recorded.split(":", 1)[0]
    if scheme == HMAC_SHA256 and not key:
        raise UntrustedModelError(
            f"{what} was signed with a key and IOT_MODEL_SIGNING_KEY is not set here"
        )
    if scheme == SHA256 and key:
        raise UntrustedModelError(
            f"{what} carries a plain SHA-256 digest but IOT_MODEL_SIGNING_KEY is set: only "
            "versions signed with the key are loaded (`iotfraud models sign VERSION`)"
        )
    if scheme not in (SHA256, HMAC_SHA256):
        raise UntrustedModelError(f"{what} has a {DIGEST_TAG} of unknown kind {scheme!r}")
    if not hmac.compare_digest(folder_digest(folder, key if scheme == HMAC_SHA256 else None),
                               recorded):  # fmt: skip
        raise UntrustedModelError(
            f"the files of {what} do not match the digest recorded when it was registered: "
            "changed in the artifact store since, or signed with another key. Refused"
        )


def download_version(client: Any, name: str, version: str, folder: Path) -> Path:
    """The files of ``models:/name/version`` copied into ``folder``; returns their root."""
    import mlflow

    uri = client.get_model_version_download_uri(name, version)
    return Path(mlflow.artifacts.download_artifacts(artifact_uri=uri, dst_path=str(folder)))


def sign_version(client: Any, name: str, version: str, key: str | None) -> str:
    """Record the digest of a registered version's files in its tag; returns the digest."""
    with tempfile.TemporaryDirectory(prefix="iotfraud-model-") as tmp:
        digest = folder_digest(download_version(client, name, version, Path(tmp)), key)
    client.set_model_version_tag(name, version, DIGEST_TAG, digest)
    return digest


def load_trusted(client: Any, name: str, version: str, key: str | None) -> Any:
    """The pyfunc of ``name`` version ``version``, loaded from a private copy of its files only
    after they match its recorded digest.

    Raises:
        UntrustedModelError: no digest, or the files do not match it.
    """
    import mlflow

    what = f"model {name} version {version}"
    recorded = client.get_model_version(name, version).tags.get(DIGEST_TAG)
    with tempfile.TemporaryDirectory(prefix="iotfraud-model-") as tmp:
        local = download_version(client, name, version, Path(tmp))
        for cache in [p for p in local.rglob(BYTECODE_CACHE) if p.is_dir()]:
            shutil.rmtree(cache)  # only the checked source may run
        check_digest(local, recorded, key, what)
        # Loaded from the checked copy: the store may change while we load. Loading puts the
        # model's code folder first on sys.path; the copy is deleted on return, so take it off.
        path = list(sys.path)
        try:
            return mlflow.pyfunc.load_model(str(local))
        finally:
            sys.path[:] = path
