"""What a chaos run found: the audit (expected, delivered, missing, duplicated, unexpected, with samples), the faults
injected by kind, the restarts and the recovery times, and the run's timeline (events and one sample a second), as
a table for the terminal and as JSON."""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from rich.console import Console
from rich.table import Table

from ..jobs.audit import AuditReport, Comparison, audit_table, sample_lines
from .watcher import WatchReport

PLAIN_INTERVAL_S = 10.0  # between two progress lines on a console that is not a terminal


@dataclass(frozen=True)
class Event:
    at: float  # seconds since the run started
    kind: str  # a fault kind, or what the run did: started, restart, driver-exit, missed, caught-up, stopped, ...
    detail: str = ""


@dataclass(frozen=True)
class Sample:
    at: float
    input: int  # records acknowledged by the broker so far
    processed: int | None  # input offsets the query's last committed batch reached
    lag: int | None
    batch: int | None  # the last committed batch
    restarts: int
    output: int | None = None  # what readers of the output see, in the report's output_unit


@dataclass
class ChaosReport:
    job: str
    seed: int
    faults_chosen: dict[str, float]
    workdir: str
    job_name: str = ""
    output_unit: str = ""  # of the samples' output: offsets (Kafka), files, rows
    sandbox: dict[str, str] = field(default_factory=dict)
    injected: dict[str, int] = field(default_factory=dict)
    missed: dict[str, int] = field(default_factory=dict)  # aimed faults whose moment did not come
    recovery_s: dict[str, list[float]] = field(default_factory=dict)  # fault -> seconds until the next batch committed
    restarts: int = 0
    input_records: int = 0
    corrupt_records: int = 0
    aborted_input_records: int = 0  # fed in transactions the feeder aborted: no reader may see them
    feed_errors: list[str] = field(default_factory=list)
    fault_errors: list[str] = field(default_factory=list)  # a fault injector that failed
    leftovers: list[str] = field(default_factory=list)  # what the sink held pending after the clean stop
    check_errors: list[str] = field(default_factory=list)  # checks after the clean stop that could not be made
    watched: WatchReport | None = None  # what the reader watching the output saw; None: the sink's view is not watched
    timed_out: bool = False
    gave_up: str | None = None
    audit: AuditReport | None = None
    seconds: float = 0.0
    events: list[Event] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)

    @property
    def problems(self) -> list[str]:
        """What makes the run inexact besides the audit's differences."""
        found = []
        if self.timed_out:
            found.append("the job did not process all of its input in time")
        if self.gave_up:
            found.append(self.gave_up)
        if self.feed_errors:
            found.append(f"input records were not acknowledged: {'; '.join(self.feed_errors)}")
        if self.audit is None:
            found.append("the output was not audited")
        found += self.fault_errors
        found += self.check_errors
        if self.leftovers:
            found.append(f"{len(self.leftovers)} left pending after the clean stop: {'; '.join(self.leftovers[:5])}")
        if self.watched is not None:
            found += self.watched.problems
        return found

    @property
    def exact(self) -> bool:
        return self.audit is not None and self.audit.exact and not self.problems

    def to_json(self) -> dict[str, Any]:
        audit = self.audit.summary() if self.audit is not None else None
        return {
            "job": self.job, "name": self.job_name, "seed": self.seed, "exact": self.exact,
            "expected": audit["expected"] if audit else None, "delivered": audit["delivered"] if audit else None,
            "missing": audit["missing"] if audit else None, "duplicated": audit["duplicated"] if audit else None,
            "unexpected": audit["unexpected"] if audit else None,
            "dead_lettered": audit["dead_lettered"] if audit else None,
            "samples": audit["samples"] if audit else {}, "dead_letter": audit.get("dead_letter") if audit else None,
            "problems": self.problems, "timed_out": self.timed_out, "gave_up": self.gave_up,
            "feed_errors": list(self.feed_errors), "fault_errors": list(self.fault_errors),
            "leftovers": list(self.leftovers), "check_errors": list(self.check_errors),
            "watched": self.watched.to_json() if self.watched is not None else None,
            "input_records": self.input_records,
            "corrupt_records": self.corrupt_records,
            "aborted_input_records": self.aborted_input_records,
            "faults": dict(self.faults_chosen), "injected": dict(self.injected), "missed": dict(self.missed),
            "restarts": self.restarts, "recovery_s": {k: list(v) for k, v in self.recovery_s.items()},
            "sandbox": dict(self.sandbox), "seconds": self.seconds, "workdir": self.workdir,
            "output_unit": self.output_unit,
            "events": [asdict(e) for e in self.events], "timeline": [asdict(s) for s in self.samples],
        }


def report_from_json(data: dict[str, Any]) -> ChaosReport:
    """The report `to_json` gave, as an object again (what a chaos run in another process hands back)."""
    audit = None
    if data.get("expected") is not None:
        output = Comparison(data["expected"], data["delivered"], data["missing"], data["duplicated"],
                            data["unexpected"], dict(data.get("samples") or {}))
        dead_letter = Comparison(**data["dead_letter"]) if data.get("dead_letter") else None
        audit = AuditReport(output, dead_letter)
    report = ChaosReport(job=data["job"], seed=data["seed"], faults_chosen=dict(data["faults"]),
                         workdir=data["workdir"], job_name=data["name"], output_unit=data["output_unit"],
                         sandbox=dict(data["sandbox"]), injected=dict(data["injected"]), missed=dict(data["missed"]),
                         recovery_s={k: list(v) for k, v in data["recovery_s"].items()}, restarts=data["restarts"],
                         input_records=data["input_records"], corrupt_records=data["corrupt_records"],
                         aborted_input_records=data["aborted_input_records"],
                         audit=audit, seconds=data["seconds"],
                         events=[Event(**e) for e in data["events"]], samples=[Sample(**s) for s in data["timeline"]])
    report.timed_out, report.gave_up = data["timed_out"], data["gave_up"]
    report.feed_errors = list(data["feed_errors"])
    report.fault_errors = list(data["fault_errors"])
    report.leftovers = list(data["leftovers"])
    report.check_errors = list(data["check_errors"])
    report.watched = WatchReport(**data["watched"]) if data.get("watched") else None
    return report


def live_table(report: ChaosReport) -> Table:
    table = Table(title=f"sparkeos chaos: {report.job_name or report.job}, seed {report.seed}")
    for column in ("elapsed", "input", "processed", "lag", "batch", "restarts", "faults"):
        table.add_column(column, justify="right")
    last = report.samples[-1] if report.samples else None
    faults = _faults_so_far(report) or "-"
    values = ([f"{last.at:.0f} s", last.input, last.processed, last.lag, last.batch, last.restarts] if last
              else ["0 s", "", "", "", "", 0])
    table.add_row(*("" if v is None else str(v) for v in values), faults)
    return table


class PlainProgress:
    """`live_line` on a console every PLAIN_INTERVAL_S, and at each new fault or restart."""

    def __init__(self, console: Console):
        self.console = console
        self.printed_at: float | None = None
        self.events = 0

    def show(self, report: ChaosReport) -> None:
        now = time.monotonic()
        if self.printed_at is None or now - self.printed_at >= PLAIN_INTERVAL_S or len(report.events) != self.events:
            self.console.print(live_line(report), soft_wrap=True, highlight=False)
            self.printed_at, self.events = now, len(report.events)


def live_line(report: ChaosReport) -> str:
    """What `live_table` shows, as one line, for a console that is not a terminal (a CI log)."""
    last = report.samples[-1] if report.samples else None
    faults = _faults_so_far(report) or "none yet"
    if last is None:
        return f"chaos: starting; faults {faults}"
    def known(value: int | None) -> str:
        return "-" if value is None else str(value)

    return (f"chaos: {last.at:.0f} s, input {last.input}, processed {known(last.processed)}, lag {known(last.lag)}, "
            f"batch {known(last.batch)}, restarts {last.restarts}; faults {faults}")


def _faults_so_far(report: ChaosReport) -> str:
    return ", ".join(f"{kind} {count}" for kind, count in sorted(report.injected.items()))


def _recovery(times: list[float]) -> str:
    if not times:
        return "-"
    return f"median {statistics.median(times):.1f} s, max {max(times):.1f} s"


def print_report(report: ChaosReport, console: Console) -> None:
    audit = report.audit
    if audit is not None:
        console.print(audit_table(audit, f"sparkeos chaos: {report.job_name or report.job} (seed {report.seed}): "
                                         "audit, read as an independent reader reads it"))
    faults = Table(title="faults")
    for column in ("fault", "injected", "recovery (to the next committed batch)"):
        faults.add_column(column)
    for kind in report.faults_chosen:
        missed = report.missed.get(kind, 0)
        faults.add_row(kind, f"{report.injected.get(kind, 0)}" + (f" ({missed} missed)" if missed else ""),
                       _recovery(report.recovery_s.get(kind, [])))
    console.print(faults)
    console.print(f"input {report.input_records} records ({report.corrupt_records} not decodable; "
                  f"{report.aborted_input_records} more in aborted transactions), restarts "
                  f"{report.restarts}, {report.seconds:.0f} s; sandbox: "
                  + ", ".join(f"{name} {where}" for name, where in report.sandbox.items()), highlight=False)
    if report.watched is not None:
        console.print(f"a reader watched the output all along: {watch_summary(report.watched)}", highlight=False)
    for line in sample_lines(audit) if audit is not None else []:
        console.print(f"[red]{line}[/]", highlight=False)
    for problem in report.problems:
        console.print(f"[red]{problem}[/]", highlight=False)
    console.print("[bold green]exact[/]" if report.exact else "[bold red]NOT exact[/]")


def watch_summary(watched: WatchReport) -> str:
    return (f"{watched.reads} reads ({watched.unavailable} unanswered while the store was away), {watched.vanished} "
            f"records vanished, {watched.failed} reads failed")
