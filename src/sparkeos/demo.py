"""`sparkeos demo`: the seed's ETL job end to end on the embedded broker and local Spark.

Avro `People` records (Confluent wire format, schema in the embedded registry) -> keep 18-character
ID numbers -> 20-second tumbling windows -> ID numbers to an output topic, exactly once; corrupt
records go to a dead-letter topic in the same transactions. With --crash-every the Spark driver is
killed with SIGKILL periodically and the job's restart strategy brings it back from its checkpoint.
At the end `sparkeos audit` compares the output with the job run in batch mode over the input.

The demo is a preset of `sparkeos chaos`'s engine (sparkeos.chaos.engine): its sandbox is the demo's
broker and topics with all of the input produced first, its one fault the driver-kill, drawn around
--crash-every from the driver's start until the job delivered everything.

With --bootstrap-servers the demo runs on an existing cluster instead of the embedded broker: its
topics, consumer group and schema registry topic are named after the run, the registry runs in
this process, and the topics and group are deleted once the audit found the output exact.
"""

from __future__ import annotations

import io
import json
import os
import random
import re
import struct
import sys
import tempfile
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import fastavro
import yaml
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from rich.console import Console
from rich.live import Live
from rich.table import Table

from .chaos.input import produce_with_retry
from .jobs.quiet import librdkafka_log_level
from .registry.client import Registry, RegistrySettings
from .stack import StackProcess
from .verify import ReadTimeout, count_records

if TYPE_CHECKING:
    from .chaos.report import ChaosReport

REACH_TIMEOUT_S = 15  # how long the demo tries an existing cluster before it says it cannot reach it
PEOPLE_SCHEMA = {
    "name": "Message",
    "namespace": "com.free4lab.databus.collector.model",
    "type": "record",
    "fields": [
        {"name": "id", "type": "int"},
        {"name": "name", "type": ["string", "null"]},
        {"name": "identifyNumber", "type": ["string", "null"]},
    ],
}
READER_SCHEMA = PEOPLE_SCHEMA  # the seed reads with the writer's schema; resolution needs the same record name
STALL_S = 60  # caught up, yet the output stopped growing short of what is expected: audit what is there
NUDGE_S = 10  # caught up on event time, the output not growing: the windows may wait for a batch (`nudge`)
# librdkafka's warnings and errors only (sparkeos.jobs.quiet): its informational lines are no news for a demo.
QUIET_CLIENT = {"log_level": librdkafka_log_level("WARNING")}


@dataclass(frozen=True)
class DemoTopics:
    """The names the demo works in: on the embedded broker those of examples/people-etl.yaml; on an existing
    cluster, the same names behind a prefix of the run's own, so runs never meet each other or other work."""

    input: str = "people"
    output: str = "identify-numbers"
    dead_letter: str = "people-dead-letter"
    group: str = "people-etl"
    schemas: str = "_schemas"
    prefix: str = ""

    @classmethod
    def for_run(cls) -> DemoTopics:
        """The default names behind `sparkeos-demo-<run id>-`; the registry's topic is `...-schemas`."""
        prefix = f"sparkeos-demo-{uuid.uuid4().hex[:8]}"
        names = cls()
        return cls(f"{prefix}-{names.input}", f"{prefix}-{names.output}", f"{prefix}-{names.dead_letter}",
                   f"{prefix}-{names.group}", f"{prefix}-schemas", prefix)

    @property
    def topics(self) -> list[str]:
        """What the demo creates (the registry creates its own topic)."""
        return [self.input, self.output, self.dead_letter]


DEFAULT_TOPICS = DemoTopics()


class Unreachable(Exception):
    """The cluster given with --bootstrap-servers did not answer."""


@dataclass
class Generated:
    records: int
    valid: int           # records the job must deliver (18-character ID numbers)
    corrupt: int         # records that cannot be decoded (dead-lettered)
    sentinel: tuple[bytes, int] | None = None  # the late sentinel's value and timestamp (event time)


def confluent_frame(schema_id: int, body: bytes) -> bytes:
    return b"\x00" + struct.pack(">I", schema_id) + body


def identify_number(rng: random.Random) -> str | None:
    roll = rng.random()
    if roll < 0.05:
        return None
    length = 18 if roll < 0.85 else rng.choice([15, 17, 19])
    return "".join(rng.choice("0123456789") for _ in range(length - 1)) + rng.choice("0123456789X")


def corrupt_records(schema_id: int) -> list[bytes]:
    """One of each kind of bad record the job must dead-letter."""
    non_utf8 = io.BytesIO()
    fastavro.schemaless_writer(non_utf8, fastavro.parse_schema(PEOPLE_SCHEMA), {"id": 1, "name": "x" * 3,
                                                                              "identifyNumber": None})
    body = bytearray(non_utf8.getvalue())
    body[-4:-1] = b"\xff\xfe\xfd"  # the name's three bytes: no longer UTF-8
    return [
        b"not avro at all",                                   # wrong magic byte
        confluent_frame(999_999, b"\x02"),                    # unknown schema id
        confluent_frame(schema_id, b"\x02\x00\x80"),          # truncated body
        confluent_frame(schema_id, bytes(body)),              # a string that is not UTF-8
        b"\x00\x00",                                          # header cut short
    ]


def produce_people(bootstrap: str, registry: RegistrySettings, count: int, seed: int, late_sentinel: bool,
                   topic: str = DEFAULT_TOPICS.input, kafka_config: Mapping[str, str] | None = None) -> Generated:
    """The seed's input: `count` People records, a few corrupt ones among them. `kafka_config`: librdkafka settings
    besides the bootstrap servers (a secured cluster's)."""
    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

    client = SchemaRegistryClient(Registry.of(registry).confluent_config())
    schema_id = client.register_schema(f"{topic}-value", Schema(json.dumps(PEOPLE_SCHEMA), "AVRO"))
    parsed = fastavro.parse_schema(PEOPLE_SCHEMA)
    rng = random.Random(seed)
    producer = Producer({**(kafka_config or {}), "bootstrap.servers": bootstrap, "enable.idempotence": True,
                         "linger.ms": 20, "batch.size": 1_000_000, "compression.type": "lz4", **QUIET_CLIENT})
    corrupt = corrupt_records(schema_id)
    corrupt_at = set(rng.sample(range(count), len(corrupt))) if count >= len(corrupt) else set()
    corrupt_count = len(corrupt_at)
    valid = 0
    buffer = io.BytesIO()
    for i in range(count):
        if i in corrupt_at:
            produce_with_retry(producer, topic, corrupt.pop(), key=str(i).encode())
            continue
        number = identify_number(rng)
        valid += number is not None and len(number) == 18
        buffer.seek(0)
        buffer.truncate()
        fastavro.schemaless_writer(buffer, parsed, {"id": i, "name": None if i % 10 == 0 else f"name-{i}",
                                                    "identifyNumber": number})
        produce_with_retry(producer, topic, confluent_frame(schema_id, buffer.getvalue()), key=str(i).encode())
    if late_sentinel:
        # Event time: a record a minute ahead moves the watermark past every real window. It must pass
        # the job's filter (Spark runs filters that ignore the event time before the watermark); its
        # own window stays open, so it is never written, and the audit does not expect it.
        buffer.seek(0)
        buffer.truncate()
        fastavro.schemaless_writer(buffer, parsed, {"id": -1, "name": "watermark", "identifyNumber": "9" * 18})
        sentinel = (confluent_frame(schema_id, buffer.getvalue()), int(time.time() * 1000) + 60_000)
        producer.produce(topic, sentinel[0], timestamp=sentinel[1])
    if producer.flush(60):
        raise RuntimeError("the demo input was not fully acknowledged")
    return Generated(count + late_sentinel, valid, corrupt_count, sentinel if late_sentinel else None)


def nudge(bootstrap: str, topic: str, sentinel: tuple[bytes, int], kafka_config: Mapping[str, str] | None) -> None:
    """The late sentinel once more, in its own window, which stays open: a batch with data. Spark runs the batch
    that emits the windows the watermark has passed only after the one that moved it, and a driver restarted in
    between has no previous batch to ask: with no new input, those windows would wait for data forever."""
    producer = Producer({**(kafka_config or {}), "bootstrap.servers": bootstrap, "enable.idempotence": True,
                         **QUIET_CLIENT})
    producer.produce(topic, sentinel[0], timestamp=sentinel[1])
    if producer.flush(60):
        raise RuntimeError("the demo's nudge was not acknowledged")


def check_reachable(bootstrap: str, kafka_config: Mapping[str, str] | None = None) -> None:
    """Raise Unreachable, naming the address and what the client saw, unless a broker of `bootstrap` answers."""
    # Silent: the client would log each refused connection, many times a second; the error below says it once.
    admin = AdminClient({**(kafka_config or {}), "bootstrap.servers": bootstrap,
                         "socket.connection.setup.timeout.ms": REACH_TIMEOUT_S * 1000, "log_level": 0})
    try:
        admin.list_topics(timeout=REACH_TIMEOUT_S)
    except KafkaException as error:
        raise Unreachable(f"cannot reach Kafka at {bootstrap} within {REACH_TIMEOUT_S} s: "
                          f"{error.args[0].str()}") from None


def create_topics(bootstrap: str, partitions: int, names: DemoTopics = DEFAULT_TOPICS,
                  kafka_config: Mapping[str, str] | None = None) -> None:
    """The input and output with `partitions` each, the dead-letter topic with one; the cluster's default
    replication factor (KIP-464)."""
    admin = AdminClient({**(kafka_config or {}), "bootstrap.servers": bootstrap, **QUIET_CLIENT})
    topics = [NewTopic(names.input, partitions), NewTopic(names.output, partitions), NewTopic(names.dead_letter, 1)]
    for future in admin.create_topics(topics).values():
        future.result(30)


def delete_run(bootstrap: str, names: DemoTopics, kafka_config: Mapping[str, str] | None = None) -> list[str]:
    """Remove what a run on an existing cluster created: its topics, its registry's topic, the job's consumer group
    and the groups of the sink's commit markers (named after its transactional ids, which carry the run's prefix).
    The marker records themselves stay in the sink's shared marker topic, as every query's do. Returns what could
    not be deleted, with the broker's reason; what is gone already counts as deleted."""
    admin = AdminClient({**(kafka_config or {}), "bootstrap.servers": bootstrap, **QUIET_CLIENT})
    left = []
    for topic, future in admin.delete_topics([*names.topics, names.schemas], operation_timeout=30).items():
        left += _failed(f"topic {topic}", future, KafkaError.UNKNOWN_TOPIC_OR_PART)
    listed = admin.list_consumer_groups(request_timeout=30).result(60)
    groups = [group.group_id for group in listed.valid if group.group_id.startswith(f"{names.prefix}-")]
    if groups:
        for group, future in admin.delete_consumer_groups(groups, request_timeout=30).items():
            left += _failed(f"group {group}", future, KafkaError.GROUP_ID_NOT_FOUND)
    return left


def _failed(what: str, future, gone: int) -> list[str]:
    try:
        future.result(60)
    except KafkaException as error:
        if error.args[0].code() != gone:
            return [f"{what} ({error.args[0].str()})"]
    return []


def job_document(bootstrap: str, registry_url: str, checkpoint: Path, event_time: bool,
                 names: DemoTopics = DEFAULT_TOPICS) -> dict:
    window = {"duration": "20 seconds", "time": "processing"}
    if event_time:
        window = {"duration": "20 seconds", "time": "event", "watermark": "5 seconds"}
    return {
        "name": "people-etl",
        "source": {"kafka.bootstrap.servers": bootstrap, "subscribe": names.input, "startingOffsets": "earliest",
                   "kafka.group.id": names.group, "maxOffsetsPerTrigger": 60_000},
        "format": {"type": "avro", "schema": json.dumps(READER_SCHEMA), "registry": registry_url},
        "transforms": [{"sql": "SELECT * FROM input WHERE length(identifyNumber) = 18"}],
        "window": window,
        "output": {"value": "identifyNumber"},
        "sink": {"topic": names.output, "deliveryGuarantee": "exactly_once",
                 "options": {"kafka.transaction.timeout.ms": 600_000,
                             **({"transactionalIdPrefix": names.prefix} if names.prefix else {})}},
        "checkpoint": str(checkpoint),
        # The crash drill kills the driver at most every few seconds, and only after it committed a batch.
        "restart": {"strategy": "failure-rate", "max-failures-per-interval": 10, "failure-rate-interval": "1 minute",
                    "delay": "1 second"},
        "bad_records": {"policy": "dead-letter", "topic": names.dead_letter},
    }


# Settings whose values are no secret: written into the demo's job file as they are. Any other value could be one
# (a password, a key, a token, a JAAS or OAUTHBEARER configuration) and is not.
PLAIN_SETTINGS = ("security.protocol", "sasl.mechanism", "sasl.mechanisms", "sasl.username", "ssl.ca.location",
                  "ssl.endpoint.identification.algorithm", "enable.ssl.certificate.verification", "client.id")


def kafka_section(kafka_config: Mapping[str, str]) -> dict[str, str]:
    """The job file's `kafka:` section for the settings the demo was given. Only settings known to hold no secret
    are written into the file; each other one names an environment variable of this process, which the job's
    driver inherits."""
    section = {}
    for key, value in kafka_config.items():
        if key not in PLAIN_SETTINGS:
            variable = "SPARKEOS_DEMO_" + re.sub(r"[^A-Z0-9]", "_", key.upper())
            os.environ[variable] = value
            value = "${" + variable + "}"
        section[key] = value
    return section


def count_committed(bootstrap: str, topic: str, kafka_config: Mapping[str, str] | None = None) -> int:
    """Records of `topic` visible to read_committed readers, read to its end. The count is progress shown while
    the job runs, so a read that times out shows what it counted so far instead of ending the demo."""
    try:
        return count_records(bootstrap, topic, timeout_s=60, config={**(kafka_config or {}), **QUIET_CLIENT})
    except ReadTimeout as timed_out:
        return timed_out.records_read


def status_table(state: dict) -> Table:
    table = Table(title="sparkeos demo: people -> 18-character ID numbers, exactly once")
    for column in ("records in", "input", "lag", "delivered", "dead-lettered", "batches", "restarts", "elapsed"):
        table.add_column(column, justify="right")
    table.add_row(*(str(state.get(key, "")) for key in ("done", "input", "lag", "delivered", "dead", "batches",
                                                        "restarts", "elapsed")))
    return table


class ExistingCluster:
    """A cluster the demo did not start (--bootstrap-servers), with the demo's schema registry beside it, in this
    process, keeping its schemas in the run's own topic."""

    def __init__(self, bootstrap: str, schemas_topic: str, kafka_config: Mapping[str, str] | None = None):
        from .registry import SchemaRegistryServer

        self.bootstrap_servers = bootstrap
        self.registry = SchemaRegistryServer(bootstrap, topic=schemas_topic, kafka_config=kafka_config)

    @property
    def schema_registry_url(self) -> str:
        return self.registry.url

    def start(self) -> ExistingCluster:
        self.registry.start()
        return self

    def stop(self) -> None:
        self.registry.stop()


def run_demo(records: int, data_dir: Path | None, crash_every: float | None, event_time: bool, as_json: bool,
             partitions: int = 2, seed: int = 42, timeout_s: float = 900, bootstrap_servers: str | None = None,
             keep_topics: bool = False, kafka_config: Mapping[str, str] | None = None) -> int:
    """Exit status: 0 when the audit found the output exact, 1 when not, 2 when --bootstrap-servers is unreachable.
    A preset of the chaos engine (sparkeos.chaos.engine): the demo's sandbox and input, driver kills as its fault.
    `kafka_config`: librdkafka settings for the cluster of `bootstrap_servers` (a secured one's), which every
    client of the run takes, the job's too."""
    kafka_config = {key: value for key, value in (kafka_config or {}).items() if key != "bootstrap.servers"}
    from .chaos.engine import ChaosRun, ChaosSettings, PreparedRun
    from .chaos.sandbox import Sandbox, Topics
    from .jobs.spec import load_job

    console = Console(stderr=as_json)
    if bootstrap_servers:
        try:
            check_reachable(bootstrap_servers, kafka_config)
        except Unreachable as error:
            console.print(f"[red]{error}[/]", highlight=False, soft_wrap=True)
            return 2
    workdir = Path(data_dir) if data_dir else Path(tempfile.mkdtemp(prefix="sparkeos-demo-"))
    workdir.mkdir(parents=True, exist_ok=True)
    names = DemoTopics.for_run() if bootstrap_servers else DEFAULT_TOPICS
    stack: ExistingCluster | StackProcess = (
        ExistingCluster(bootstrap_servers, names.schemas, kafka_config) if bootstrap_servers
        else StackProcess(workdir / "broker", schema_registry=True))
    stack.start()
    try:
        bootstrap = stack.bootstrap_servers
        registry_url = stack.schema_registry_url
        create_topics(bootstrap, partitions, names, kafka_config)
        generated = produce_people(bootstrap, registry_url, records, seed, late_sentinel=event_time,
                                   topic=names.input, kafka_config=kafka_config)
        where = f"topics {names.prefix}-*" if names.prefix else "broker"
        console.print(f"{where} on {bootstrap}, schema registry {registry_url}, {generated.records} records produced "
                      f"({generated.valid} with 18-character ID numbers, {generated.corrupt} corrupt), "
                      f"workdir {workdir}", highlight=False)
        job_path = workdir / "job.yaml"
        document = job_document(bootstrap, registry_url, workdir / "checkpoint", event_time, names)
        if kafka_config:
            document["kafka"] = kafka_section(kafka_config)
        job_path.write_text(yaml.safe_dump(document, sort_keys=False))
        sandbox = Sandbox(workdir, stack if isinstance(stack, StackProcess) else None, None, job_path,
                          load_job(job_path), Topics(names.input, names.output, names.dead_letter),
                          {"Kafka": bootstrap}, named_kafka=bootstrap if names.prefix else None,
                          registry=Registry.of(registry_url))
        watch = Watch(bootstrap, names, generated, kafka_config)
        settings = ChaosSettings(faults={"driver-kill": crash_every} if crash_every else {}, seed=seed,
                                 partitions=partitions, master="local[2]", timeout_s=timeout_s, workdir=workdir)
        with Live(status_table({}), console=console, refresh_per_second=2) as live:
            def shown(report: ChaosReport) -> None:
                live.update(status_table(watch.state(report)))

            report = ChaosRun(job_path, settings, shown, PreparedRun(sandbox, generated.records, generated.corrupt,
                                                                     watch.done)).run()
            live.update(status_table(watch.state(report)))
        if watch.stalled:
            console.print(f"[red]the output stopped growing for {STALL_S} s short of what is expected[/]")
        for problem in report.problems:  # the run's own: timed out, gave up, left pending, not audited
            console.print(f"[red]{problem}[/]", highlight=False, soft_wrap=True)
        audit = report.audit
        counts = ("expected", "delivered", "missing", "duplicated", "unexpected")
        summary = {key: getattr(audit.output, key) if audit else None for key in counts}
        summary.update(dead_lettered=(audit.dead_letter.delivered if audit.dead_letter else 0) if audit else None,
                       restarts=report.restarts, seconds=report.seconds)
        exact = (report.exact and summary["expected"] == generated.valid
                 and summary["dead_lettered"] == generated.corrupt)
        summary["exact"] = exact
        if names.prefix:
            summary["prefix"] = names.prefix
        console.print(final_table(summary))
    finally:
        stack.stop()
    if names.prefix:
        if exact and not keep_topics:
            left = delete_run(bootstrap, names, kafka_config)
            if left:
                console.print(f"[yellow]could not delete {', '.join(left)}[/]", highlight=False, soft_wrap=True)
            else:
                console.print(f"deleted the run's topics and consumer groups ({names.prefix}-*)", highlight=False)
        else:
            console.print(f"kept the run's topics ({', '.join(names.topics)}, {names.schemas}) and consumer group "
                          f"{names.group} for inspection", highlight=False)
    if as_json:
        print(json.dumps(summary), flush=True)
    return 0 if exact else 1


class Watch:
    """The demo's live view of a run, and its rule for when the job is done: all of the input processed (the chaos
    engine's rule) and every valid record delivered and every corrupt one dead-lettered, or the output stopped
    growing for STALL_S short of that. On event time, output short for NUDGE_S gets the late sentinel again
    (`nudge`)."""

    def __init__(self, bootstrap: str, names: DemoTopics, generated: Generated,
                 kafka_config: Mapping[str, str] | None = None):
        self.bootstrap, self.names, self.generated = bootstrap, names, generated
        self.kafka_config = kafka_config
        self.last_nudge = 0.0
        self.nudge_errors: list[str] = []
        self.counts: tuple[int, int] | None = None
        self.last_change = time.monotonic()
        self.stalled = False

    def done(self) -> bool:
        counts = (count_committed(self.bootstrap, self.names.output, self.kafka_config),
                  count_committed(self.bootstrap, self.names.dead_letter, self.kafka_config))
        now = time.monotonic()
        if counts != self.counts:
            self.counts, self.last_change = counts, now
        sentinel = self.generated.sentinel
        if sentinel is not None and counts[0] < self.generated.valid and now - self.last_change > NUDGE_S and \
                now - self.last_nudge > NUDGE_S:
            self.last_nudge = now
            try:
                nudge(self.bootstrap, self.names.input, sentinel, self.kafka_config)
            except (KafkaException, RuntimeError) as error:  # the cluster away for a moment: the next try may do
                self.nudge_errors.append(str(error))
            return False
        self.stalled = now - self.last_change > STALL_S
        return (counts[0] >= self.generated.valid and counts[1] >= self.generated.corrupt) or self.stalled

    def state(self, report: ChaosReport) -> dict:
        """The status table's row: the job's progress from the report's last sample (input offsets, as the source
        reads them), the counts once it is done."""
        sample = report.samples[-1] if report.samples else None
        done = sample.processed if sample and sample.processed is not None else 0
        lag = sample.lag if sample and sample.lag is not None else None
        state = {"done": done, "input": "" if lag is None else done + lag, "lag": "" if lag is None else lag,
                 "restarts": report.restarts if not sample else sample.restarts,
                 "batches": "" if not sample or sample.batch is None else sample.batch,
                 "elapsed": f"{sample.at if sample else 0:.0f} s"}
        if self.counts is not None:
            state["delivered"], state["dead"] = self.counts
        return state


def final_table(summary: dict) -> Table:
    table = Table(title="sparkeos demo: audit (read_committed, independent of the job)")
    for column in ("expected", "delivered", "missing", "duplicated", "dead-lettered", "restarts", "result"):
        table.add_column(column, justify="right")
    result = "[green]exact[/]" if summary["exact"] else "[red]NOT exact[/]"
    table.add_row(*("-" if summary[k] is None else str(summary[k])
                    for k in ("expected", "delivered", "missing", "duplicated", "dead_lettered", "restarts")), result)
    return table


if __name__ == "__main__":  # pragma: no cover
    sys.exit(run_demo(2000, None, None, False, False))
