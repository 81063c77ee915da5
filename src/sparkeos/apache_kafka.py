"""Apache Kafka itself, on this machine: a single node or an N-node KRaft cluster, for `sparkeos chaos
--kafka-version` (nodes of the run's own, which it may kill) and for the tests and benchmarks.

Each node is a combined broker and controller (`process.roles=broker,controller`) on free loopback ports, with
static voters. Replication is set as a real cluster sets it: replication factor min(3, N) for new and internal
topics, `min.insync.replicas` min(2, N), so a 3-node cluster keeps taking writes while one node is down. The
internal topics have 10 partitions instead of 50, to start faster on two cores; nothing of ours depends on the count.

The jars come from Maven Central (`org.apache.kafka:kafka_2.13` and its runtime dependencies, plus the logging
binding Kafka's own distribution ships) through the shared cache of maven.py; `scripts/fetch_jars.py` fetches them
ahead of time, as `.ci/run` does. Each node logs to `<node dir>/server.log`. Only the standard library is imported at
module level: scripts/fetch_jars.py imports this module with the system Python.

    with ApacheKafkaCluster(tmp_path, "4.4.0", nodes=3) as cluster:
        cluster.bootstrap_servers          # "127.0.0.1:p1,127.0.0.1:p2,127.0.0.1:p3"
        cluster.kill(cluster.leader_of("t", 0))   # kill -9
        cluster.restart(node_id)           # same data, same ports; returns once it serves again
"""

from __future__ import annotations

import base64
import ctypes
import json
import os
import shutil
import signal
import subprocess
import time
import uuid
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from . import class_archives
from .maven import cached_jars, is_cached
from .ports import free_port

# The newest release of each line Maven Central serves here: 4.x, and 3.9.x for the many users still on 3.
VERSIONS = ("4.4.0", "3.9.2")
# Kafka's distribution ships a logging binding the Maven artifact leaves out: log4j 2 from 4.0 on, reload4j before.
_LOGGING = {
    4: ["org.apache.logging.log4j:log4j-slf4j-impl:2.25.5"],
    3: ["org.slf4j:slf4j-reload4j:1.7.36"],
}

START_TIMEOUT_S = 120.0
INTERNAL_TOPIC_PARTITIONS = 10
HEAP = "-Xmx512m"
_LOG4J2 = """\
appender.file.type = File
appender.file.name = file
appender.file.fileName = {log}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = file
logger.kafka-request.name = kafka.request.logger
logger.kafka-request.level = {request_level}
"""
_LOG4J1 = """\
log4j.rootLogger=INFO, file
log4j.appender.file=org.apache.log4j.FileAppender
log4j.appender.file.File={log}
log4j.appender.file.layout=org.apache.log4j.PatternLayout
log4j.appender.file.layout.ConversionPattern=[%d] %p %m (%c)%n
log4j.logger.kafka.request.logger={request_level}
"""


def major(version: str) -> int:
    return int(version.split(".")[0])


def _coordinates(version: str) -> list[str]:
    if major(version) not in _LOGGING:
        raise ValueError(f"Apache Kafka {version}: only 3.x and 4.x are supported here")
    return [f"org.apache.kafka:kafka_2.13:{version}", *_LOGGING[major(version)]]


def kafka_jars(version: str) -> list[Path]:
    """The broker's classpath for one Kafka version, fetched on first use."""
    return cached_jars(f"kafka-{version}", _coordinates(version))


def kafka_jars_cached(version: str) -> bool:
    """Whether `kafka_jars(version)` needs no download."""
    return is_cached(f"kafka-{version}", _coordinates(version))


# How many sets of ports a cluster's first start tries, when another process takes one before Kafka binds it.
PORT_ATTEMPTS = 3


class KafkaStartFailed(RuntimeError):
    """A node exited or did not serve in time; the message holds the end of its log."""


def _die_with_parent() -> None:
    # A test process killed by its timeout must not leave brokers running on the machine.
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


@dataclass(frozen=True)
class SaslSsl:
    """A client listener as production clusters run it: SASL_SSL with SCRAM users made at format time (Kafka's
    `kafka-storage format --add-scram`, 3.5 on), and Kafka's StandardAuthorizer with its default
    `allow.everyone.if.no.acl.found=false`, so that a user may do only what an ACL allows. The nodes' traffic among
    themselves and with the controllers stays on PLAINTEXT listeners of their own, whose principal (ANONYMOUS) is a
    super user."""

    keystore: Path  # PEM: the nodes' private key (PKCS#8, unencrypted), then its certificate chain
    ca: Path  # PEM: the authority that signed it, which clients trust
    users: Mapping[str, str] = field(repr=False)  # user name -> password
    super_users: tuple[str, ...] = ()
    mechanism: str = "SCRAM-SHA-512"

    def __post_init__(self) -> None:
        strangers = [user for user in self.super_users if user not in self.users]
        if strangers:
            raise ValueError(f"super user {strangers[0]!r} is not among the users, who are made at format time")

    def client_config(self, bootstrap_servers: str, user: str) -> dict[str, str]:
        """librdkafka's settings to connect as `user`."""
        return {"bootstrap.servers": bootstrap_servers, "security.protocol": "SASL_SSL",
                "sasl.mechanism": self.mechanism, "sasl.username": user, "sasl.password": self.users[user],
                "ssl.ca.location": str(self.ca)}

    def broker_settings(self) -> dict[str, object]:
        return {
            "sasl.enabled.mechanisms": self.mechanism,
            f"listener.name.sasl_ssl.{self.mechanism.lower()}.sasl.jaas.config":
                "org.apache.kafka.common.security.scram.ScramLoginModule required;",
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(self.keystore),
            "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "super.users": ";".join(f"User:{user}" for user in (*self.super_users, "ANONYMOUS")),
        }

    def format_arguments(self) -> list[str]:
        # Quoted: a password may hold the format's separators (`,`, `]`).
        return [argument for user, password in self.users.items()
                for argument in ("--add-scram", f'{self.mechanism}=[name={user},password="{password}"]')]


@dataclass
class KafkaNode:
    node_id: int
    port: int
    controller_port: int
    directory: Path
    # A PLAINTEXT listener for the nodes' own traffic, when clients connect elsewhere (a proxy, a secured listener).
    internal_port: int | None = None
    process: subprocess.Popen | None = field(default=None, repr=False)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def log(self) -> Path:
        return self.directory / "server.log"

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def port_was_taken(self) -> bool:
        """Whether the node's last start failed to bind one of its ports."""
        text = "".join(path.read_text(errors="replace")[-20000:] for path in (self.directory / "stdout.log", self.log)
                       if path.exists())
        return "Address already in use" in text

    def log_tail(self, lines: int = 40) -> str:
        text = ""
        for path in (self.directory / "stdout.log", self.log):
            if path.exists():
                text += f"--- {path.name}\n" + "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) + "\n"
        return text


class ApacheKafkaCluster:
    """N combined broker+controller nodes of one Kafka version, started from a shared jar cache."""

    def __init__(self, root: Path, version: str = VERSIONS[0], nodes: int = 1, *,
                 settings: Mapping[str, object] | None = None, features: Mapping[str, int] | None = None,
                 log_requests: bool = False, advertised_port: int | None = None, sasl_ssl: SaslSsl | None = None):
        """`settings` are broker settings (server.properties keys) added to or replacing the defaults; `features`
        are feature levels given at format time (`kafka-storage format --feature`, 4.x), e.g.
        {"transaction.version": 1} for the first transaction protocol. `log_requests` logs every request a node
        completes (Kafka's request logger at DEBUG), read back with `requests_seen`. `advertised_port` (one node
        only) is the port clients are told to connect to, a proxy's in front of the node; the node's traffic to
        itself (transaction verification, KIP-890) then takes a listener of its own, not the proxy. `sasl_ssl`
        makes the client listener a secured one (SaslSsl); `client_config(user)` then says how to connect."""
        if nodes < 1:
            raise ValueError(f"a cluster needs at least one node, got {nodes}")
        if advertised_port is not None and nodes != 1:
            raise ValueError("advertised_port applies to a one-node cluster")
        if features and major(version) < 4:
            raise ValueError(f"Apache Kafka {version} takes no --feature at format time")
        if sasl_ssl is not None and tuple(int(part) for part in version.split(".")[:2]) < (3, 5):
            raise ValueError(f"Apache Kafka {version} makes no SCRAM users at format time (3.5 on does)")
        self.version = version
        self.root = Path(root)
        self.settings = dict(settings or {})
        self.features = dict(features or {})
        self.log_requests = log_requests
        self.advertised_port = advertised_port
        self.sasl_ssl = sasl_ssl
        self._internal_listener = advertised_port is not None or sasl_ssl is not None
        self.cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        self.nodes = {
            node_id: KafkaNode(node_id, free_port(), free_port(), self.root / f"node-{node_id}",
                               free_port() if self._internal_listener else None)
            for node_id in range(1, nodes + 1)
        }
        self._java = shutil.which("java")
        if self._java is None:
            raise KafkaStartFailed("`java` is not on PATH: Apache Kafka needs a JDK 17 (openjdk-17-jdk-headless)")
        jars = kafka_jars(version)
        self._classpath = os.pathsep.join(str(jar) for jar in jars)
        self.class_archive = class_archives.archive_path(f"kafka-{version}", self._java, jars)
        # The nodes' JVMs map the version's class archive once one exists (make_class_archive).
        self._java_options = class_archives.use_options(self.class_archive)
        self._formatted = False

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(node.address for node in self.nodes.values())

    def client_config(self, user: str | None = None) -> dict[str, str]:
        """librdkafka's settings to reach the cluster: on a secured one as `user` (one of sasl_ssl's users)."""
        if self.sasl_ssl is None:
            if user is not None:
                raise ValueError(f"{self} is not secured: it has no user {user!r}")
            return {"bootstrap.servers": self.bootstrap_servers}
        if user is None:
            raise ValueError(f"{self} is secured: name one of its users ({', '.join(self.sasl_ssl.users)})")
        return self.sasl_ssl.client_config(self.bootstrap_servers, user)

    def _admin_config(self, bootstrap_servers: str) -> dict[str, str]:
        if self.sasl_ssl is None:
            return {"bootstrap.servers": bootstrap_servers}
        user = next(iter(self.sasl_ssl.super_users), None)
        if user is None:
            raise ValueError(f"{self} is secured without a super user, which starting it and finding leaders need")
        return self.sasl_ssl.client_config(bootstrap_servers, user)

    def __enter__(self) -> ApacheKafkaCluster:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"ApacheKafkaCluster({self.version}, {len(self.nodes)} node(s), {self.bootstrap_servers})"

    def broker_settings(self, node: KafkaNode) -> dict[str, object]:
        count = len(self.nodes)
        replicas, min_isr = min(3, count), min(2, count)
        voters = ",".join(f"{other.node_id}@127.0.0.1:{other.controller_port}" for other in self.nodes.values())
        listeners: dict[str, object] = {
            "listeners": f"PLAINTEXT://127.0.0.1:{node.port},CONTROLLER://127.0.0.1:{node.controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{node.port}",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        }
        if node.internal_port is not None:
            client = "SASL_SSL" if self.sasl_ssl is not None else "PLAINTEXT"
            internal = f"INTERNAL://127.0.0.1:{node.internal_port}"
            listeners = {
                "listeners": f"{client}://127.0.0.1:{node.port},CONTROLLER://127.0.0.1:{node.controller_port},"
                             f"{internal}",
                "advertised.listeners": f"{client}://127.0.0.1:{self.advertised_port or node.port},{internal}",
                "inter.broker.listener.name": "INTERNAL",
                "listener.security.protocol.map": f"{client}:{client},CONTROLLER:PLAINTEXT,INTERNAL:PLAINTEXT",
            }
        return {
            "process.roles": "broker,controller",
            "node.id": node.node_id,
            "controller.quorum.voters": voters,
            "controller.listener.names": "CONTROLLER",
            **listeners,
            **(self.sasl_ssl.broker_settings() if self.sasl_ssl is not None else {}),
            "log.dirs": str(node.directory / "data"),
            # Set by every real cluster, so their configs' source is the broker's static config; a single node
            # keeps Kafka's defaults (1 and 1), as the embedded broker does.
            **({"default.replication.factor": replicas, "min.insync.replicas": min_isr} if count > 1 else {}),
            "offsets.topic.replication.factor": replicas,
            "offsets.topic.num.partitions": INTERNAL_TOPIC_PARTITIONS,
            "transaction.state.log.replication.factor": replicas,
            "transaction.state.log.min.isr": min_isr,
            "transaction.state.log.num.partitions": INTERNAL_TOPIC_PARTITIONS,
            "group.initial.rebalance.delay.ms": 0,
            # Kafka aborts a transaction past its timeout when this check runs (10 s by default): tests that wait
            # for such an abort would wait up to 10 s more.
            "transaction.abort.timed.out.transaction.cleanup.interval.ms": 1000,
            **self.settings,
        }

    # --- life cycle ---------------------------------------------------------------------------------------------

    def start(self) -> ApacheKafkaCluster:
        if not self._formatted:
            for node in self.nodes.values():
                self._format(node)
            self._formatted = True
        for attempt in range(1, PORT_ATTEMPTS + 1):
            for node in self.nodes.values():
                self._launch(node)
            try:
                for node in self.nodes.values():
                    self._wait_serving(node)
                return self
            except KafkaStartFailed:
                self.stop()
                # The ports were free when chosen; something took one before Kafka bound it. Nothing but the
                # configs names them yet (the voters are static), so the nodes start on others.
                if attempt == PORT_ATTEMPTS or not any(node.port_was_taken() for node in self.nodes.values()):
                    raise
                for node in self.nodes.values():
                    node.port, node.controller_port = free_port(), free_port()
                    if node.internal_port is not None:
                        node.internal_port = free_port()
            except BaseException:
                self.stop()
                raise
        return self

    def kill(self, node_id: int) -> None:
        """kill -9 of one node; its data and ports stay for restart()."""
        node = self.nodes[node_id]
        if node.process is not None:
            node.process.kill()
            node.process.wait()

    def restart(self, node_id: int) -> None:
        """Start a node that was killed or stopped again, and return once it serves."""
        node = self.nodes[node_id]
        if node.alive():
            raise RuntimeError(f"node {node_id} is running; kill it first")
        self._launch(node)
        self._wait_serving(node)

    def stop(self) -> None:
        for node in self.nodes.values():
            if node.process is not None and node.process.poll() is None:
                node.process.kill()
                node.process.wait()

    # --- where things are ---------------------------------------------------------------------------------------

    def leader_of(self, topic: str, partition: int) -> int:
        """The node that leads a partition now."""
        metadata = self._admin().list_topics(topic, timeout=10)
        found = metadata.topics.get(topic)
        if found is None or found.error is not None or partition not in found.partitions:
            raise KeyError(f"{topic}-{partition} not in the metadata of {self}")
        return found.partitions[partition].leader

    def transaction_coordinator(self, transactional_id: str) -> int:
        """The node that leads the `__transaction_state` partition of a transactional id, as Kafka places it:
        abs(String.hashCode()) % the topic's partition count."""
        metadata = self._admin().list_topics("__transaction_state", timeout=10)
        partitions = metadata.topics["__transaction_state"].partitions
        if not partitions:
            raise KeyError(f"__transaction_state has no partitions yet on {self}: no producer initialised one")
        return partitions[_java_string_hash_abs(transactional_id) % len(partitions)].leader

    def format_output(self, node_id: int = 1) -> str:
        """What `kafka-storage format` printed for a node: the bootstrap metadata, with its feature levels."""
        return (self.nodes[node_id].directory / "format.log").read_text()

    def requests_seen(self, node_id: int = 1) -> Counter[tuple[str, int]]:
        """(API name, version) of every request the node completed from a client, counted; needs `log_requests`."""
        if not self.log_requests:
            raise RuntimeError(f"{self} does not log requests: create it with log_requests=True")
        seen: Counter[tuple[str, int]] = Counter()
        for line in self.nodes[node_id].log.read_text(errors="replace").splitlines():
            start = line.find("Completed request:")
            if start >= 0:
                header = json.loads(line[start + len("Completed request:"):].rsplit(" (kafka.request.logger)", 1)[0])
                header = header["requestHeader"]
                seen[(header["requestApiKeyName"], header["requestApiVersion"])] += 1
        return seen

    def _admin(self):
        from confluent_kafka.admin import AdminClient

        return AdminClient(self._admin_config(self.bootstrap_servers))

    # --- processes ----------------------------------------------------------------------------------------------

    def _properties(self, node: KafkaNode) -> Path:
        node.directory.mkdir(parents=True, exist_ok=True)
        path = node.directory / "server.properties"
        path.write_text("".join(f"{key}={value}\n" for key, value in self.broker_settings(node).items()))
        return path

    def _format(self, node: KafkaNode) -> None:
        command = [self._java, HEAP, *class_archives.use_options(self.class_archive), "-cp", self._classpath,
                   "kafka.tools.StorageTool", "format",
                   # One argument, as an id may start with "-" (base64 of random bytes).
                   f"--cluster-id={self.cluster_id}", "-c", str(self._properties(node))]
        for name, level in self.features.items():
            command += ["--feature", f"{name}={level}"]
        if self.sasl_ssl is not None:
            command += self.sasl_ssl.format_arguments()
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=START_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            # Not the command itself in the message: it holds the users' passwords.
            raise KafkaStartFailed(f"formatting node {node.node_id} of {self} took over {START_TIMEOUT_S:.0f} s") \
                from None
        (node.directory / "format.log").write_text(done.stdout + done.stderr)
        if done.returncode != 0:
            raise KafkaStartFailed(f"formatting node {node.node_id} of {self} failed:\n{done.stdout}\n{done.stderr}")

    def _launch(self, node: KafkaNode) -> None:
        properties = self._properties(node)
        logging_config = node.directory / "log4j.properties"
        request_level = "DEBUG" if self.log_requests else "WARN"
        if major(self.version) >= 4:
            logging_config.write_text(_LOG4J2.format(log=node.log, request_level=request_level))
            logging_flag = f"-Dlog4j2.configurationFile={logging_config}"
        else:
            logging_config.write_text(_LOG4J1.format(log=node.log, request_level=request_level))
            logging_flag = f"-Dlog4j.configuration=file:{logging_config}"
        with open(node.directory / "stdout.log", "ab") as output:
            node.process = subprocess.Popen(
                [self._java, HEAP, *self._java_options, "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20",
                 "-XX:+ExitOnOutOfMemoryError", "-Djava.awt.headless=true", logging_flag,
                 f"-Dkafka.logs.dir={node.directory}", "-cp", self._classpath, "kafka.Kafka", str(properties)],
                stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT,
                start_new_session=True, preexec_fn=_die_with_parent,
            )

    def _wait_serving(self, node: KafkaNode) -> None:
        """Until the node itself answers a metadata request that lists it: a KRaft broker opens its client
        listener only once it has caught up with the metadata log and is unfenced."""
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({**self._admin_config(node.address), "socket.connection.setup.timeout.ms": 2000,
                             "reconnect.backoff.max.ms": 200, "log_level": 0})
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if not node.alive():
                raise KafkaStartFailed(f"node {node.node_id} of {self} exited\n{node.log_tail()}")
            try:
                metadata = admin.list_topics(timeout=1)
            except Exception:  # noqa: BLE001 - not listening yet (KafkaException of a transport error)
                continue
            # The first answer can only come from the node itself: the client knows no other broker before it.
            if node.node_id in metadata.brokers:
                return
        raise KafkaStartFailed(f"node {node.node_id} of {self} did not serve in {START_TIMEOUT_S:.0f} s\n"
                               f"{node.log_tail()}")


def make_class_archive(version: str, root: Path) -> bool:
    """Make the class-data-sharing archive of ``version``'s nodes (class_archives.py) unless it exists; whether one
    exists now. A one-node cluster is started in ``root`` and serves, then its node is stopped with SIGTERM: Kafka
    shuts down and its JVM writes the classes it loaded as it exits."""
    cluster = ApacheKafkaCluster(root, version)
    if cluster.class_archive.is_file():
        return True
    cluster._java_options, written = class_archives.dump_options(cluster.class_archive)
    try:
        cluster.start()
        process = cluster.nodes[1].process
        assert process is not None
        process.terminate()
        process.wait(timeout=START_TIMEOUT_S)
        return class_archives.publish(written, cluster.class_archive)
    finally:
        cluster.stop()
        written.unlink(missing_ok=True)


def _java_string_hash_abs(text: str) -> int:
    """Kafka's Utils.abs(String.hashCode()): Java's 32-bit string hash over UTF-16 code units; Utils.abs maps
    Integer.MIN_VALUE to 0."""
    value = 0
    for unit in _utf16_units(text):
        value = (31 * value + unit) & 0xFFFFFFFF
    signed = value - (1 << 32) if value >= 1 << 31 else value
    return 0 if signed == -(1 << 31) else abs(signed)


def _utf16_units(text: str) -> list[int]:
    encoded = text.encode("utf-16-be")
    return [int.from_bytes(encoded[index:index + 2], "big") for index in range(0, len(encoded), 2)]
