"""Spark's streaming source runner (the Python process that holds a query's `sparkeos.kafka` stream reader) ends
without a word when Spark hangs up on it.

Stopping a query interrupts its stream thread; when that thread is in a call to the runner, the interrupt closes the
runner's channel, and the JVM kills the runner a moment later. A runner that reads the end of its channel first
tries to report it on the closed channel and dies with two tracebacks on the driver's stderr. Whether it does depends
on which of the two wins, so here the test plays the JVM's end of the channel and makes the order certain: start the
real runner module, hand it the data source as Spark does, let the reader start, then close the channel.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from pyspark.serializers import UTF8Deserializer, read_int, write_int, write_with_length
from pyspark.worker_util import pickleSer

from sparkeos.spark.kafka.datasource import KafkaDataSource
from sparkeos.spark.source_runner import spark_hung_up

RUNNER_MODULE = "pyspark.sql.streaming.python_streaming_source_runner"
SCHEMA_JSON = '{"type":"struct","fields":[{"name":"value","type":"binary","nullable":true,"metadata":{}}]}'


def start_runner(tmp_path: Path, data_source) -> tuple[subprocess.Popen, socket.socket]:
    """The runner module started as Spark starts it, past its set-up: the reader is created and has answered."""
    secret = "sparkeos-test"
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.settimeout(60)
        env = {**os.environ, "PYTHON_WORKER_FACTORY_PORT": str(server.getsockname()[1]),
               "PYTHON_WORKER_FACTORY_SECRET": secret}
        runner = subprocess.Popen([sys.executable, "-m", RUNNER_MODULE], env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT)
        channel, _ = server.accept()
    channel.settimeout(60)
    stream = channel.makefile("rwb")
    assert UTF8Deserializer().loads(stream) == secret
    write_with_length(b"ok", stream)
    stream.flush()
    assert read_int(stream) == runner.pid
    write_with_length(f"{sys.version_info[0]}.{sys.version_info[1]}".encode(), stream)
    write_with_length(str(tmp_path).encode(), stream)  # SparkFiles' directory
    write_int(0, stream)  # no Python includes
    pickleSer._write_with_length(data_source, stream)
    write_with_length(SCHEMA_JSON.encode(), stream)
    write_int(10_000, stream)  # the largest Arrow batch
    stream.flush()
    assert read_int(stream) == 0, "the runner did not create the stream reader"
    stream.close()
    return runner, channel


@pytest.mark.parametrize("hang_up", ["close", "reset"])
def test_the_source_runner_ends_quietly_when_spark_closes_its_channel(tmp_path, hang_up):
    data_source = KafkaDataSource({"kafka.bootstrap.servers": "127.0.0.1:9", "subscribe": "events"})
    runner, channel = start_runner(tmp_path, data_source)
    if hang_up == "reset":
        channel.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    channel.close()
    output, _ = runner.communicate(timeout=60)
    assert runner.returncode != 0, "the runner must not look like it ended normally"
    assert b"Traceback" not in output, output.decode(errors="replace")


def test_the_source_runner_still_reports_its_own_failures(tmp_path):
    """Only Spark's hang-up goes unsaid: an error of the reader itself still reaches Spark, as before."""
    data_source = KafkaDataSource({"kafka.bootstrap.servers": "127.0.0.1:9", "subscribe": "events"})
    runner, channel = start_runner(tmp_path, data_source)
    stream = channel.makefile("rwb")
    write_int(999, stream)  # a call the runner does not know
    stream.flush()
    assert read_int(stream) == -2  # SpecialLengths.PYTHON_EXCEPTION_THROWN
    assert "Function call id not recognized" in UTF8Deserializer().loads(stream)
    stream.close()
    channel.close()
    runner.communicate(timeout=60)
    assert runner.returncode != 0


def chained(*errors: BaseException) -> BaseException:
    """The last of `errors`, raised while handling the one before it, and so on."""
    for cause, error in zip(errors, errors[1:], strict=False):
        error.__context__ = cause
    return errors[-1]


def test_only_the_channels_end_counts_as_spark_hanging_up():
    assert spark_hung_up(chained(EOFError(), BrokenPipeError(), SystemExit(-1), BrokenPipeError()))
    assert spark_hung_up(chained(ConnectionResetError(), BrokenPipeError()))
    assert not spark_hung_up(chained(RuntimeError("the reader failed"), BrokenPipeError()))
    assert not spark_hung_up(chained(EOFError(), ValueError("while reporting")))
    assert not spark_hung_up(ValueError("bad offsets"))
