"""The faults `sparkeos chaos` injects, how `--faults` names them, and the seeded schedule they follow.

`--faults driver-kill=40s,broker-kill` selects kinds, each with the mean time between two of its faults (the
kind's default when left out). The schedule is drawn from one seed: the same seed, job and machine give the same
faults in the same order (their moments follow the job's own progress, which no seed fixes).
"""

from __future__ import annotations

import os
import random
import re
from dataclasses import dataclass

from ..jobs.spec import POSTGRES_SINK, JobSpec


@dataclass(frozen=True)
class FaultKind:
    name: str
    what: str  # what it does, in the words of `sparkeos chaos --help` and the report
    mean_interval_s: float  # the default mean time between two faults of the kind
    needs: tuple[str, ...] = ()  # what the run must have for the kind to apply, keys of NEEDS


# The longest kafka.transaction.timeout.ms a long-downtime fault waits out: the run keeps the job down longer.
MAX_DOWNTIME_TIMEOUT_S = 300.0
# What a kind may need: a part of the job, or a Spark whose processes the run starts itself.
NEEDS = {"postgres": "a sparkeos.postgres sink",
         "own-postgres": "a PostgreSQL server the run starts itself (not the job's own, with --use-job-endpoints)",
         "own-kafka": "a Kafka the run starts itself (not one named with --bootstrap-server, nor the job's own with "
                      "--use-job-endpoints)",
         "own-spark": "Spark processes the run starts itself: a local master (--master local[N]; for executor kills "
                      "the run starts a standalone cluster of N workers)",
         "restarts": "a fault that restarts the driver in --faults: driver-kill, driver-kill-mid-commit, "
                     "long-downtime or postgres-crash",
         "kafka-transactions": "a sparkeos.kafka sink with deliveryGuarantee exactly_once and a "
                               f"kafka.transaction.timeout.ms of at most {MAX_DOWNTIME_TIMEOUT_S * 1000:.0f} (the run "
                               "keeps the job down longer than it)"}


KINDS = {kind.name: kind for kind in (
    FaultKind("driver-kill", "kill -9 of the Spark driver (its JVM and Python workers with it) at a random moment, "
                             "then a restart by the job's restart strategy", 30.0),
    FaultKind("driver-kill-mid-commit", "kill -9 of the driver while a batch is half committed: some of its "
                                        "transactions committed, others not yet", 45.0),
    FaultKind("python-worker-kill", "kill -9 of the Python worker of a task in the middle of its transaction (its "
                                    "rows written, not yet committed); Spark runs the task again", 20.0,
              needs=("own-spark",)),
    FaultKind("executor-kill", "kill -9 of an executor (its JVM and Python workers) while one of its tasks is in the "
                               "middle of its transaction; the run's standalone cluster starts another executor and "
                               "Spark runs the lost tasks again", 30.0, needs=("own-spark",)),
    FaultKind("relayout", "at a driver restart (after a kill, a crash or a downtime), the source's layout changed: "
                          "minPartitions twice the input partitions, then the job's own at the next, in turn", 30.0,
              needs=("restarts",)),
    FaultKind("broker-kill", "kill -9 of the Kafka broker, restarted after a random outage of up to 5 s", 40.0,
              needs=("own-kafka",)),
    FaultKind("network-kafka", "a network fault between Spark and Kafka through the run's proxy, one at a time: an "
                               "answer withheld after the broker applied the request (Fetch, ListOffsets, Metadata, "
                               "Produce, AddPartitionsToTxn, TxnOffsetCommit, EndTxn), connections refused for 2 s "
                               "(also mid-commit), 30 ms of latency, frames split into pieces", 10.0,
              needs=("own-kafka",)),
    FaultKind("long-downtime", "kill -9 of the driver and of a task in the middle of its transaction, then the job "
                               "kept down longer than the sink's kafka.transaction.timeout.ms, until the broker "
                               "aborted the task's open transaction (where a sink that committed on recovery what it "
                               "had pre-committed would lose it)", 120.0, needs=("own-spark", "kafka-transactions")),
    FaultKind("network-postgres", "a network fault between Spark and PostgreSQL through the run's proxy: a "
                                  "connection cut mid-COPY, the answer to PREPARE TRANSACTION withheld", 15.0,
              needs=("postgres",)),
    FaultKind("postgres-crash", "PostgreSQL stopped at once (pg_ctl stop -m immediate: prepared transactions "
                                "survive in its WAL), restarted after a random outage of up to 5 s", 40.0,
              needs=("postgres", "own-postgres")),
)}
# Two cores, each task tried up to four times as Spark does on a cluster (spark.task.maxFailures): a local master
# otherwise fails the query at the first failed task, which a network fault is.
DEFAULT_MASTER = "local[2,4]"
NETWORK_FAULTS = ("network-kafka", "network-postgres")  # injected by threads of their own (network.py)
TASK_KILLS = ("python-worker-kill", "executor-kill")  # aimed at a task in its transaction
HELD_TASK_FAULTS = (*TASK_KILLS, "long-downtime")  # struck when a task stops in the middle of its transaction
RESTARTING = ("driver-kill", "driver-kill-mid-commit", "long-downtime", "postgres-crash")  # the driver restarts after
MAX_OUTAGE_S = 5.0
_FAULT = re.compile(r"(?P<kind>[a-z-]+)(=(?P<seconds>\d+(\.\d+)?)s?)?")


class FaultError(ValueError):
    """`--faults` names something that cannot be done to this job."""


def applicable(spec: JobSpec, master: str = DEFAULT_MASTER, kafka_named: bool = False,
               job_endpoints: bool = False) -> list[str]:
    """The kinds that apply to the job run on `master` (against a Kafka named on the command line when
    `kafka_named`, against the endpoints its file names when `job_endpoints`): all but those needing what it does not
    have."""
    return [name for name, kind in KINDS.items() if not _unmet(kind, spec, master, kafka_named, job_endpoints)]


def _unmet(kind: FaultKind, spec: JobSpec, master: str, kafka_named: bool, job_endpoints: bool) -> list[str]:
    have = {"restarts"}  # driver-kill applies to every job; parse_faults checks that one is chosen
    if spec.sink.format == POSTGRES_SINK:
        have.add("postgres")
        if not job_endpoints:
            have.add("own-postgres")
    if not (kafka_named or job_endpoints):
        have.add("own-kafka")
    if is_local(master):
        have.add("own-spark")
    timeout_s = transaction_timeout_s(spec)
    if timeout_s is not None and timeout_s <= MAX_DOWNTIME_TIMEOUT_S:
        have.add("kafka-transactions")
    return [need for need in kind.needs if need not in have]


def transaction_timeout_s(spec: JobSpec) -> float | None:
    """The kafka.transaction.timeout.ms of a sparkeos.kafka sink whose tasks write in transactions (exactly_once), in
    seconds; None for other sinks."""
    if not spec.sink.is_kafka:
        return None
    from ..spark.kafka.options import parse_sink_options

    options = parse_sink_options({"kafka.bootstrap.servers": "sandbox:9092", **spec.sink.options})
    return options.transaction_timeout_ms / 1000 if options.delivery_guarantee == "exactly_once" else None


def is_local(master: str) -> bool:
    return master == "local" or master.startswith("local[")


def local_cores(master: str) -> int:
    """The cores of a local master: local 1, local[N] and local[N,F] N, local[*] those of the machine."""
    match = re.fullmatch(r"local(\[(?P<cores>\*|\d+)(,\d+)?\])?", master)
    if match is None:
        raise FaultError(f"{master!r} is not a local master")
    cores = match["cores"] or "1"
    return (os.cpu_count() or 1) if cores == "*" else int(cores)


NO_FAULTS = "none"


def parse_faults(text: str | None, spec: JobSpec, master: str = DEFAULT_MASTER, kafka_named: bool = False,
                 job_endpoints: bool = False) -> dict[str, float]:
    """`--faults` as {kind: mean seconds between faults}; every kind that applies at its default when not given, and
    none for `none` (the job run and audited as it is)."""
    kinds = applicable(spec, master, kafka_named, job_endpoints)
    if text is None:
        return {name: KINDS[name].mean_interval_s for name in kinds}
    items = [part.strip() for part in text.split(",")]
    if NO_FAULTS in items:
        if len(items) > 1:
            raise FaultError(f"--faults {NO_FAULTS} stands alone: it runs the job without faults (got {text!r})")
        return {}
    chosen: dict[str, float] = {}
    for item in items:
        match = _FAULT.fullmatch(item)
        if not match or match["kind"] not in KINDS:
            raise FaultError(f"unknown fault {item!r}: --faults takes KIND[=SECONDS] items separated by commas, "
                             f"KIND one of {', '.join(KINDS)}; or {NO_FAULTS}")
        name = match["kind"]
        if name not in kinds:
            unmet = _unmet(KINDS[name], spec, master, kafka_named, job_endpoints)
            raise FaultError(f"fault {name} does not apply to this run: it needs {NEEDS[unmet[0]]}")
        if name in chosen:
            raise FaultError(f"fault {name} is given twice in --faults")
        seconds = float(match["seconds"]) if match["seconds"] else KINDS[name].mean_interval_s
        if seconds <= 0:
            raise FaultError(f"fault {name}: the time between faults must be more than 0 s (got {item!r})")
        chosen[name] = seconds
    if "relayout" in chosen and not set(chosen) & set(RESTARTING):
        raise FaultError(f"fault relayout does not apply to this run: it needs {NEEDS['restarts']}")
    return chosen


class Schedule:
    """When each kind's next fault is due: intervals drawn uniformly between half and one and a half of the kind's
    mean, from one seeded generator."""

    def __init__(self, faults: dict[str, float], seed: int, start: float):
        self.random = random.Random(seed)
        self.faults = dict(faults)
        self.due = {name: start + self._interval(name) for name in sorted(self.faults)}

    def _interval(self, name: str) -> float:
        return self.random.uniform(0.5, 1.5) * self.faults[name]

    def due_now(self, now: float) -> list[str]:
        """The kinds whose faults are due, the most overdue first."""
        return [name for at, name in sorted((at, name) for name, at in self.due.items() if at <= now)]

    def done(self, name: str, now: float) -> None:
        """The kind's fault happened (or was given up): its next is drawn from now."""
        self.due[name] = now + self._interval(name)

    def outage_s(self) -> float:
        return self.random.uniform(0, MAX_OUTAGE_S)
