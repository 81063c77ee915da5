"""Failure injection for the crash tests: make a named step of the sink protocol fail once.

With `SPARKEOS_FAILPOINT_DIR` set (Spark's Python workers inherit it from the driver's environment),
a failpoint is armed by creating the file `<dir>/<name>`. The first process to reach that step renames
the file to `<name>.fired` (atomic, so exactly one process fires) and raises. Unarmed, `fire` costs one
environment lookup.
"""

from __future__ import annotations

import os

ENV = "SPARKEOS_FAILPOINT_DIR"


class InjectedFailure(RuntimeError):
    """Raised by an armed failpoint."""


def fire(name: str) -> None:
    directory = os.environ.get(ENV)
    if not directory:
        return
    armed = os.path.join(directory, name)
    try:
        os.rename(armed, armed + ".fired")
    except FileNotFoundError:
        return
    raise InjectedFailure(f"failpoint {name} fired")
