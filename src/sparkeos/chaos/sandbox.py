"""Where `sparkeos chaos` runs a job: a sandbox of processes it started itself, so that every process it kills is
its own. The embedded broker with its schema registry, a PostgreSQL server when the job writes to one, and a work
directory for the checkpoint and a file sink's output. The job file is copied with its endpoints pointed there,
nothing else changed; the production endpoints it names are never contacted, unless `--sample-input` is given (then
its input topic and schema registry are read, never written) or `--use-job-endpoints` (below).

With `--kafka-version`, a node of Apache Kafka that the run starts (jars from the cache of sparkeos.apache_kafka) takes
the embedded broker's place, and is faulted as it would be. A Kafka named on the command line (`--bootstrap-server`)
takes it too: the run then creates topics of its own there (the job's names behind a prefix of the run's), and gives
the job's consumer group and transactionalIdPrefix the same prefix, so that nothing of the job's own on that cluster
is read, written or fenced. With `--use-job-endpoints` every endpoint the job file names takes the sandbox's place,
the same way: the Kafka, the schema registry, and the sink's store, where the run writes to a target of its own beside
the job's (each sink's data source says where: `target_beside`).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
import yaml
from confluent_kafka.admin import AdminClient, NewTopic
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from ..apache_kafka import ApacheKafkaCluster
from ..jobs.quiet import librdkafka_log_level
from ..jobs.spec import EXACT_FILE_SINK, FILE_SINKS, POSTGRES_SINK, JobSpec, load_job
from ..ports import free_port
from ..registry.client import Registry
from ..spark import sink_data_source
from ..spark.kafka.options import DEFAULT_MARKER_TOPIC
from ..spark.postgres.options import parse_postgres_sink_options
from ..spark.postgres.sink import describe_url
from ..stack import StackProcess
from .postgres import PostgresServer
from .proxy import TcpProxy

QUIET_CLIENT = {"log_level": librdkafka_log_level("WARNING")}
STORES = {EXACT_FILE_SINK: "files", POSTGRES_SINK: "PostgreSQL"}  # a sink's store as the report names it
OUTPUT_PARTITIONS = 2


class SandboxError(ValueError):
    """The job cannot run in the sandbox as it is written; the message says why and what to change."""


class ApacheKafkaNode:
    """The one Apache Kafka node of a run, crashed and started again as the broker-kill fault does it."""

    def __init__(self, cluster: ApacheKafkaCluster):
        self.cluster = cluster

    def crash(self) -> None:
        self.cluster.kill(1)

    def start(self) -> None:
        self.cluster.restart(1)


@dataclass
class Topics:
    input: str
    output: str | None  # a Kafka sink's
    dead_letter: str | None


@dataclass
class Sandbox:
    """The sandbox's processes; `job_path` is the job file pointed at them."""

    workdir: Path
    stack: StackProcess | None  # the embedded broker (or, beside a Kafka named on the command line, the registry)
    postgres: PostgresServer | None
    job_path: Path
    spec: JobSpec
    topics: Topics
    endpoints: dict[str, str] = field(default_factory=dict)
    kafka_proxy: TcpProxy | None = None  # the broker advertises it: every client's connection runs through it
    postgres_proxy: TcpProxy | None = None  # between the job and PostgreSQL
    named_kafka: str | None = None  # the bootstrap servers of a Kafka named on the command line
    apache_kafka: ApacheKafkaCluster | None = None  # the Apache Kafka node the run started, if any
    registry: Registry | None = None  # the schema registry the run registers the input's schemas with (Avro)

    @property
    def bootstrap(self) -> str:
        if self.apache_kafka is not None:
            return self.apache_kafka.bootstrap_servers
        return self.named_kafka or self.stack.bootstrap_servers

    @property
    def kafka_config(self) -> dict[str, str]:
        """What the run's own clients connect to its Kafka with: the servers, and on a cluster named on the command
        line the security settings of the job's `kafka:` section (`load_for_run`)."""
        return {**self.spec.kafka_client_config(), "bootstrap.servers": self.bootstrap}

    @property
    def kafka_server(self) -> StackProcess | ApacheKafkaNode:
        """The broker that the broker-kill fault crashes and starts again."""
        return ApacheKafkaNode(self.apache_kafka) if self.apache_kafka is not None else self.stack

    def stop(self) -> None:
        try:
            if self.apache_kafka is not None:
                self.apache_kafka.stop()
            if self.stack is not None:
                self.stack.stop()
        finally:
            for proxy in (self.kafka_proxy, self.postgres_proxy):
                if proxy is not None:
                    proxy.stop()
            if self.postgres is not None:
                self.postgres.destroy()


def check_runnable(spec: JobSpec) -> str:
    """The job's one input topic; SandboxError for what the sandbox cannot run."""
    subscribe = spec.source.get("subscribe")
    if not subscribe or "," in subscribe:
        named = ", ".join(f"{k}: {v}" for k, v in spec.source.items()
                          if k in ("subscribe", "subscribePattern", "assign"))
        raise SandboxError(f"sparkeos chaos feeds one input topic: the job's source must name it with subscribe "
                           f"(found {named})")
    if spec.sink.format in FILE_SINKS:
        raise SandboxError(f"the job writes with Spark's {spec.sink.format} sink, exact only for readers of its "
                           f"_spark_metadata: sparkeos chaos audits what any reader sees; use {EXACT_FILE_SINK}")
    if spec.sink.format == POSTGRES_SINK and str(spec.sink.options.get("createTable", "")).lower() != "true":
        raise SandboxError("the sandbox's PostgreSQL starts empty: the job must create its table (sink option "
                           "createTable: true)")
    return subscribe


# Stands for an Avro job's registry in a run that registers the input's schemas with a registry of its own.
RUNS_OWN_REGISTRY = "http://the-runs-own-registry"


def load_for_run(job_file: Path | str, own_kafka: bool, job_endpoints: bool = False) -> JobSpec:
    """The job as a run reads it. Its `kafka:` settings are for its own cluster (its security, secrets from the
    environment): against the run's own broker, which is open, they are left out. Its `format.registry` is its own
    registry's, with its secrets: unless the run uses the job's endpoints, the run's registry stands in for it, and
    the variables it names need not be set."""
    overrides: dict = {"kafka": None} if own_kafka else {}
    if not job_endpoints:
        try:
            document = yaml.safe_load(Path(job_file).read_text())
        except (OSError, yaml.YAMLError):
            document = None  # load_job says what is wrong with the file
        fmt = document.get("format") if isinstance(document, dict) else None
        if isinstance(fmt, dict) and fmt.get("registry") is not None:
            overrides["format"] = {**fmt, "registry": RUNS_OWN_REGISTRY}
    return load_job(job_file, overrides or None)


def kafka_section_for_run(document: dict, bootstrap: str, own_kafka: bool) -> None:
    """The job document's `kafka:` section as the run's copy of the job takes it: left out against the run's own
    broker (see `load_for_run`); else pointed at the run's Kafka, as the sink takes its servers unless it names
    its own."""
    if own_kafka:
        document.pop("kafka", None)
    elif "bootstrap.servers" in (document.get("kafka") or {}):
        document["kafka"]["bootstrap.servers"] = bootstrap


def start_sandbox(job_file: Path, workdir: Path, partitions: int, faults: dict[str, float] | None = None,
                  seed: int = 0, named_kafka: str | None = None, kafka_version: str | None = None,
                  job_endpoints: bool = False) -> Sandbox:
    """Start the sandbox's processes and write the job file pointed at them into `workdir`; the proxies the network
    faults among `faults` need go in front of the broker and PostgreSQL. `named_kafka`: the bootstrap servers of a
    Kafka to run against in place of the embedded broker; `kafka_version`: the Apache Kafka version of a node to
    start in its place; `job_endpoints`: the endpoints the job file names, in place of all of the sandbox's."""
    spec = load_for_run(job_file, own_kafka=not (named_kafka or job_endpoints), job_endpoints=job_endpoints)
    input_topic = check_runnable(spec)
    document = yaml.safe_load(Path(job_file).read_text())
    if job_endpoints:
        named_kafka = _job_kafka(spec)
    workdir.mkdir(parents=True, exist_ok=True)
    faults = faults or {}
    kafka_proxy = TcpProxy(seed=seed).start() if "network-kafka" in faults and not named_kafka else None
    extra = []
    port = 0
    if kafka_proxy is not None:
        port = free_port()
        kafka_proxy.target = ("127.0.0.1", port)
        extra = ["--advertised-listener", kafka_proxy.address]
    avro = spec.format.type == "avro"
    stack = apache = None
    postgres = postgres_proxy = None
    try:
        if kafka_version:
            apache = ApacheKafkaCluster(workdir / "kafka", kafka_version,
                                        advertised_port=kafka_proxy.port if kafka_proxy is not None else None)
            port = apache.nodes[1].port
            if kafka_proxy is not None:
                kafka_proxy.target = ("127.0.0.1", port)
            apache.start()
        if not (named_kafka or apache) or (avro and not job_endpoints):
            # Beside another Kafka, the embedded broker is there for its schema registry.
            stack = StackProcess(workdir / "broker", port=0 if apache else port, schema_registry=avro,
                                 extra_args=[] if apache else extra).start()
        bootstrap = named_kafka or (apache.bootstrap_servers if apache else stack.bootstrap_servers)
        endpoints = {"Kafka": bootstrap}
        broker = f"Apache Kafka {kafka_version}, a node the run started" if apache else "the broker"
        if kafka_proxy is not None:
            endpoints["Kafka"] = (f"{kafka_proxy.address} (the run's proxy, in front of the broker on 127.0.0.1:{port}"
                                  + (f": {broker})" if apache else ")"))
        elif apache is not None:
            endpoints["Kafka"] = f"{bootstrap} ({broker})"
        prefix = f"sparkeos-chaos-{uuid.uuid4().hex[:8]}-" if named_kafka else ""
        if named_kafka:
            input_topic = behind_prefix(document, prefix)
            whose = "the job's own, named in its file" if job_endpoints else "named on the command line"
            endpoints["Kafka"] = (f"{named_kafka} ({whose}; the run's topics and the job's consumer group and "
                                  f"transactionalIdPrefix begin with {prefix})")
        document["source"]["kafka.bootstrap.servers"] = bootstrap
        kafka_section_for_run(document, bootstrap, own_kafka=not named_kafka)
        registry = spec.format.registry if job_endpoints else (
            Registry.of(stack.schema_registry_url) if avro else None)
        if avro and registry is not None:
            # Inline: a schema file named relative to the job file would not be found beside the copy. The job's own
            # registry stays as its file names it, with the variables the copy still names.
            document["format"]["schema"] = spec.format.schema
            if not job_endpoints:
                document["format"]["registry"] = registry.url
            endpoints["schema registry"] = str(registry) + (
                f" (the job's own: the run registers its schemas under subjects of its topics, {prefix}*)"
                if job_endpoints else "")
        sink = document["sink"]
        options = sink.setdefault("options", {}) or {}
        sink["options"] = options
        if spec.sink.is_kafka:
            if "kafka.bootstrap.servers" in options:
                options["kafka.bootstrap.servers"] = bootstrap
        elif job_endpoints:
            try:
                changed, words = sink_data_source(spec.sink.format).target_beside(spec.sink.options, prefix)
            except ValueError as error:
                raise SandboxError(f"--use-job-endpoints: {error}") from error
            for key, value in changed.items():
                if key == "path":
                    sink["path"] = value
                    continue
                for same in [k for k in options if k.lower() == key.lower()]:
                    del options[same]
                options[key] = value
            endpoints[STORES.get(spec.sink.format, spec.sink.format)] = words
        elif spec.sink.format == EXACT_FILE_SINK:
            sink["path"] = str(workdir / "output")
            endpoints["files"] = sink["path"]
        elif spec.sink.format == POSTGRES_SINK:
            postgres = PostgresServer().start()
            options["url"] = postgres.url()
            endpoints["PostgreSQL"] = postgres.url()
        if spec.sink.format == POSTGRES_SINK and "network-postgres" in faults:
            postgres_proxy, url = _postgres_proxy(options, seed + 1)
            options.update({k: url for k in options if k.lower() == "url"})
            endpoints["PostgreSQL"] = (f"{postgres_proxy.address} (the run's proxy, in front of "
                                       f"{endpoints['PostgreSQL']})")
        document["checkpoint"] = str(workdir / "checkpoint")
        job_path = workdir / "job.yaml"
        job_path.write_text(yaml.safe_dump(document, sort_keys=False))
        sandboxed = load_job(job_path)
        topics = Topics(input_topic, sandboxed.sink.options.get("topic") if sandboxed.sink.is_kafka else None,
                        sandboxed.bad_records.topic if sandboxed.bad_records.policy == "dead-letter" else None)
        _create_topics({**sandboxed.kafka_client_config(), "bootstrap.servers": bootstrap}, topics, partitions)
        return Sandbox(workdir, stack, postgres, job_path, sandboxed, topics, endpoints, kafka_proxy, postgres_proxy,
                       named_kafka, apache, registry)
    except BaseException:
        Sandbox(workdir, stack, postgres, job_file, spec, Topics(input_topic, None, None), {}, kafka_proxy,
                postgres_proxy, apache_kafka=apache).stop()
        raise


def _job_kafka(spec: JobSpec) -> str:
    """The one Kafka of the job: its source's, which its sink writes to as well."""
    source = spec.source.get("kafka.bootstrap.servers")
    if not source:
        raise SandboxError("--use-job-endpoints: the job's source names no kafka.bootstrap.servers")
    sink = spec.sink.options.get("kafka.bootstrap.servers") if spec.sink.is_kafka else None
    if sink and sink != source:
        raise SandboxError(f"--use-job-endpoints: the job's sink writes to another Kafka ({sink}) than its source "
                           f"reads ({source}); the run makes its topics on one")
    return source


def _postgres_proxy(options: dict, seed: int) -> tuple[TcpProxy, str]:
    """The run's proxy in front of the PostgreSQL server a sink's options name, and the url that leads through it."""
    parsed = parse_postgres_sink_options(options)
    try:
        parts = conninfo_to_dict(parsed.url)
    except psycopg.Error as error:
        raise SandboxError(f"network-postgres: cannot read the sink's url: {error}") from error
    host, port = str(parts.get("host") or ""), str(parts.get("port") or "5432")
    if not host or host.startswith("/") or "," in host + port:
        raise SandboxError(f"network-postgres puts the run's proxy in front of the job's PostgreSQL server: the "
                           f"sink's url must name one host over TCP (it names {describe_url(parsed.url)})")
    # hostaddr would take libpq past the proxy.
    parts.pop("hostaddr", None)
    proxy = TcpProxy(host, int(port), kafka_framing=False, seed=seed).start()
    return proxy, make_conninfo("", **{**parts, "host": proxy.host, "port": str(proxy.port)})


def behind_prefix(document: dict, prefix: str) -> str:
    """Put the job's own names on a shared cluster behind `prefix`: its topics, its Kafka sink's commit marker topic,
    its consumer group, its transactionalIdPrefix (a producer of the job's own ids would be fenced by the run's;
    without one, a stream's ids come from the run's own query id). The input topic's new name."""
    source = document["source"]
    source["subscribe"] = prefix + source["subscribe"]
    for key in [k for k in source if k.lower() == "kafka.group.id"]:
        source[key] = prefix + str(source[key])
    sink = document["sink"]
    if sink.get("topic"):
        sink["topic"] = prefix + sink["topic"]
    options = sink.get("options") or {}
    for key in [k for k in options if k.lower() in ("topic", "transactionalidprefix", "commitmarkertopic")]:
        options[key] = prefix + str(options[key])
    if (sink.get("format") or "sparkeos.kafka") == "sparkeos.kafka" and not any(
            k.lower() == "commitmarkertopic" for k in options):
        # The run's markers in a topic of its own, not beside those of the cluster's sparkeos jobs.
        options["commitMarkerTopic"] = prefix + DEFAULT_MARKER_TOPIC.lstrip("_")
        sink["options"] = options
    bad = document.get("bad_records") or {}
    if bad.get("topic"):
        bad["topic"] = prefix + bad["topic"]
    return source["subscribe"]


def _create_topics(config: dict[str, str], topics: Topics, partitions: int) -> None:
    bootstrap = config["bootstrap.servers"]
    admin = AdminClient({**config, **QUIET_CLIENT})
    new = [NewTopic(topics.input, partitions)]
    new += [NewTopic(name, OUTPUT_PARTITIONS) for name in (topics.output, topics.dead_letter) if name]
    for name, future in admin.create_topics(new, request_timeout=30).items():
        try:
            future.result(60)
        except Exception as error:  # noqa: BLE001 - said with the cluster's name: a named one may refuse
            raise SandboxError(f"cannot create the run's topic {name} on {bootstrap}: {error}") from error
