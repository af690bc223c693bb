"""Analysts' sign-in: password hashes, the user file and the throttle on failed attempts."""

from __future__ import annotations

from pathlib import Path

import pytest

from dashboard import auth

# Cheap cost parameters keep the tests fast; the format and the checks are the same.
FAST = {"n": 2**10, "r": 8, "p": 1}


def line(name: str, password: str) -> str:
    return f"{name}:{auth.hash_password(password, **FAST)}"


def test_a_hash_matches_its_password_only() -> None:
    encoded = auth.hash_password("correct horse", **FAST)
    parsed = auth.PasswordHash.parse(encoded)
    assert parsed.matches("correct horse")
    assert not parsed.matches("correct horse ")
    assert not parsed.matches("Correct horse")
    assert not parsed.matches("")
    assert parsed.encode() == encoded


def test_each_hash_has_its_own_salt() -> None:
    first, second = (auth.hash_password("same password", **FAST) for _ in range(2))
    assert first != second
    assert auth.PasswordHash.parse(first).salt != auth.PasswordHash.parse(second).salt


def test_default_cost_is_written_into_the_hash() -> None:
    encoded = auth.hash_password("correct horse")
    assert encoded.startswith(f"scrypt${2**15}$8$3$")
    assert auth.PasswordHash.parse(encoded).matches("correct horse")


def test_the_password_is_not_in_the_hash_or_its_repr() -> None:
    encoded = auth.hash_password("correct horse", **FAST)
    assert "correct" not in encoded
    assert "key=" not in repr(auth.PasswordHash.parse(encoded))


@pytest.mark.parametrize(
    "encoded",
    [
        "",
        "pbkdf2$1000$8$1$c2FsdHNhbHRzYWx0c2FsdA==$a2V5",
        "scrypt$x$8$1$c2FsdA==$a2V5",
        "scrypt$1000$8$1$c2FsdHNhbHRzYWx0c2FsdA==$" + "a" * 44,  # n not a power of two
        "scrypt$1048576000$8$1$c2FsdHNhbHRzYWx0c2FsdA==$" + "a" * 44,  # n too large
        "scrypt$1024$8$1$c2FsdA==$" + "a" * 44,  # salt too short
        "scrypt$1024$8$1$!!notbase64!!$" + "a" * 44,
    ],
)
def test_malformed_hashes_are_refused(encoded: str) -> None:
    with pytest.raises(ValueError):
        auth.PasswordHash.parse(encoded)


def test_user_file_lines_comments_and_blank_lines() -> None:
    text = "\n".join(
        [
            "# analysts of the fraud team",
            "",
            line("ana", "password-a"),
            "  ",
            line("kim", "pw-kim-2"),
        ]
    )
    users = auth.parse_users(text)
    assert sorted(users) == ["ana", "kim"]
    assert auth.authenticate(users, "ana", "password-a")
    assert auth.authenticate(users, "kim", "pw-kim-2")
    assert not auth.authenticate(users, "ana", "pw-kim-2")
    assert not auth.authenticate(users, "bob", "password-a")
    assert not auth.authenticate(users, "", "")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "lists no user"),
        ("# only a comment\n", "lists no user"),
        ("ana scrypt$1024$8$1$abc$def", "line 1: expected name:hash"),
        ("\nana:scrypt$1024$8$1$SECRETSALT$SECRETKEY", "line 2: the hash is not valid"),
        ("ana smith:{hash}", "line 1: the user name is not valid"),
        ("ana:{hash}\nana:{hash}", "line 2: user 'ana' is listed twice"),
    ],
)
def test_a_bad_user_file_names_the_line_not_its_content(text: str, message: str) -> None:
    text = text.format(hash=auth.hash_password("password-a", **FAST))
    with pytest.raises(auth.AuthFileError, match=message) as raised:
        auth.parse_users(text, source="users.txt")
    assert "SECRET" not in str(raised.value)


def test_read_users_reports_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(auth.AuthFileError, match=r"cannot read the user file .*missing"):
        auth.read_users(tmp_path / "missing")
    path = tmp_path / "users"
    path.write_text(line("ana", "password-a") + "\n")
    assert list(auth.read_users(path)) == ["ana"]


@pytest.mark.parametrize("name", ["ana", "ana.smith", "a_b-c", "ana@example.org", "x" * 64])
def test_valid_user_names(name: str) -> None:
    assert auth.check_name(name) == name


@pytest.mark.parametrize("name", ["", "ana smith", "ana:x", "x" * 65, "ana\n", "<b>ana</b>"])
def test_invalid_user_names(name: str) -> None:
    with pytest.raises(ValueError, match="user name"):
        auth.check_name(name)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_throttle_blocks_a_name_after_repeated_failures_for_a_while() -> None:
    clock = FakeClock()
    throttle = auth.LoginThrottle(max_failures=3, window_s=60, clock=clock)
    for _ in range(3):
        assert not throttle.blocked("ana")
        throttle.failed("ana")
    assert throttle.blocked("ana")
    assert not throttle.blocked("kim"), "other names are not affected"
    clock.now += 61
    assert not throttle.blocked("ana"), "failures age out of the window"


def test_throttle_treats_unknown_names_alike_and_forgets_after_success() -> None:
    throttle = auth.LoginThrottle(max_failures=2, window_s=60, clock=FakeClock())
    throttle.failed("nobody")
    throttle.failed("nobody")
    assert throttle.blocked("nobody")
    throttle.failed("ana")
    throttle.succeeded("ana")
    throttle.failed("ana")
    assert not throttle.blocked("ana")
