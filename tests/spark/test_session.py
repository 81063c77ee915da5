"""sparkeos.spark.session: what the driver prints when the JVM closes its accumulator connection."""

from __future__ import annotations

import socket
import struct


def connect(server) -> socket.socket:  # noqa: ANN001 - PySpark's accumulator server
    connection = socket.socket(server.address_family, socket.SOCK_STREAM)
    connection.connect(server.server_address)
    return connection


def send_no_updates(server) -> None:  # noqa: ANN001
    """What the JVM sends: the token, then a count of updates (here none); the server answers with one byte once it
    handled it. The server handles one connection at a time, so the answer also means earlier ones are done."""
    with connect(server) as connection:
        connection.sendall((server.auth_token or "").encode() + struct.pack("!i", 0))
        assert connection.recv(1) == b"\x01"


def test_a_closed_accumulator_connection_prints_no_traceback_and_other_errors_still_do(spark, capfd):
    server = spark.sparkContext._accumulatorServer
    capfd.readouterr()
    with connect(server) as connection:
        connection.sendall((server.auth_token or "").encode())
    send_no_updates(server)
    assert "Traceback" not in capfd.readouterr().err

    if server.auth_token is not None:
        with connect(server) as connection:
            connection.sendall(b"x" * len(server.auth_token))
        send_no_updates(server)
        err = capfd.readouterr().err
        assert "Traceback" in err and "is not correct" in err
