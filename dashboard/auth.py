"""Analysts' sign-in: scrypt password hashes, the user file, and a throttle on failed attempts.

The user file (``IOT_DASH_AUTH_FILE``) holds one ``name:hash`` line per analyst, made with
``iotfraud dashboard hash-password NAME``; blank lines and ``#`` comments are ignored. A hash reads
``scrypt$<n>$<r>$<p>$<salt>$<key>`` (base64 salt and key), so its cost can be raised later
without breaking the lines already written. The file holds no password, only these hashes.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import logging
import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

SCHEME = "scrypt"
# One of OWASP's equivalent minimums for scrypt (N=2^15, r=8, p=3): 32 MiB per check rather than
# the 128 MiB of N=2^17, p=1, so that sign-ins cannot exhaust a small server's memory.
DEFAULT_N = 2**15
DEFAULT_R = 8
DEFAULT_P = 3
SALT_BYTES = 16
KEY_BYTES = 32
MIN_PASSWORD_CHARS = 8
NAME_PATTERN = re.compile(r"[A-Za-z0-9._@+-]{1,64}")
HINT = "make lines with: iotfraud dashboard hash-password NAME >> FILE"


class AuthFileError(ValueError):
    """The user file is missing, empty or malformed; the message says what to fix."""


@dataclass(frozen=True)
class PasswordHash:
    """A scrypt hash of one password with its own salt and cost parameters."""

    n: int
    r: int
    p: int
    salt: bytes
    key: bytes = field(repr=False)

    def encode(self) -> str:
        salt = base64.b64encode(self.salt).decode()
        key = base64.b64encode(self.key).decode()
        return f"{SCHEME}${self.n}${self.r}${self.p}${salt}${key}"

    @classmethod
    def parse(cls, text: str) -> PasswordHash:
        """Read ``scrypt$n$r$p$salt$key``; ValueError (without the text) if it is not one."""
        parts = text.split("$")
        if len(parts) != 6 or parts[0] != SCHEME:
            raise ValueError(f"not a {SCHEME}$n$r$p$salt$key hash")
        try:
            n, r, p = (int(part) for part in parts[1:4])
            salt = base64.b64decode(parts[4], validate=True)
            key = base64.b64decode(parts[5], validate=True)
        except (ValueError, binascii.Error):
            raise ValueError(
                "a cost parameter is not a number or the salt/key is not base64"
            ) from None
        # Bounds keep one verification affordable whatever the file says.
        if n < 2**10 or n > 2**20 or n & (n - 1) or not 1 <= r <= 32 or not 1 <= p <= 16:
            raise ValueError(f"cost parameters out of range (n={n}, r={r}, p={p})")
        if len(salt) < SALT_BYTES or len(key) < KEY_BYTES:
            raise ValueError("salt or key too short")
        return cls(n=n, r=r, p=p, salt=salt, key=key)

    def matches(self, password: str) -> bool:
        derived = _scrypt(password, self.salt, n=self.n, r=self.r, p=self.p, length=len(self.key))
        return hmac.compare_digest(derived, self.key)


def _scrypt(password: str, salt: bytes, *, n: int, r: int, p: int, length: int) -> bytes:
    return hashlib.scrypt(
        password.encode(), salt=salt, n=n, r=r, p=p, maxmem=256 * n * r, dklen=length
    )


def hash_password(
    password: str, *, n: int = DEFAULT_N, r: int = DEFAULT_R, p: int = DEFAULT_P
) -> str:
    """The encoded hash of ``password`` with a fresh random salt."""
    salt = os.urandom(SALT_BYTES)
    key = _scrypt(password, salt, n=n, r=r, p=p, length=KEY_BYTES)
    return PasswordHash(n=n, r=r, p=p, salt=salt, key=key).encode()


def check_name(name: str) -> str:
    """``name`` if it can be a user name (1-64 letters, digits, ``._@+-``), else ValueError."""
    if not NAME_PATTERN.fullmatch(name):
        raise ValueError(
            f"user name {name!r} must be 1 to 64 letters, digits or . _ @ + - (no spaces or colons)"
        )
    return name


def parse_users(text: str, source: str = "the user file") -> dict[str, PasswordHash]:
    """The ``name:hash`` lines of a user file, by name; AuthFileError on any bad line.

    Messages name the line but never repeat its content (a hash is still worth keeping private).
    """
    users: dict[str, PasswordHash] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, encoded = line.partition(":")
        where = f"{source}, line {number}"
        if not sep:
            raise AuthFileError(f"{where}: expected name:hash ({HINT})")
        try:
            check_name(name)
        except ValueError:
            raise AuthFileError(f"{where}: the user name is not valid") from None
        if name in users:
            raise AuthFileError(f"{where}: user {name!r} is listed twice")
        try:
            users[name] = PasswordHash.parse(encoded)
        except ValueError as exc:
            raise AuthFileError(f"{where}: the hash is not valid: {exc} ({HINT})") from None
    if not users:
        raise AuthFileError(f"{source} lists no user ({HINT})")
    return users


def read_users(path: Path) -> dict[str, PasswordHash]:
    """Parse the user file at ``path``; AuthFileError if it cannot be read or is not valid."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise AuthFileError(f"cannot read the user file {path}: {reason}") from None
    return parse_users(text, source=str(path))


# Checked when the name is unknown, so that a wrong name costs as long as a wrong password.
_UNKNOWN = PasswordHash(
    n=DEFAULT_N, r=DEFAULT_R, p=DEFAULT_P, salt=os.urandom(SALT_BYTES), key=os.urandom(KEY_BYTES)
)


def authenticate(users: dict[str, PasswordHash], name: str, password: str) -> bool:
    """True if ``name`` is a user and ``password`` is theirs; as slow either way."""
    known = users.get(name)
    matched = (known or _UNKNOWN).matches(password)
    return matched and known is not None


class LoginThrottle:
    """Refuses sign-ins for a user name after ``max_failures`` failures within ``window_s``.

    Keyed by the name typed, known or not, so that being refused says nothing about whether the
    name exists. Shared by every session of the server process (hence the lock).
    """

    def __init__(
        self,
        max_failures: int = 5,
        window_s: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_failures = max_failures
        self.window_s = window_s
        self._clock = clock
        self._failures: dict[str, list[float]] = {}
        self._lock = threading.Lock()

    def _recent(self, name: str, now: float) -> list[float]:
        recent = [t for t in self._failures.get(name, []) if now - t < self.window_s]
        if recent:
            self._failures[name] = recent
        else:
            self._failures.pop(name, None)
        return recent

    def blocked(self, name: str) -> bool:
        with self._lock:
            return len(self._recent(name, self._clock())) >= self.max_failures

    def failed(self, name: str) -> None:
        with self._lock:
            now = self._clock()
            self._failures[name] = [*self._recent(name, now), now]
            if len(self._failures) > 10_000:
                # Many names tried at once: forget the ones whose failures have aged out.
                for other in list(self._failures):
                    self._recent(other, now)

    def succeeded(self, name: str) -> None:
        with self._lock:
            self._failures.pop(name, None)
