"""Failure injection for the crash tests and `sparkeos chaos`: make a named step of a protocol (a sink's, the
broker's log cleaner's) fail once, or stop there.

With `SPARKEOS_FAILPOINT_DIR` set (Spark's Python workers inherit it from the driver's environment),
a failpoint is armed by creating the file `<dir>/<name>`. The first process to reach that step renames
the file to `<name>.fired` (atomic, so exactly one process fires) and raises. A hold is armed by creating
`<dir>/<name>.hold`: the first process to reach the step renames it to `<name>.held-<pid>` and waits there
until that file is removed, so that a test can order steps of two processes. Unarmed, `fire` costs one
environment lookup.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

ENV = "SPARKEOS_FAILPOINT_DIR"
LONGEST_HOLD_S = 900  # a test that never releases its hold must not leave a process waiting for ever


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
        _hold(armed)
        return
    raise InjectedFailure(f"failpoint {name} fired")


def _hold(armed: str) -> None:
    held = f"{armed}.held-{os.getpid()}"
    try:
        os.rename(armed + ".hold", held)
    except FileNotFoundError:
        return
    deadline = time.monotonic() + LONGEST_HOLD_S
    while os.path.exists(held) and time.monotonic() < deadline:
        time.sleep(0.02)


def arm_hold(directory: Path, name: str) -> set[Path]:
    """Make the next process that reaches step `name` stop there; returns the holds taken so far, for `holds`."""
    directory.mkdir(parents=True, exist_ok=True)
    known = set(directory.glob(f"{name}.held-*"))
    (directory / f"{name}.hold").touch()
    return known


def holds(directory: Path, name: str) -> set[Path]:
    """The holds processes took at step `name`; removing one releases its process."""
    return set(directory.glob(f"{name}.held-*"))


def disarm_hold(directory: Path, name: str) -> None:
    """No process stops at step `name` any more (those holding there still do, until released)."""
    (directory / f"{name}.hold").unlink(missing_ok=True)
