"""Loopback ports for servers the tests start (the API emulator, the operator's probes, Prometheus)."""

from __future__ import annotations

import socket

HOST = "127.0.0.1"


def free_port(host: str = HOST) -> int:
    """A TCP port that was free on `host` a moment ago (the kernel picks it; loopback only)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])
