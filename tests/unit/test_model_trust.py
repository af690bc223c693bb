"""The digest over a model's files (infra.model_trust): any change to the files changes it, and
a digest is accepted only in the way it was made."""

from __future__ import annotations

from pathlib import Path

import pytest

from infra.model_trust import UntrustedModelError, check_digest, folder_digest


@pytest.fixture
def model(tmp_path: Path) -> Path:
    folder = tmp_path / "model"
    (folder / "artifacts").mkdir(parents=True)
    (folder / "MLmodel").write_text("flavors: {}\n")
    (folder / "artifacts" / "detector.pkl").write_bytes(b"\x80\x04pickled")
    return folder


def test_every_change_to_the_files_changes_the_digest(model: Path) -> None:
    before = folder_digest(model)
    assert before.startswith("sha256:") and folder_digest(model) == before
    changes = [
        lambda: (model / "artifacts" / "detector.pkl").write_bytes(b"\x80\x04pickleD"),
        lambda: (model / "extra.py").write_text("import os"),
        lambda: (model / "MLmodel").rename(model / "MLmodeL"),
        # The same bytes split differently between two files.
        lambda: (model / "MLmodeL").write_text("flavors: {}\n\x80\x04pickled"),
    ]
    seen = {before}
    for change in changes:
        change()
        digest = folder_digest(model)
        assert digest not in seen
        seen.add(digest)


def test_a_keyed_digest_needs_the_same_key(model: Path) -> None:
    signed = folder_digest(model, "key-one")
    assert signed.startswith("hmac-sha256:") and signed != folder_digest(model, "key-two")
    check_digest(model, signed, "key-one", "model m version 1")
    with pytest.raises(UntrustedModelError, match="do not match"):
        check_digest(model, signed, "key-two", "model m version 1")
    with pytest.raises(UntrustedModelError, match="IOT_MODEL_SIGNING_KEY is not set"):
        check_digest(model, signed, None, "model m version 1")


def test_with_a_key_set_a_plain_digest_is_refused(model: Path) -> None:
    plain = folder_digest(model)
    check_digest(model, plain, None, "model m version 1")
    # Anyone can compute a plain digest: with a key, only signed versions load.
    with pytest.raises(UntrustedModelError, match="plain SHA-256"):
        check_digest(model, plain, "key-one", "model m version 1")


@pytest.mark.parametrize("recorded", [None, ""])
def test_no_digest_is_refused_with_the_command_that_records_one(
    model: Path, recorded: str | None
) -> None:
    with pytest.raises(UntrustedModelError, match=r"model m version 3 has no .*models sign"):
        check_digest(model, recorded, None, "model m version 3")


def test_a_changed_file_is_refused(model: Path) -> None:
    recorded = folder_digest(model)
    (model / "artifacts" / "detector.pkl").write_bytes(b"\x80\x04 anything else")
    with pytest.raises(UntrustedModelError, match="model m version 1 do not match"):
        check_digest(model, recorded, None, "model m version 1")


def test_what_loading_from_a_local_store_writes_there_leaves_the_digest_as_it_was(
    model: Path,
) -> None:
    before = folder_digest(model)
    # MLflow's note of the name and version, and Python's cache of the model's code imported
    # from the store (`mlflow models serve -m models:/...` on a local store writes both).
    (model / "registered_model_meta").write_text("model_name: m\nmodel_version: '1'\n")
    cache = model / "code" / "models" / "__pycache__"
    cache.mkdir(parents=True)
    (cache / "pyfunc.cpython-311.pyc").write_bytes(b"compiled")
    assert folder_digest(model) == before
    # Anything else is part of the model, compiled code outside a cache included.
    (model / "code" / "models" / "pyfunc.pyc").write_bytes(b"compiled")
    assert folder_digest(model) != before
