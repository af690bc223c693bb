"""Analysts' sign-in: scrypt password hashes, the user file, a throttle on failed attempts and
the idle time after which a sign-in ends.

The user file (``IOT_DASH_AUTH_FILE``) holds one ``name:hash`` line per analyst, made with
``iotfraud dashboard hash-password NAME``; blank lines and ``#`` comments are ignored. A hash reads
``scrypt$<n>$<r>$<p>$<salt>$<key>`` (base64 salt and key), so its cost can be raised later
without breaking the lines already written. The file holds no password, only these hashes.

Failed sign-ins are limited four ways within a window (``LoginThrottle``): one client with one
name, one client with any names (spraying one password over many names), one name from any
clients (guessing at one account from many places) and everything together (a bound on guesses
whatever their spread). A refused attempt is neither checked nor counted, so one client adds at
most ``max_failures`` to a name's count and ``client_max_failures`` to the total. Both must be
below the name and global limits, so that locking a name out, or everyone, takes several clients
at once, and an analyst who mistypes locks out only themselves, at their own client, for a while. A
success clears only its own client-and-name count: a password an attacker happens to know must
not reset the counts that limit their guessing at other accounts.

A client is its address (an IPv6 one by its /64 network, ``client_key``). Where the address is
unknown, as behind a proxy on the same host, it is the browser session, of which one person can
open many: then only the name and global limits bound their guesses.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import ipaddress
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


# Failures allowed within WINDOW_S: one client with one name, one client with any names, one name
# from any clients, and everything together.
WINDOW_S = 300.0
MAX_FAILURES = 5
CLIENT_MAX_FAILURES = 20
NAME_MAX_FAILURES = 20
GLOBAL_MAX_FAILURES = 100
# Most keys kept before the aged-out ones are dropped (many names or clients tried at once).
_MAX_KEYS = 10_000


class LoginThrottle:
    """Refuses sign-ins once the failures within ``window_s`` reach a limit (module docstring).

    Keyed by the name typed, known or not, so that being refused says nothing about whether the
    name exists. Shared by every session of the server process (hence the lock).
    """

    def __init__(
        self,
        *,
        max_failures: int = MAX_FAILURES,
        client_max_failures: int = CLIENT_MAX_FAILURES,
        name_max_failures: int = NAME_MAX_FAILURES,
        global_max_failures: int = GLOBAL_MAX_FAILURES,
        window_s: float = WINDOW_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not max_failures < name_max_failures:
            raise ValueError("max_failures must be below name_max_failures")
        if not client_max_failures < global_max_failures:
            raise ValueError("client_max_failures must be below global_max_failures")
        self._limits = (max_failures, client_max_failures, name_max_failures, global_max_failures)
        self.window_s = window_s
        self._clock = clock
        self._failures: dict[tuple[str, ...], list[float]] = {}
        self._lock = threading.Lock()

    @staticmethod
    def _keys(client: str, name: str) -> tuple[tuple[str, ...], ...]:
        # In the order of self._limits; the first item names the limit in refusals.
        return (("client and name", client, name), ("client", client), ("name", name), ("all",))

    def _recent(self, key: tuple[str, ...], now: float) -> list[float]:
        recent = [t for t in self._failures.get(key, []) if now - t < self.window_s]
        if recent:
            self._failures[key] = recent
        else:
            self._failures.pop(key, None)
        return recent

    def attempt(self, client: str, name: str) -> str | None:
        """The limit that refuses ``client`` signing in as ``name`` now, or None if none does.

        An attempt that is not refused counts as a failure at once, until ``succeeded``: sign-ins
        checked side by side cannot all pass a limit that only one of them had room under.
        """
        with self._lock:
            now = self._clock()
            keys = self._keys(client, name)
            for key, limit in zip(keys, self._limits, strict=True):
                if len(self._recent(key, now)) >= limit:
                    return key[0]
            for key in keys:
                self._failures.setdefault(key, []).append(now)
            if len(self._failures) > _MAX_KEYS:
                for other in list(self._failures):
                    self._recent(other, now)
            return None

    def succeeded(self, client: str, name: str) -> None:
        """The attempt was right: forget this client's failures with this name, and the attempt."""
        with self._lock:
            pair, *others = self._keys(client, name)
            self._failures.pop(pair, None)
            for key in others:
                times = self._failures.get(key)
                # The newest entry: this attempt's own, or one as recent (the count is the same).
                if times:
                    times.pop()
                if not times:
                    self._failures.pop(key, None)


def client_key(address: str | None, session: str) -> str:
    """Who the throttle counts: the client's address, else (address unknown) the ``session``.

    An IPv6 address counts as its /64 network, which one subscriber usually holds whole.
    """
    if address is None:
        return f"session {session}"
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


def idle_expired(last_active: float | None, now: float, idle_timeout_s: float) -> bool:
    """True if a session last active at ``last_active`` (a clock reading) has been idle for
    ``idle_timeout_s`` or more at ``now``; with no reading, True (nothing keeps it alive)."""
    return last_active is None or now - last_active >= idle_timeout_s
