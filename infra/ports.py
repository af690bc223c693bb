"""Port checks for the local stack."""

from __future__ import annotations

import socket

from infra.errors import PortInUseError


def port_is_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def require_free(host: str, port: int, what: str) -> None:
    """Raise a PortInUseError that names the port and the setting to change."""
    if not port_is_free(host, port):
        raise PortInUseError(
            f"Port {host}:{port} for the {what} is already in use. Stop the process that holds it "
            f"(e.g. 'ss -ltnp | grep :{port}') or choose another port with the IOT_STACK_ settings."
        )


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago (for tests and ad-hoc brokers)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port
