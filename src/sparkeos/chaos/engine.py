"""The chaos run: the job in its sandbox, input fed while faults are injected on a seeded schedule, then the job left
to catch up, stopped cleanly and audited against its own transformation.

1. Start the sandbox (sandbox.py), a standalone Spark cluster when executors are to be killed (cluster.py), and the
   job's driver, with its restart strategy (`sparkeos run`'s supervisor), and feed input at an even rate.
2. Once the job committed its first batch, inject each chosen kind of fault when the seeded schedule says, for the
   fault period and until every chosen kind struck at least once; a driver is killed only once it has committed a
   batch of its own, and a task only once the job committed a batch since the last task kill, so that kills cannot
   starve the job.
3. Stop feeding, and wait until the query's checkpoint shows it processed all of the input.
4. Stop the driver cleanly and audit the output, read as an independent reader reads it: missing, duplicated and
   unexpected records, with samples. All through the run, from the start to the clean stop, a reader watched the
   output (watcher.py): a record it saw must not vanish.

A preset (`sparkeos demo`) hands over a `PreparedRun`: its own sandbox, with its input produced beforehand. Nothing is
fed (step 1); the faults are scheduled from the driver's start and go on until the job is done (steps 2 and 3): its
checkpoint shows all of the input processed and the preset's own rule says the output is all there.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from confluent_kafka import KafkaException, Producer

from .. import failpoints
from ..jobs.audit import AuditReport, audit_in_this_process
from ..jobs.runner import Supervisor
from ..jobs.spec import JobSpec, load_job
from ..lag import CheckpointFiles, LagCluster, LagError, checkpoint_report
from ..spark import sink_data_source
from ..verify import read_values
from .cluster import StandaloneCluster, executor_of
from .faults import (
    DEFAULT_MASTER,
    HELD_TASK_FAULTS,
    NETWORK_FAULTS,
    Schedule,
    local_cores,
    transaction_timeout_s,
)
from .input import (
    CORRUPT_VALUE,
    SILENT_CLIENT,
    InputGenerator,
    SampledInput,
    call_while_retriable,
    produce_with_retry,
    read_sample,
)
from .network import DATABASE_FAULTS, SINK_FAULTS, SOURCE_AND_DRIVER_FAULTS, FaultInjector
from .report import ChaosReport, Event, Sample
from .sandbox import Sandbox, start_sandbox
from .watcher import OutputWatcher

TICK_S = 0.1
SAMPLE_EVERY_S = 1.0
HOLD_WAIT_S = 60  # how long an aimed kill waits for a batch (or a task) to reach its step
# How much longer than kafka.transaction.timeout.ms a long downtime waits for the broker to abort what was left open
# (a broker looks for timed-out transactions every few seconds: Kafka's
# transaction.abort.timed.out.transaction.cleanup.interval.ms is 10 s).
DOWNTIME_GRACE_S = 60
FEED_CHUNKS_PER_S = 2
ABORT_ONE_IN = 5  # about one chunk of input in this many is fed in a transaction that is then aborted
FEED_CALL_TIMEOUT_S = 30
FEED_OUTAGE_S = 120  # how long the feeder calls the broker again while it is away
# The source layouts relayout takes in turn: minPartitions that many times the input topic's partitions, 0 for the
# job's own setting. Back to the job's own at the next restart, so that a run spends little of its time on twice the
# tasks.
RELAYOUT_FACTORS = (2, 0)
_UNREAD = object()
UNTIL_EACH_KIND_S = 600  # how much longer than the fault period a run waits for a kind that has not struck yet


@dataclass
class ChaosSettings:
    faults: dict[str, float]
    seed: int = 1
    rate: int = 100  # input records a second
    fault_period_s: float = 120.0
    partitions: int = 2
    master: str = DEFAULT_MASTER
    timeout_s: float = 900.0
    workdir: Path | None = None
    env: dict[str, str] = field(default_factory=dict)  # more environment for the job's driver
    bootstrap_server: str | None = None  # a Kafka named on the command line, in place of the embedded broker
    sample_input: int | None = None  # feed this many records of the job's own input, over and over
    kafka_version: str | None = None  # an Apache Kafka node of this version, in place of the embedded broker
    job_endpoints: bool = False  # the endpoints the job file names, in place of the sandbox's


def input_may_end(now: float, faults_end: float, chosen: dict[str, float], injected: dict[str, int],
                  unrecovered: int) -> bool:
    """Whether the run stops feeding: past the fault period, once every chosen kind struck and the job committed a
    batch after each fault (its recovery; a batch needs input), or in any case UNTIL_EACH_KIND_S later."""
    if now < faults_end:
        return False
    return (all(injected.get(kind) for kind in chosen) and not unrecovered) or now > faults_end + UNTIL_EACH_KIND_S


class Feeder(threading.Thread):
    """Produces input at `rate` records a second until stopped, a transaction per chunk; about one chunk in
    ABORT_ONE_IN is aborted: input that a job reading read_committed must never let through. A broker killed under it
    loses nothing: a call failing while the broker is away is made again, a transaction that cannot commit any more
    is aborted, and a producer that failed for good is replaced (the new one's init_transactions ends what the old
    one left; how it ended shows in the topic, which `committed_input` reads at the end). `stop()` returns once the
    last transaction ended."""

    def __init__(self, kafka_config: dict[str, str], topic: str, generator: InputGenerator | SampledInput, rate: int,
                 seed: int):
        """`kafka_config`: librdkafka's settings to reach the cluster (bootstrap servers, security)."""
        super().__init__(name="chaos-input", daemon=True)
        self.kafka_config, self.topic, self.generator, self.rate = kafka_config, topic, generator, rate
        self.random = random.Random(seed)
        self.transactional_id = f"sparkeos-chaos-input-{uuid.uuid4().hex[:12]}"
        self.producer: Producer | None = None
        self.acknowledged = 0  # records of committed transactions
        self.aborted = 0  # records of aborted transactions
        self.uncertain = 0  # records of transactions whose producer failed for good
        self.failed: list[str] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        try:
            self.producer = self._new_producer()
            started = time.monotonic()
            chunk = 0
            while not self.stopping.is_set():
                count = self.rate * (chunk + 1) // FEED_CHUNKS_PER_S - self.rate * chunk // FEED_CHUNKS_PER_S
                self._transaction(self.generator.records(count), commit=self.random.randrange(ABORT_ONE_IN) > 0)
                chunk += 1
                self.stopping.wait(max(started + chunk / FEED_CHUNKS_PER_S - time.monotonic(), 0))
        except BaseException as error:  # reported with the run
            self.failed.append(repr(error))

    def _transaction(self, records: list[tuple[bytes | None, bytes | None]], commit: bool) -> None:
        producer = self.producer
        try:
            producer.begin_transaction()
            for key, value in records:
                produce_with_retry(producer, self.topic, value, key=key)
            if commit:
                call_while_retriable(lambda: producer.commit_transaction(FEED_CALL_TIMEOUT_S), FEED_OUTAGE_S)
                self.acknowledged += len(records)
            else:
                # Sent first: an abort purges the records still queued, and aborted input that never reached the
                # topic would prove nothing.
                producer.flush(FEED_CALL_TIMEOUT_S)
                call_while_retriable(lambda: producer.abort_transaction(FEED_CALL_TIMEOUT_S), FEED_OUTAGE_S)
                self.aborted += len(records)
        except KafkaException as failed:
            if failed.args[0].txn_requires_abort():
                call_while_retriable(lambda: producer.abort_transaction(FEED_CALL_TIMEOUT_S), FEED_OUTAGE_S)
                self.aborted += len(records)
            elif failed.args[0].fatal() or failed.args[0].retriable():
                self.uncertain += len(records)
                self.producer = self._new_producer()
            else:
                raise

    def _new_producer(self) -> Producer:
        producer = Producer({**self.kafka_config, "transactional.id": self.transactional_id,
                             "linger.ms": 20, "compression.type": "lz4", **SILENT_CLIENT})
        call_while_retriable(lambda: producer.init_transactions(FEED_CALL_TIMEOUT_S), FEED_OUTAGE_S)
        return producer

    def stop(self) -> None:
        self.stopping.set()
        self.join()


class RecordedInput:
    """A prepared run's input, all in its topic before the run starts: the feeder's part, with nothing to feed."""

    def __init__(self, records: int, corrupt: int):
        self.acknowledged = self.produced = records
        self.corrupt = corrupt
        self.failed: list[str] = []
        self.stopping = threading.Event()
        self.stopping.set()

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def is_alive(self) -> bool:
        return False


@dataclass
class PreparedRun:
    """A run whose sandbox and input a preset made (the demo's): the sandbox is the preset's to stop; `records` are in
    its input topic, `corrupt` of them not decodable; `done()` says whether the job delivered all it must, asked once
    its checkpoint shows all of the input processed."""

    sandbox: Sandbox
    records: int
    corrupt: int
    done: Callable[[], bool]


def committed_input(kafka_config: dict[str, str], topic: str) -> tuple[int, int]:
    """The records of `topic` a read_committed reader reads, and how many of them are not decodable: what the run fed,
    whatever became of the transactions whose producer failed."""
    values = read_values(kafka_config["bootstrap.servers"], topic, config={**kafka_config, **SILENT_CLIENT})
    return len(values), sum(1 for value in values if value == CORRUPT_VALUE)


class ChaosRun:
    """One run; `run()` returns its report. `on_tick` sees the report as it grows (the live console)."""

    def __init__(self, job_file: Path, settings: ChaosSettings, on_tick: Callable[[ChaosReport], None] | None = None,
                 prepared: PreparedRun | None = None):
        self.job_file = Path(job_file)
        self.settings = settings
        self.prepared = prepared
        self.on_tick = on_tick or (lambda _report: None)
        self.workdir = settings.workdir or Path(tempfile.mkdtemp(prefix="sparkeos-chaos-"))
        self.failpoints = self.workdir / "failpoints"
        self.started = time.monotonic()
        self.recovering: list[tuple[Event, int | None]] = []  # faults whose recovery is not measured yet
        self._next_open_check = 0.0  # when a long downtime next asks the broker for open transactions
        self.layouts = 0  # relayouts so far
        self.supervisor: Supervisor | None = None  # the job's driver, once it has one
        self.server_down: str | None = None  # a server of the sandbox that did not start again after its fault
        self.own_min_partitions: object = _UNREAD  # the job's own minPartitions, read at the first relayout
        self.report = ChaosReport(job=str(job_file), seed=settings.seed, faults_chosen=dict(settings.faults),
                                  workdir=str(self.workdir))

    def elapsed(self) -> float:
        return round(time.monotonic() - self.started, 2)

    def event(self, kind: str, detail: str = "") -> Event:
        happened = Event(self.elapsed(), kind, detail)
        self.report.events.append(happened)
        return happened

    def run(self) -> ChaosReport:
        master, cluster, starting = self.settings.master, None, None
        if "executor-kill" in self.settings.faults:
            # Executors of their own: on a local master the executor is the driver's JVM. The workers hand the
            # failpoints on to the executors and their Python workers. Started while the sandbox starts.
            workers = local_cores(master)
            cluster = StandaloneCluster(self.workdir / "spark-cluster",
                                        env={failpoints.ENV: str(self.failpoints), **self.settings.env})
            pool = ThreadPoolExecutor(1, thread_name_prefix="chaos-spark-cluster")
            starting = pool.submit(cluster.start, workers)
            pool.shutdown(wait=False)  # its one task runs on
        sandbox = watcher = None
        try:
            # Read before anything starts: the cluster the job names may not answer. The job as its file says: its
            # own cluster, with its settings, and its own registry, which the samples' schema ids are of.
            job = load_job(self.job_file) if self.settings.sample_input else None
            samples = read_sample(job, self.settings.sample_input) if job is not None else None
            if self.prepared is not None:
                sandbox = self.prepared.sandbox
            else:
                sandbox = start_sandbox(self.job_file, self.workdir, self.settings.partitions, self.settings.faults,
                                        self.settings.seed, self.settings.bootstrap_server,
                                        self.settings.kafka_version, self.settings.job_endpoints)
            self.report.sandbox = dict(sandbox.endpoints)
            self.report.job_name = sandbox.spec.name
            if cluster is not None:
                master = starting.result().url
                self.report.sandbox["Spark"] = (f"{master} (the run's standalone cluster: {workers} workers of 1 core, "
                                                f"in place of {self.settings.master})")
            else:
                self.report.sandbox["Spark"] = master
            sink, options = sink_data_source(sandbox.spec.sink.format), sandbox.spec.sink.options
            watcher = OutputWatcher(lambda: sink.visible_records(options), self.elapsed)
            watcher.start()
            supervisor = self._drive(sandbox, master, cluster, job, samples)
            if self.server_down is None:
                supervisor.stop()
                self.event("stopped", "the driver stopped cleanly")
            else:  # a clean stop would wait on the server in vain
                supervisor.kill_driver()
                self.event("killed", f"the driver, with {self.server_down} down")
            self.report.watched = watcher.stop()
            self._check_after_stop(sandbox)
        finally:
            if watcher is not None:
                watcher.stopping.set()
            if self.supervisor is not None:  # whatever ended the run (an error, Ctrl-C): no driver outlives it
                self.supervisor.kill_driver()
            if cluster is not None:
                if starting is not None:
                    starting.exception()  # a cluster still starting is stopped once it has started
                cluster.stop()
            if sandbox is not None and self.prepared is None:
                sandbox.stop()
        self.report.seconds = self.elapsed()
        return self.report

    def _drive(self, sandbox: Sandbox, master: str, cluster: StandaloneCluster | None, job: JobSpec | None,
               samples: list[tuple[bytes | None, bytes | None]] | None) -> Supervisor:
        """`job` as its file says (its own endpoints) and `samples` the records read from its input, with
        --sample-input."""
        settings = self.settings
        checkpoint = self.workdir / "checkpoint"
        registry = sandbox.registry
        prepared = self.prepared
        if prepared is not None:
            generator = RecordedInput(prepared.records, prepared.corrupt)
            self.report.sandbox["input"] = f"{prepared.records} records produced before the run"
        elif samples is None or job is None:
            generator = InputGenerator(sandbox.spec, settings.seed, registry, sandbox.topics.input)
            self.report.sandbox["input"] = f"generated from the job's format, seed {settings.seed}"
        else:
            generator = SampledInput(samples, sandbox.topics.input, job.format.registry, registry)
            self.report.sandbox["input"] = (f"{len(samples)} records sampled from {job.source.get('subscribe')} on "
                                            f"{job.source.get('kafka.bootstrap.servers')} (read only), fed over and "
                                            "over")
        env = {failpoints.ENV: str(self.failpoints), **settings.env}
        supervisor = self.supervisor = Supervisor(str(sandbox.job_path), master=master, env=env,
                                                  log_file=self.workdir / "driver.log")
        sink = sink_data_source(sandbox.spec.sink.format)
        step, task_step = sink.half_committed_step, sink.task_transaction_step
        self.report.output_unit = sink.visible_output_unit

        def visible_output() -> int | None:
            try:
                return sink.visible_output(sandbox.spec.sink.options)
            except Exception:  # noqa: BLE001 - the store is down (a fault), or has nothing yet
                return None

        lag = LagCluster({**sandbox.kafka_config, **SILENT_CLIENT}, timeout_s=10)
        feeder = generator if isinstance(generator, RecordedInput) else Feeder(
            sandbox.kafka_config, sandbox.topics.input, generator, settings.rate, settings.seed)
        schedule: Schedule | None = None  # drawn once the job committed its first batch
        supervisor.start_driver()
        self.event("started", f"driver on {master}")
        feeder.start()
        faults_end = float("inf")
        deadline = self.started + settings.timeout_s
        batches_at_start = committed_batch(checkpoint)
        armed: tuple[set, float] | None = None  # a mid-commit kill waiting for its moment: known holds, since when
        aimed: tuple[str, set, float] | None = None  # a task kill waiting for its moment: kind, known holds, since
        last_task_kill: int | None = -1  # the batch committed last when a task was killed
        down: float | None = None  # a long downtime: since when; the driver is not restarted until it is over
        timeout_s = transaction_timeout_s(sandbox.spec)
        recovering = self.recovering
        injectors: dict[str, FaultInjector] = {}  # network faults, each kind on a thread of its own
        next_sample = 0.0
        while True:
            now = time.monotonic()
            committed = committed_batch(checkpoint)
            code = supervisor.driver.poll() if supervisor.driver and down is None else None
            if down is not None and self._downtime_over(down, timeout_s, sink, sandbox.spec.sink.options, now):
                down = None
                if not self._restart(supervisor, schedule, committed):
                    break
                # Its recovery counts from the restart: the downtime itself was the run's doing.
                recovering.append((Event(self.elapsed(), "long-downtime"), committed))
                batches_at_start = committed_batch(checkpoint)
            if code is not None:
                self.event("driver-exit", f"the driver exited with {code} on its own")
                if armed is not None:  # a hold its processes took died with them
                    self._give_up_hold(schedule, "driver-kill-mid-commit", step, now, "the driver exited")
                    armed = None
                if aimed is not None:
                    self._give_up_hold(schedule, aimed[0], task_step, now, "the driver exited")
                    aimed = None
                if not self._restart(supervisor, schedule, committed):
                    break
                batches_at_start = committed_batch(checkpoint)
            if not feeder.is_alive() and not feeder.stopping.is_set():
                self.event("input-failed", f"the input feeder stopped: {'; '.join(feeder.failed) or 'no error'}")
                break
            if armed is not None:
                held = failpoints.holds(self.failpoints, step) - armed[0]
                if held:
                    armed = None
                    if not self._kill_driver(supervisor, schedule, "driver-kill-mid-commit",
                                             f"at {step}, batch {committed}", committed, now, release=held):
                        break
                    batches_at_start = committed_batch(checkpoint)
                elif now - armed[1] > HOLD_WAIT_S:
                    self._give_up_hold(schedule, "driver-kill-mid-commit", step, now,
                                       f"no batch reached {step} within {HOLD_WAIT_S} s")
                    armed = None
            struck = False  # a fault this tick: the next waits for the next tick, so that each recovery is its own
            if aimed is not None:
                held = failpoints.holds(self.failpoints, task_step) - aimed[1]
                if held and aimed[0] == "long-downtime":
                    struck = True
                    down = self._go_down(supervisor, held, task_step, schedule, committed, timeout_s, now)
                    aimed, last_task_kill = None, committed
                    deadline += timeout_s + DOWNTIME_GRACE_S  # the run's own doing: not the job's time to catch up
                elif held:
                    struck = True
                    self._kill_task(aimed[0], held, task_step, schedule, committed, now,
                                    cluster if aimed[0] == "executor-kill" else None)
                    aimed, last_task_kill = None, committed
                elif now - aimed[2] > HOLD_WAIT_S:
                    self._give_up_hold(schedule, aimed[0], task_step, now,
                                       f"no task reached {task_step} within {HOLD_WAIT_S} s")
                    aimed = None
            if schedule is None and (prepared is not None or committed is not None):
                schedule = Schedule({k: v for k, v in settings.faults.items() if k not in NETWORK_FAULTS},
                                    settings.seed, now)
                if prepared is not None:
                    self.event("faults", "from the driver's start until the job is done")
                else:
                    injectors = self._start_network_faults(sandbox, checkpoint)
                    faults_end = now + settings.fault_period_s
                    self.event("faults", f"from the first committed batch, for {settings.fault_period_s:.0f} s")
            for kind in [k for k in injectors if now >= faults_end and self.report.injected.get(k)]:
                self._stop_injector(injectors.pop(kind))
            if schedule is not None and not feeder.stopping.is_set() and input_may_end(
                    now, faults_end, settings.faults, self.report.injected, len(recovering) + (down is not None)):
                feeder.stop()
                self.event("input-end", f"{feeder.acknowledged} records fed")
            faulting = not feeder.stopping.is_set() or prepared is not None
            if schedule is not None and faulting and not struck and down is None:
                own_batch = committed is not None and (batches_at_start is None or committed > batches_at_start)
                for due in schedule.due_now(now):
                    if now >= faults_end and self.report.injected.get(due):
                        continue  # past the fault period, only kinds that have not struck yet go on
                    # A driver is killed once it committed a batch of its own (else kills could starve the job, or
                    # strike the recovery of the last kill again and again), and not while a mid-commit kill waits
                    # for its moment (the hold would die with this driver).
                    quiet = armed is None and aimed is None  # no process held at a step, none about to be
                    if due == "driver-kill" and own_batch and quiet:
                        if not self._kill_driver(supervisor, schedule, due, f"batch {committed} committed last",
                                                 committed, now):
                            break
                        batches_at_start = committed_batch(checkpoint)
                    elif due == "driver-kill-mid-commit" and own_batch and quiet:
                        armed = (failpoints.arm_hold(self.failpoints, step), now)
                        schedule.due[due] = float("inf")  # drawn again once the kill happened or was given up
                    elif due in HELD_TASK_FAULTS and quiet and committed is not None and committed != last_task_kill:
                        aimed = (due, failpoints.arm_hold(self.failpoints, task_step), now)
                        schedule.due[due] = float("inf")
                    elif due == "broker-kill" or (due == "postgres-crash" and sandbox.postgres is not None):
                        server = sandbox.kafka_server if due == "broker-kill" else sandbox.postgres
                        outage = schedule.outage_s()
                        recovering.append((self.fault(due, f"down {outage:.1f} s"), committed))
                        server.crash()
                        time.sleep(outage)
                        try:
                            server.start()
                        except Exception as error:  # noqa: BLE001 - the run ends, with its report saying why
                            what = "the Kafka broker" if due == "broker-kill" else "PostgreSQL"
                            self.server_down = what
                            self.report.gave_up = f"{what} did not start again after a {due}: {error}"
                            self.event("gave-up", self.report.gave_up)
                            break
                        schedule.done(due, time.monotonic())
                    else:
                        continue
                    break
                if self.report.gave_up:
                    break
            elif not faulting and (armed is not None or aimed is not None):
                self._disarm(step)
                self._disarm(task_step)
                armed = aimed = None
            self.note_recoveries(committed)
            if now >= next_sample:
                next_sample = now + SAMPLE_EVERY_S
                caught_up = self._sample(lag, checkpoint, feeder, supervisor, committed, visible_output())
                self.on_tick(self.report)
                if caught_up and feeder.stopping.is_set() and (prepared is None or prepared.done()):
                    # The batch that caught up may have committed after this tick read the commit log.
                    self.note_recoveries(committed_batch(checkpoint))
                    self.event("caught-up", f"all {feeder.acknowledged} records processed")
                    break
            if now > deadline:
                self.report.timed_out = True
                self.event("timed-out", f"the job had not processed all input after {settings.timeout_s:.0f} s")
                break
            time.sleep(TICK_S)
        self._disarm(step)
        self._disarm(task_step)
        for injector in injectors.values():
            self._stop_injector(injector)
        if self.server_down is None:
            feeder.stop()
        else:  # its calls to a broker that is gone would be made again for FEED_OUTAGE_S: the run is over
            feeder.stopping.set()
        self.report.feed_errors = feeder.failed[:5]
        if prepared is not None:  # counted as the preset produced them
            self.report.input_records, self.report.corrupt_records = prepared.records, prepared.corrupt
        elif self.server_down is not None:
            self.report.input_records, self.report.corrupt_records = feeder.acknowledged, generator.corrupt
        else:
            try:
                self.report.input_records, self.report.corrupt_records = committed_input(sandbox.kafka_config,
                                                                                         sandbox.topics.input)
            except Exception as error:  # noqa: BLE001 - the run's report still comes, with what the feeder knows
                self.report.feed_errors.append(f"the input topic could not be read back: {error}")
                self.report.input_records, self.report.corrupt_records = feeder.acknowledged, generator.corrupt
        self.report.aborted_input_records = generator.produced - self.report.input_records
        self.report.restarts = supervisor.restarts
        return supervisor

    def _check_after_stop(self, sandbox: Sandbox) -> None:
        """List what the sink left pending and audit the output; a check whose store does not answer is noted as not
        made, and the report comes all the same. Neither is tried while a server of the sandbox is down."""
        if self.server_down is not None:
            self.event("not-checked", f"{self.server_down} is down: the output and what the sink left pending cannot "
                                      "be read")
            return
        try:
            self.report.leftovers = left_pending(sandbox.spec)
        except Exception as error:  # noqa: BLE001 - said in the report, which makes the run inexact
            self.report.check_errors.append(f"what the sink left pending could not be listed: {error}")
        try:
            self.report.audit = audit_sandbox(sandbox, self.workdir / "audit.log")
        except Exception as error:  # noqa: BLE001 - as above
            self.report.check_errors.append(f"the output could not be audited: {error}")

    def note_recoveries(self, committed: int | None) -> None:
        """Each fault the job committed a batch after, `committed` the last, has recovered: its time is noted."""
        for fault, before in list(self.recovering):
            if committed is not None and (before is None or committed > before):
                self.report.recovery_s.setdefault(fault.kind, []).append(round(self.elapsed() - fault.at, 2))
                self.recovering.remove((fault, before))

    def _kill_driver(self, supervisor: Supervisor, schedule: Schedule, kind: str, detail: str, committed: int | None,
                     now: float, release: set[Path] = frozenset()) -> bool:
        """The fault `kind`: kill -9 of the driver, then the holds in `release` let go and the driver restarted; False
        when the restart strategy gives up."""
        self.recovering.append((self.fault(kind, detail), committed))
        supervisor.kill_driver()
        for hold in release:
            hold.unlink(missing_ok=True)
        schedule.done(kind, now)
        return self._restart(supervisor, schedule, committed)

    def _kill_task(self, kind: str, held: set[Path], task_step: str, schedule: Schedule, committed: int | None,
                   now: float, cluster: StandaloneCluster | None) -> None:
        """The fault `kind` on the processes holding at `task_step`: kill -9 of the Python worker, or of its executor
        with the executor's Python workers; then the holds are let go (nothing waits on them any more)."""
        for hold in held:
            worker = int(hold.name.rsplit("-", 1)[1])
            executor = executor_of(worker) if cluster is not None else None
            if executor is not None:
                cluster.kill_executor(executor)
                detail = f"executor JVM {executor}, its task at {task_step}"
            else:
                try:
                    os.kill(worker, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                detail = f"Python worker {worker} at {task_step}"
            self.recovering.append((self.fault(kind, f"{detail}, batch {committed} committed last"), committed))
            hold.unlink(missing_ok=True)
        schedule.done(kind, now)

    def _go_down(self, supervisor: Supervisor, held: set[Path], task_step: str, schedule: Schedule,
                 committed: int | None, timeout_s: float, now: float) -> float:
        """The long-downtime fault: kill -9 of the driver, which is not restarted until `_downtime_over`, and of the
        Python workers holding at `task_step`, whose transactions stay open on the broker. When it began."""
        # The driver first: while it lives, a task whose worker died is run again, and the retry's producer would
        # end the open transaction itself. On a local master its tree holds the workers too.
        supervisor.kill_driver()
        for hold in held:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(hold.name.rsplit("-", 1)[1]), signal.SIGKILL)
            hold.unlink(missing_ok=True)
        self.fault("long-downtime", f"the driver and the Python worker of a task at {task_step} killed, batch "
                                    f"{committed} committed last; down longer than kafka.transaction.timeout.ms "
                                    f"({timeout_s:.0f} s)")
        schedule.done("long-downtime", now)
        return now

    def _downtime_over(self, since: float, timeout_s: float, sink: type, options: dict[str, str], now: float) -> bool:
        """Once kafka.transaction.timeout.ms has passed and the broker aborted every transaction left open on the
        output topic (DOWNTIME_GRACE_S more at most: then the run says so)."""
        if now - since < timeout_s or now < self._next_open_check:
            return False
        self._next_open_check = now + 1.0
        try:
            left_open = sink.left_pending(options, settle_s=0)
        except Exception:  # noqa: BLE001 - the broker away (a network fault): asked again
            left_open = ["unknown: the broker did not answer"]
        if left_open and now - since < timeout_s + DOWNTIME_GRACE_S:
            return False
        if left_open:
            self.report.fault_errors.append(f"long-downtime: {left_open[0]}, {now - since:.0f} s after the kill "
                                            f"(kafka.transaction.timeout.ms {timeout_s:.0f} s)")
            self.event("downtime-over", f"after {now - since:.1f} s, a transaction still open on the output")
        else:
            self.event("downtime-over", f"after {now - since:.1f} s, no transaction left open on the output")
        return True

    def _start_network_faults(self, sandbox: Sandbox, checkpoint: Path) -> dict[str, FaultInjector]:
        """A thread per chosen kind of network fault, each injecting one fault at a time through its proxy; after a
        fault took effect, the next waits until the job committed another batch (faults that fail a task would
        otherwise fail every retry of it)."""
        chosen = {"network-kafka": (sandbox.kafka_proxy, SOURCE_AND_DRIVER_FAULTS + (
                      SINK_FAULTS if sandbox.spec.sink.is_kafka else ())),
                  "network-postgres": (sandbox.postgres_proxy, DATABASE_FAULTS)}
        injectors = {}
        for number, (kind, (proxy, faults)) in enumerate(chosen.items()):
            if kind not in self.settings.faults or proxy is None:
                continue
            mean = self.settings.faults[kind]

            def took_effect(name: str, kind: str = kind) -> None:
                self.recovering.append((self.fault(kind, name), committed_batch(checkpoint)))

            injectors[kind] = FaultInjector(proxy, faults, self.settings.seed + number, (0.5 * mean, 1.5 * mean),
                                            progress=lambda: committed_batch(checkpoint) or -1, on_effect=took_effect)
            injectors[kind].start()
        return injectors

    def _stop_injector(self, injector: FaultInjector) -> None:
        try:
            injector.stop()
        except AssertionError as failed:  # the injector's own failure: the run proved less than it claims
            self.report.fault_errors.append(str(failed))

    def _disarm(self, step: str) -> None:
        """No process stops at `step` any more, and those stopped there go on."""
        failpoints.disarm_hold(self.failpoints, step)
        for hold in failpoints.holds(self.failpoints, step):
            hold.unlink(missing_ok=True)

    def _give_up_hold(self, schedule: Schedule, kind: str, step: str, now: float, why: str) -> None:
        self._disarm(step)
        self.report.missed[kind] = self.report.missed.get(kind, 0) + 1
        self.event("missed", f"{kind}: {why}")
        schedule.done(kind, now)

    def fault(self, kind: str, detail: str) -> Event:
        self.report.injected[kind] = self.report.injected.get(kind, 0) + 1
        return self.event(kind, detail)

    def _restart(self, supervisor: Supervisor, schedule: Schedule, committed: int | None) -> bool:
        """Restart the driver as its restart strategy says, with another layout when one is due; False when the
        strategy gives up."""
        delay = supervisor.next_delay()
        if delay is None:
            self.report.gave_up = f"the job's restart strategy ({supervisor.strategy.describe()}) allowed no more " \
                                  f"restarts after {supervisor.restarts}"
            self.event("gave-up", self.report.gave_up)
            return False
        if schedule is not None and "relayout" in schedule.due_now(time.monotonic()):
            self._relayout(Path(supervisor.job_path), committed)
            schedule.done("relayout", time.monotonic())
        supervisor.restart(delay)
        self.event("restart", f"after {delay:.1f} s")
        return True

    def _relayout(self, job_path: Path, committed: int | None) -> None:
        """The fault relayout: the job file the next driver reads gets the next source layout of RELAYOUT_FACTORS.
        The batch the last driver left in flight is replayed as planned (the source keeps its plan in the offset
        log); the batches after it are split the new way."""
        document = yaml.safe_load(job_path.read_text())
        source = document["source"]
        if self.own_min_partitions is _UNREAD:
            self.own_min_partitions = source.get("minPartitions")
        before = source.get("minPartitions")
        factor = RELAYOUT_FACTORS[self.layouts % len(RELAYOUT_FACTORS)]
        self.layouts += 1
        after = self.settings.partitions * factor if factor else self.own_min_partitions
        if after is None:
            source.pop("minPartitions", None)
        else:
            source["minPartitions"] = after
        job_path.write_text(yaml.safe_dump(document, sort_keys=False))
        self.recovering.append((self.fault("relayout", f"minPartitions {after or 'unset'} (was {before or 'unset'})"),
                                committed))

    def _sample(self, lag: LagCluster, checkpoint: Path, feeder: Feeder, supervisor: Supervisor,
                committed: int | None, output: int | None) -> bool:
        """Record where the job is; True when its checkpoint shows all the input acknowledged so far processed."""
        processed = latest = None
        try:
            rows = checkpoint_report(lag, str(checkpoint)).partitions
            processed = sum(row.processed or 0 for row in rows)
            latest = sum(row.latest for row in rows)
        except Exception:  # noqa: BLE001 - a broker restarting, nothing planned yet
            pass
        self.report.samples.append(Sample(self.elapsed(), feeder.acknowledged, processed,
                                          None if latest is None or processed is None else latest - processed,
                                          committed, supervisor.restarts, output))
        return processed is not None and latest is not None and processed >= feeder.acknowledged and latest == processed


def committed_batch(checkpoint: Path) -> int | None:
    """The last batch in the query's commit log, if any."""
    try:
        batches = CheckpointFiles(str(checkpoint)).batches("commits")
    except LagError:
        return None
    return batches[-1] if batches else None


def left_pending(spec: JobSpec) -> list[str]:
    """What the job's sink holds neither published nor discarded, in words (each sink's data source says): after a
    clean stop, nothing."""
    return sink_data_source(spec.sink.format).left_pending(spec.sink.options)


def audit_sandbox(sandbox: Sandbox, log: Path) -> AuditReport:
    """`sparkeos audit` of the sandboxed job, in this process; its Spark JVM logs to `log`."""
    return audit_in_this_process(sandbox.spec, sandbox.bootstrap, sandbox.topics.input, sandbox.topics.output,
                                 sandbox.topics.dead_letter, log, "sparkeos-chaos-audit")


def run_chaos(job_file: Path, settings: ChaosSettings,
              on_tick: Callable[[ChaosReport], None] | None = None) -> ChaosReport:
    """Run `job_file` under the faults of `settings` and audit it; the work directory is removed afterwards unless
    `settings.workdir` names one."""
    chaos = ChaosRun(job_file, settings, on_tick)
    try:
        return chaos.run()
    finally:
        if settings.workdir is None:
            shutil.rmtree(chaos.workdir, ignore_errors=True)
