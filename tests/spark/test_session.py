"""sparkeos.spark.session: what the driver prints when the JVM closes its accumulator connection."""

from __future__ import annotations

import socket
import struct
import types

from pyspark.accumulators import _start_update_server

from sparkeos.spark import quiet_closed_accumulator_connections


def connect(server) -> socket.socket:  # noqa: ANN001 - PySpark's accumulator server
    connection = socket.socket(server.address_family, socket.SOCK_STREAM)
    connection.connect(server.server_address)
    return connection


def send_no_updates(server) -> None:  # noqa: ANN001
    """What the JVM sends: the token, then a count of updates (here none); the server answers with one byte once it
    handled it. The server handles one connection at a time, so the answer also means earlier ones are done."""
    with connect(server) as connection:
        connection.settimeout(30)
        connection.sendall(server.auth_token.encode() + struct.pack("!i", 0))
        assert connection.recv(1) == b"\x01"


def test_a_closed_accumulator_connection_prints_no_traceback_and_other_errors_still_do(capfd):
    """PySpark's own accumulator server, as a SparkContext starts it (the session's is busy with its JVM's one
    connection, and serves one connection at a time)."""
    server = _start_update_server("token-of-the-test", is_unix_domain_sock=False)
    try:
        quiet_closed_accumulator_connections(types.SimpleNamespace(_accumulatorServer=server))
        capfd.readouterr()
        with connect(server) as connection:
            connection.sendall(server.auth_token.encode())
        send_no_updates(server)
        assert "Traceback" not in capfd.readouterr().err

        with connect(server) as connection:
            connection.sendall(b"x" * len(server.auth_token))
        send_no_updates(server)
        err = capfd.readouterr().err
        assert "Traceback" in err and "is not correct" in err
    finally:
        server.shutdown()
        server.server_close()


def test_sessions_get_the_quiet_server(spark):
    handle_error = spark.sparkContext._accumulatorServer.handle_error
    assert handle_error.__qualname__.startswith(quiet_closed_accumulator_connections.__name__)
