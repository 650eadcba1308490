"""A free loopback TCP port for a test's own listener (bind(0): the kernel's pick, released at once)."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]
