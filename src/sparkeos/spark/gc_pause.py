"""Pausing Python's cyclic garbage collector while a task moves records.

A task's hot loop holds thousands of GC-tracked objects at once (a client's messages, a sink's message dicts)
and creates no reference cycles: reference counting frees all of it. The cyclic collector still runs a full
pass over every tracked object of the worker (tens of thousands once pyspark's worker modules are loaded) each
time enough of them survive younger passes, and those passes took a large share of a read's CPU time. Paused,
nothing is left for the collector to find, and the first allocations after the loop run it as usual.

In a Spark Python worker, the first pause also freezes (gc.freeze) the objects the worker holds at that moment:
its modules, pyspark's, and their state, which live as long as the worker does (and those of its first task,
left to reference counting alone). pyspark's daemon makes a full collection after every task a worker runs,
over all of them; once they are frozen, it has only a few objects left to look at.

The same holds for the Python workers that run a streaming sink's driver-side calls (its `streamWriter()` and
`commit()`, twice per micro-batch): they come from the same daemon, which collects after each call, on the
critical path of every batch. `freeze_planner_worker_once` freezes them at their first call.
"""

from __future__ import annotations

import gc
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from pyspark import TaskContext

_lock = threading.Lock()
_pauses = 0
_was_enabled = False
_worker_frozen = False


@contextmanager
def cyclic_gc_paused() -> Iterator[None]:
    """Disable the cyclic collector inside the block; nested or concurrent blocks restore it after the last one."""
    global _pauses, _was_enabled
    with _lock:
        _freeze_the_worker_once()
        if _pauses == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _pauses += 1
    try:
        yield
    finally:
        with _lock:
            _pauses -= 1
            if _pauses == 0 and _was_enabled:
                gc.enable()


def _freeze_the_worker_once() -> None:
    global _worker_frozen
    # Only in a task: on the driver these are the user's objects, and not ours to keep from the collector.
    if not _worker_frozen and TaskContext.get() is not None:
        gc.freeze()
        _worker_frozen = True


# Set by Spark for its Python workers (and their daemon); never in the user's driver process.
_SPARK_WORKER_VARIABLE = "PYTHON_WORKER_FACTORY_SECRET"


def freeze_planner_worker_once() -> None:
    """In a Spark Python worker that runs a data source's driver-side calls, freeze what it holds at the first."""
    global _worker_frozen
    with _lock:
        if not _worker_frozen and _SPARK_WORKER_VARIABLE in os.environ:
            gc.freeze()
            _worker_frozen = True
