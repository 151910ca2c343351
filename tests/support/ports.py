"""A TCP port nothing on this machine listens on now, for a test's own rendezvous or daemon."""

from __future__ import annotations

import socket


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
