"""A reader watching the job's output all through the run: the view its sink's data source gives of the store
(``visible_records``), read again and again, the last time after the clean stop. A record a reader saw must stay
visible: one that vanishes was of an attempt not committed yet, of one later aborted, or a copy taken back, and the
audit at the end, which sees only what is left, cannot tell."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from ..spark.reader_view import OutputUnavailable

WATCH_INTERVAL_S = 0.5
SAMPLES = 5


@dataclass
class WatchReport:
    reads: int = 0
    unavailable: int = 0  # reads the store did not answer: a fault of the run's, not the sink's
    vanished: int = 0  # records a read saw that the next read did not
    samples: list[str] = field(default_factory=list)  # of vanished records
    failed: int = 0  # reads that failed for another reason than the store being away
    failures: list[str] = field(default_factory=list)

    @property
    def problems(self) -> list[str]:
        found = []
        if self.vanished:
            found.append(f"a reader watching the output saw {self.vanished} records vanish, e.g. {self.samples[0]}")
        if self.failed:
            found.append(f"a reader watching the output saw {self.failed} reads fail, e.g. {self.failures[0]}")
        return found

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class OutputWatcher(threading.Thread):
    """Calls `read` (the records a reader sees now, or None when the store's view is not watched) until stopped;
    `clock` gives the run's seconds, for the samples."""

    def __init__(self, read: Callable[[], Counter[str] | None], clock: Callable[[], float]):
        super().__init__(name="chaos-output-watcher", daemon=True)
        self.read, self.clock = read, clock
        self.report = WatchReport()
        self.watched = True
        self.previous: Counter[str] | None = None
        self.stopping = threading.Event()

    def run(self) -> None:
        while self.watched:
            last = self.stopping.is_set()
            started = time.monotonic()
            self.read_once()
            if last:
                return
            # A large output is read less often, so that watching does not load the machine the job runs on.
            self.stopping.wait(max(WATCH_INTERVAL_S, 4 * (time.monotonic() - started)))

    def read_once(self) -> None:
        try:
            seen = self.read()
        except OutputUnavailable:
            self.report.unavailable += 1
            return
        except Exception as error:  # noqa: BLE001 - what a reader of the store would have met
            self.report.failed += 1
            if len(self.report.failures) < SAMPLES:
                self.report.failures.append(f"at {self.clock():.1f} s: {type(error).__name__}: {error}")
            return
        if seen is None:
            self.watched = False
            return
        self.report.reads += 1
        if self.previous is not None:
            gone = self.previous - seen
            self.report.vanished += sum(gone.values())
            for text in list(gone)[:SAMPLES - len(self.report.samples)]:
                before = self.previous[text]
                self.report.samples.append(f"{text} ({before} {'copy' if before == 1 else 'copies'}, then "
                                           f"{seen[text]}, at {self.clock():.1f} s)")
        self.previous = seen

    def stop(self) -> WatchReport | None:
        """Stop after one last read; the report, or None when the store's view is not watched."""
        self.stopping.set()
        self.join()
        return self.report if self.watched else None
