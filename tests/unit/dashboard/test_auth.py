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


def fail(throttle: auth.LoginThrottle, client: str, name: str, times: int = 1) -> None:
    """``times`` failed sign-ins that the throttle lets through."""
    for _ in range(times):
        assert throttle.attempt(client, name) is None


def test_throttle_refuses_a_client_with_a_name_after_repeated_failures_for_a_while() -> None:
    clock = FakeClock()
    throttle = auth.LoginThrottle(max_failures=3, window_s=60, clock=clock)
    fail(throttle, "10.0.0.1", "ana", times=3)
    assert throttle.attempt("10.0.0.1", "ana") == "client and name"
    assert throttle.attempt("10.0.0.1", "kim") is None, "other names are not affected"
    clock.now += 61
    assert throttle.attempt("10.0.0.1", "ana") is None, "failures age out of the window"


def test_one_client_cannot_lock_a_name_out_for_everyone() -> None:
    throttle = auth.LoginThrottle(max_failures=3, name_max_failures=10, clock=FakeClock())
    fail(throttle, "10.0.0.66", "ana", times=3)
    # Refused attempts are not checked, so they add nothing to the name's count.
    for _ in range(50):
        assert throttle.attempt("10.0.0.66", "ana") == "client and name"
    assert throttle.attempt("10.0.0.1", "ana") is None, "the analyst at their own client"


def test_spraying_one_client_over_many_names_is_refused() -> None:
    clock = FakeClock()
    throttle = auth.LoginThrottle(client_max_failures=4, window_s=60, clock=clock)
    for name in ("ana", "kim", "bob", "eve"):
        fail(throttle, "10.0.0.66", name)
    assert throttle.attempt("10.0.0.66", "zoe") == "client"
    assert throttle.attempt("10.0.0.66", "ana") == "client"
    assert throttle.attempt("10.0.0.1", "zoe") is None, "other clients are not affected"
    clock.now += 61
    assert throttle.attempt("10.0.0.66", "zoe") is None


def test_failures_at_one_name_from_many_clients_lock_that_name() -> None:
    throttle = auth.LoginThrottle(max_failures=2, name_max_failures=6, clock=FakeClock())
    for client in ("10.0.0.1", "10.0.0.2", "10.0.0.3"):
        fail(throttle, client, "ana", times=2)
    assert throttle.attempt("10.0.0.4", "ana") == "name"
    assert throttle.attempt("10.0.0.4", "kim") is None


def test_failures_everywhere_lock_every_sign_in_until_the_window_passes() -> None:
    clock = FakeClock()
    throttle = auth.LoginThrottle(
        client_max_failures=3, global_max_failures=9, window_s=60, clock=clock
    )
    for client in ("10.0.0.1", "10.0.0.2", "10.0.0.3"):
        for name in ("ana", "kim", "bob"):
            fail(throttle, client, name)
    assert throttle.attempt("10.0.0.4", "zoe") == "all"
    clock.now += 61
    assert throttle.attempt("10.0.0.4", "zoe") is None


def test_success_forgets_its_client_and_name_only() -> None:
    throttle = auth.LoginThrottle(
        max_failures=3, client_max_failures=5, name_max_failures=6, clock=FakeClock()
    )
    fail(throttle, "10.0.0.1", "ana", times=2)
    fail(throttle, "10.0.0.1", "kim", times=2)
    fail(throttle, "10.0.0.2", "ana", times=3)
    assert throttle.attempt("10.0.0.1", "ana") is None
    throttle.succeeded("10.0.0.1", "ana")
    # The analyst's own mistakes are forgotten...
    fail(throttle, "10.0.0.1", "ana")
    # ...but not the client's failures with other names (its 5th is the one just made)...
    assert throttle.attempt("10.0.0.1", "bob") == "client"
    # ...nor the name's, other clients' among them (6 now).
    assert throttle.attempt("10.0.0.3", "ana") == "name"


def test_a_sign_in_counts_as_failed_until_it_succeeds() -> None:
    throttle = auth.LoginThrottle(max_failures=2, clock=FakeClock())
    # Two checks under way side by side from one client: a third must wait for them.
    assert throttle.attempt("10.0.0.1", "ana") is None
    assert throttle.attempt("10.0.0.1", "ana") is None
    assert throttle.attempt("10.0.0.1", "ana") == "client and name"
    throttle.succeeded("10.0.0.1", "ana")
    assert throttle.attempt("10.0.0.1", "ana") is None


@pytest.mark.parametrize(
    "limits",
    [
        {"max_failures": 5, "name_max_failures": 5},
        {"client_max_failures": 20, "global_max_failures": 20},
    ],
)
def test_limits_that_let_one_client_lock_others_out_are_refused(limits: dict[str, int]) -> None:
    with pytest.raises(ValueError, match="must be below"):
        auth.LoginThrottle(**limits)


@pytest.mark.parametrize(
    ("address", "key"),
    [
        ("203.0.113.7", "203.0.113.7"),
        ("2001:db8:1:2:a:b:c:d", "2001:db8:1:2::/64"),
        ("2001:db8:1:2::ffff", "2001:db8:1:2::/64"),
        ("::ffff:203.0.113.7", "203.0.113.7"),
        (None, "session s1"),
    ],
)
def test_client_key_is_the_address_its_ipv6_network_or_the_session(
    address: str | None, key: str
) -> None:
    assert auth.client_key(address, "s1") == key


@pytest.mark.parametrize(
    ("last_active", "now", "expired"),
    [
        (1000.0, 1000.0, False),
        (1000.0, 1000.0 + 1799, False),
        (1000.0, 1000.0 + 1800, True),
        (1000.0, 1000.0 + 86_400, True),
        (None, 1000.0, True),
    ],
)
def test_a_session_expires_after_the_idle_time(
    last_active: float | None, now: float, expired: bool
) -> None:
    assert auth.idle_expired(last_active, now, idle_timeout_s=1800) is expired
