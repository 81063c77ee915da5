"""A TCP port on 127.0.0.1 that nothing listens on when it is returned: for a server to start there, or for a client
that must find nothing there."""

from __future__ import annotations

import socket


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
