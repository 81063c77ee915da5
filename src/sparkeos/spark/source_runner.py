"""Spark's streaming source runner ends without a traceback when Spark hangs up on it.

A streaming query's Python stream reader lives in a process of its own, Spark's source runner, which answers the
query's calls (latest offset, partitions, commit) over a channel to the JVM. Stopping a query interrupts its stream
thread; an interrupt that lands while that thread uses the channel closes it, and the JVM kills the runner only a
moment later, when it stops its sources. A runner that reads the end of the channel first reports the error on the
channel it has just lost and dies of that, printing two or three tracebacks that the JVM copies to the driver's
stderr: after a clean stop, on the terminal of `sparkeos run` or of a user's own script, as though the query had
failed. Nothing is left to tell: the JVM no longer listens, and whatever the query needed it has already been told.

So in that process, an uncaught exception made only of the channel's end (EOFError, a broken or reset connection,
and the exit the runner attempts on the way) ends it silently, with a non-zero status as before. Anything else
(an error of the reader, even if reporting it failed too) is printed as Python prints it.
"""

from __future__ import annotations

import sys
from types import TracebackType

RUNNER_MODULE = "pyspark.sql.streaming.python_streaming_source_runner"
_HANG_UP = (EOFError, ConnectionError)


def quiet_when_spark_hangs_up() -> None:
    """Install the hook in Spark's source runner process; anywhere else (a planner, an executor, a driver), nothing."""
    main_spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if main_spec is None or main_spec.name != RUNNER_MODULE or getattr(sys.excepthook, "spark_hang_up", False):
        return
    previous = sys.excepthook

    def excepthook(kind: type[BaseException], error: BaseException, trace: TracebackType | None) -> None:
        if not spark_hung_up(error):
            previous(kind, error, trace)

    excepthook.spark_hang_up = True  # type: ignore[attr-defined]
    sys.excepthook = excepthook


def spark_hung_up(error: BaseException | None) -> bool:
    """Whether `error` and every exception it happened in the handling of come from the channel's end."""
    chain = []
    while error is not None:
        chain.append(error)
        error = error.__context__
    return bool(chain) and isinstance(chain[-1], _HANG_UP) and all(
        isinstance(link, (*_HANG_UP, SystemExit)) for link in chain)
