"""What `sparkeos run` shows while its job runs: a live table on a terminal, a plain line now and then elsewhere.

The figures are the metrics exporter's (`sparkeos.metrics`), which the supervising process keeps across driver
restarts: records in and their rate, lag, records delivered and dead-lettered, batches, restarts, and the p99 of
the produce-to-visible latency (``sparkeos_sink_visible_latency_seconds``) of the records the sinks committed in
the last `LATENCY_WINDOW_S`.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import IO

from rich.console import Console
from rich.live import Live
from rich.table import Table

from ..metrics import Metrics
from ..spark.visible_latency import LatencyHistogram

PLAIN_INTERVAL_S = 10.0  # a log line this often when the output is not a terminal
LATENCY_WINDOW_S = 60.0  # the console's latency is of the records made visible this long before


@dataclass(frozen=True)
class Snapshot:
    state: str
    records_in: int
    delivered: int
    dead_lettered: int
    lag: int
    batches: int
    restarts: int
    last_batch_age_s: float | None
    visible_latency: LatencyHistogram = field(default_factory=LatencyHistogram)  # since the run's start


def _total(metrics: Metrics, name: str) -> float:
    """The sum of a metric's samples over all its labels."""
    total = 0.0
    for family in metrics.registry.collect():
        for sample in family.samples:
            if sample.name == name:
                total += sample.value
    return total


def snapshot(metrics: Metrics, state: str, now: float | None = None) -> Snapshot:
    last = _total(metrics, "sparkeos_last_batch_timestamp_seconds")
    now = time.time() if now is None else now
    return Snapshot(
        state=state,
        records_in=int(_total(metrics, "sparkeos_input_records_total")),
        delivered=int(_total(metrics, "sparkeos_output_records_total")),
        dead_lettered=int(_total(metrics, "sparkeos_dead_letter_records_total")),
        lag=int(_total(metrics, "sparkeos_source_lag_records")),
        batches=int(_total(metrics, "sparkeos_batches_total")),
        restarts=int(_total(metrics, "sparkeos_restarts_total")),
        last_batch_age_s=max(now - last, 0.0) if last else None,
        visible_latency=metrics.visible_latency.total(),
    )


class RunConsole:
    """Shows snapshots: a live table on a terminal, else a line every `PLAIN_INTERVAL_S` and at each change of
    state."""

    def __init__(self, title: str, stream: IO[str], interactive: bool | None = None, width: int | None = None):
        self.title = title
        self.console = Console(file=stream, width=width)
        self.interactive = self.console.is_terminal if interactive is None else interactive
        self.live: Live | None = None
        self._previous: tuple[float, int] | None = None  # (when, records in) of the last rate
        self._rate = 0.0
        self._last_line = 0.0
        self._last_state: str | None = None
        self._latencies: deque[tuple[float, LatencyHistogram]] = deque()  # (when, since the start) as shown
        self._p99: float | None = None

    def show(self, current: Snapshot, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        if self._previous is not None and now - self._previous[0] >= 1.0:
            self._rate = (current.records_in - self._previous[1]) / (now - self._previous[0])
            self._previous = (now, current.records_in)
        elif self._previous is None:
            self._previous = (now, current.records_in)
        self._p99 = self._recent_p99(current.visible_latency, now)
        if self.interactive:
            if self.live is None:
                self.live = Live(self.table(current), console=self.console, refresh_per_second=4, transient=False)
                self.live.start()
            else:
                self.live.update(self.table(current))
            return
        if current.state != self._last_state or now - self._last_line >= PLAIN_INTERVAL_S:
            self.console.print(self.line(current), soft_wrap=True, highlight=False)
            self._last_line, self._last_state = now, current.state

    def close(self, final: Snapshot | None = None) -> None:
        if self.live is not None:
            if final is not None:
                self.live.update(self.table(final))
            self.live.stop()
            self.live = None
        elif final is not None:
            self.console.print(self.line(final), soft_wrap=True, highlight=False)

    def _recent_p99(self, since_start: LatencyHistogram, now: float) -> float | None:
        """The p99 of the records made visible within the last LATENCY_WINDOW_S: since the newest snapshot at
        least that old, or since the start while there is none."""
        marks = self._latencies
        marks.append((now, since_start))
        while len(marks) > 1 and now - marks[1][0] >= LATENCY_WINDOW_S:
            marks.popleft()
        when, oldest = marks[0]
        baseline = oldest if now - when >= LATENCY_WINDOW_S else LatencyHistogram()
        return since_start.since(baseline).quantile(0.99)

    def table(self, current: Snapshot) -> Table:
        table = Table(title=self.title)
        for column in ("state", "records in", "rate/s", "lag", "delivered", "dead-lettered", "batches", "restarts",
                       "last batch", "visible p99"):
            table.add_column(column, justify="right")
        table.add_row(current.state, f"{current.records_in:,}", f"{self._rate:,.0f}", f"{current.lag:,}",
                      f"{current.delivered:,}", f"{current.dead_lettered:,}", f"{current.batches:,}",
                      str(current.restarts), _age(current.last_batch_age_s), _seconds(self._p99))
        return table

    def line(self, current: Snapshot) -> str:
        return (f"{time.strftime('%H:%M:%S')} {self.title}: {current.state}; {current.records_in:,} records in "
                f"({self._rate:,.0f}/s), lag {current.lag:,}, {current.delivered:,} delivered, "
                f"{current.dead_lettered:,} dead-lettered, {current.batches:,} batches, {current.restarts} restarts, "
                f"last batch {_age(current.last_batch_age_s)}, visible p99 {_seconds(self._p99)} "
                f"(last {LATENCY_WINDOW_S:.0f} s)")


def _age(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.0f} s ago"


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.2f} s" if value < 10 else f"{value:,.0f} s"
