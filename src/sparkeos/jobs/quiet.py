"""What `sparkeos run` and `sparkeos demo` print: their own log lines at the level asked, and not the chatter of
the parts they are built on.

- librdkafka writes its log lines (`%6|1795717574.916|BGQUEUE|rdkafka#producer-1| ...`) straight to stderr, from
  every client, at its default level 6 (informational). Every client the commands create, and every client of the
  jobs' `sparkeos.kafka` sources and sinks (through the option `kafka.log_level`), gets the level that matches the
  level asked: librdkafka's informational and notice lines describe a client's internals and show at DEBUG only.
- Third-party packages warn about their own dependencies' deprecations (authlib about httpx, on every import of
  confluent-kafka's schema registry client): not the user's to act on. The commands drop DeprecationWarning,
  PendingDeprecationWarning and FutureWarning raised outside sparkeos.
- Spark's driver JVM prints its log4j set-up and start-up warnings before any level can be set: the driver gets a
  log4j2 configuration at ERROR, the level `spark.log.level` (default ERROR, changeable like any Spark setting)
  keeps once the SparkContext runs.
- Java itself prints "WARNING: Using incubator modules: jdk.incubator.vector" for the module Spark's launcher adds,
  and nothing turns that off: `sparkeos run` drops that line from its driver's stderr.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import sys
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import sparkeos

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# librdkafka's levels are syslog's: 7 debug, 6 info, 5 notice, 4 warning, 3 error.
LIBRDKAFKA_LEVELS = {"DEBUG": 7, "INFO": 4, "WARNING": 4, "ERROR": 3}
KAFKA_LOG_LEVEL_OPTION = "kafka.log_level"
THIRD_PARTY_WARNINGS = (DeprecationWarning, PendingDeprecationWarning, FutureWarning)
# Lines of a driver's stderr that no setting can turn off.
DROPPED_LINES = re.compile(rb"^WARNING: Using incubator modules: ")

LOG4J2_CONFIG = """\
# Written by sparkeos for the Spark drivers it starts: log at ERROR from the start; spark.log.level (default
# ERROR) sets the level once the SparkContext runs.
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{yy/MM/dd HH:mm:ss} %p %c{1}: %m%n%ex
# PySpark's gateway sets up logging as Spark's shells do, at WARN, unless its logger has a level of its own.
logger.gateway.name = org.apache.spark.api.python.PythonGatewayServer
logger.gateway.level = error
"""


def check_log_level(text: str) -> str:
    level = text.strip().upper()
    if level not in LOG_LEVELS:
        raise ValueError(f"log level must be one of {', '.join(LOG_LEVELS)}, not {text!r}")
    return level


def setup_logging(level: str) -> None:
    """sparkeos's loggers at `level`; other packages' (py4j's connection notices and the like) at WARNING, unless
    DEBUG is asked."""
    level = check_log_level(level)
    third_party = level if level == "DEBUG" else max(logging.getLevelName(level), logging.WARNING)
    logging.basicConfig(level=third_party, stream=sys.stderr, format=LOG_FORMAT)
    logging.getLogger("sparkeos").setLevel(level)


def librdkafka_log_level(level: str) -> int:
    return LIBRDKAFKA_LEVELS[check_log_level(level)]


def with_kafka_log_level(options: dict[str, str], level: str) -> dict[str, str]:
    """Source or sink options with `kafka.log_level` for `level`, unless they set it themselves."""
    if any(key.lower() == KAFKA_LOG_LEVEL_OPTION for key in options):
        return dict(options)
    return {**options, KAFKA_LOG_LEVEL_OPTION: str(librdkafka_log_level(level))}


def quiet_third_party_warnings() -> None:
    """Drop deprecation and future warnings that packages other than sparkeos raise.

    Filters alone do not do it: authlib puts an "always" filter for its own deprecation warning in front of every
    other filter when it is imported. The check is therefore made where a warning is shown."""
    package = str(Path(sparkeos.__file__).resolve().parent) + os.sep
    for category in THIRD_PARTY_WARNINGS:
        warnings.filterwarnings("ignore", category=category, module=r"(?!sparkeos(\.|$))")
    shown = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):  # noqa: ANN001 - warnings' own signature
        if issubclass(category, THIRD_PARTY_WARNINGS) and not os.path.realpath(filename).startswith(package):
            return
        shown(message, category, filename, lineno, file, line)

    warnings.showwarning = show


def log4j2_config() -> Path | None:
    """The log4j2 configuration for drivers, written once to the user's cache directory; None where it cannot be."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "sparkeos"
    path = cache / f"log4j2-{hashlib.sha256(LOG4J2_CONFIG.encode()).hexdigest()[:16]}.properties"
    try:
        if path.is_file() and path.read_text() == LOG4J2_CONFIG:
            return path
        cache.mkdir(parents=True, exist_ok=True, mode=0o700)
        partial = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        partial.write_text(LOG4J2_CONFIG)
        os.replace(partial, path)
    except OSError:
        return None
    return path


def with_quiet_jvm_start(settings: dict[str, str]) -> dict[str, str]:
    """Spark settings whose driver JVM starts with the log4j2 configuration above, unless they name one of their own
    (in spark.driver.extraJavaOptions, to which it is added)."""
    java_options = settings.get("spark.driver.extraJavaOptions", "")
    config = log4j2_config()
    if config is None or "log4j2.configurationFile" in java_options or "log4j.configurationFile" in java_options:
        return dict(settings)
    option = f"-Dlog4j2.configurationFile={config}"
    return {**settings, "spark.driver.extraJavaOptions": f"{java_options} {option}".strip()}


def pump_stderr(source: BinaryIO, target: BinaryIO | None = None) -> threading.Thread:
    """Copy a child's stderr to ours, line by line, without the lines nothing else can turn off."""
    target = target or sys.stderr.buffer

    def copy() -> None:
        with source:
            for line in iter(source.readline, b""):
                if DROPPED_LINES.match(line):
                    continue
                with contextlib.suppress(OSError, ValueError):
                    target.write(line)
                    target.flush()

    thread = threading.Thread(target=copy, name="sparkeos-driver-stderr", daemon=True)
    thread.start()
    return thread


@contextlib.contextmanager
def children_stderr_to(path: Path) -> Iterator[None]:
    """Child processes started inside the block (a SparkSession's JVM and its Python workers) write their stderr to
    `path` for their whole life; this process's own stderr is back to the terminal after the block."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(path, "ab") as log:
            os.dup2(log.fileno(), 2)
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
