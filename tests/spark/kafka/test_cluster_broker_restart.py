"""The connectors' Kafka clients across a broker restart, without Spark.

Driver-side requests (metadata, ListOffsets, OffsetFetch) made while the broker is down must be answered
once it is back within their deadline. librdkafka fails a ListOffsets at once while no leader is known, and
a running query died when its metadata request failed during a 1-3 s outage. A ListOffsets whose connection
closes before the answer comes back (a broker killed with the request in flight) is librdkafka's -1001 with
no error, and must be asked again, not taken for the partition's end.

The sink's transaction start: after its broker went away, librdkafka can block in send_offsets_to_transaction
far past the timeout it was given (confluentinc/librdkafka#5456, #5511); the sink starts every transaction
with that call. Started while the broker was down, the call outlived its 10 s timeout in 4 of 4 tries with
librdkafka 2.16.0: by 34-37 s, or for good. The sink must give up on such a producer within its bound, and a
new producer of the same transactional id must carry on exactly once.

A group's offsets asked of a fresh Apache Kafka node (or one just restarted) get NOT_COORDINATOR while the node loads
the group coordinator: librdkafka's admin client (2.16.1) crashed the process with SIGSEGV on that answer
(confluentinc/librdkafka#5040), where the starting offsets of `startingOffsets=group`, the Kafka sink's recovery and
`sparkeos lag --group` read them.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest
from confluent_kafka import KafkaException

from sparkeos.broker import EmbeddedBroker
from sparkeos.chaos.proxy import TcpProxy
from sparkeos.spark.client_cache import ClientCallStuck
from sparkeos.spark.kafka.cluster import KafkaCluster
from sparkeos.spark.kafka.options import parse_sink_options
from sparkeos.spark.kafka.sink.protocol import BEGIN_TIMEOUT_S, STUCK_CALL_GRACE_S, _TransactionalWriter
from sparkeos.spark.kafka.sink.startup_checks import prepare_exactly_once
from support.apache_kafka import VERSIONS, ApacheKafkaCluster
from support.spark import commit_sink_batch, create_topic, produce, unique

TRIES = 2
SECONDS_DOWN = 1.5


def restart_later(broker_process) -> threading.Thread:
    """Kill the broker now; start it again on the same port after SECONDS_DOWN, in a thread."""
    broker_process.kill()
    restart = threading.Thread(target=lambda: (time.sleep(SECONDS_DOWN), broker_process.start()))
    restart.start()
    return restart


def test_driver_side_requests_made_while_the_broker_is_down_are_answered_once_it_is_back(broker_process):
    bootstrap = broker_process.bootstrap_servers
    topic = create_topic(bootstrap, unique("in"), partitions=2)
    cluster = KafkaCluster({"bootstrap.servers": bootstrap}, timeout_s=20)
    requests = {
        "metadata": (lambda: cluster.topics()[topic], 2),
        "ListOffsets": (lambda: cluster.latest([(topic, 0), (topic, 1)], read_committed=True),
                        {(topic, 0): 0, (topic, 1): 0}),
        "OffsetFetch": (lambda: cluster.group_offsets(unique("group"), [(topic, 0)]), {}),
    }
    for name, (request, expected) in requests.items():
        assert request() == expected, name  # answered with the broker up
        time.sleep(1)  # the client idle and connected, as between a query's batches
        restart = restart_later(broker_process)
        try:
            assert request() == expected, f"{name}, made while the broker was down"
        finally:
            restart.join()
    # A partition that does not exist is still an error at once, naming it.
    started = time.monotonic()
    with pytest.raises(RuntimeError, match=f"partitions {topic}-5 do not exist"):
        cluster.latest([(topic, 5)], read_committed=True)
    assert time.monotonic() - started < 10


LIST_OFFSETS = 2


def test_offsets_asked_on_a_connection_that_closes_before_the_answer_are_asked_again(tmp_path):
    with TcpProxy() as proxy, EmbeddedBroker(tmp_path / "broker", advertised_host="127.0.0.1",
                                             advertised_port=proxy.port) as broker:
        proxy.target = ("127.0.0.1", broker.config.port)
        topic = create_topic(proxy.address, unique("in"), partitions=2)
        produce(proxy.address, topic, [str(n) for n in range(10)], partition=1)
        cluster = KafkaCluster({"bootstrap.servers": proxy.address}, timeout_s=20)
        expected = {(topic, 0): 0, (topic, 1): 10}
        assert cluster.latest(expected, read_committed=True) == expected
        for cuts in (1, 3):
            proxy.cut_requests(LIST_OFFSETS, cuts)
            assert cluster.latest(expected, read_committed=True) == expected, f"{cuts} answers lost"
            assert proxy.requests_left_to_cut(LIST_OFFSETS) == 0, "the proxy cut fewer requests than asked"
            assert cluster.earliest(expected) == {(topic, 0): 0, (topic, 1): 0}


def test_a_transaction_started_while_the_broker_restarts_ends_in_bounded_time_and_a_new_producer_carries_on(
    broker_process,
):
    bootstrap = broker_process.bootstrap_servers
    options = parse_sink_options({
        "kafka.bootstrap.servers": bootstrap, "topic": create_topic(bootstrap, unique("out")),
        "commitMarkerTopic": unique("markers"), "kafka.transaction.timeout.ms": "10000",
    })
    partitions = prepare_exactly_once(options)
    bound_s = BEGIN_TIMEOUT_S + STUCK_CALL_GRACE_S + 5
    outcomes = []
    for attempt in range(TRIES):
        transactional_id = unique("restart")
        writer = _TransactionalWriter(options, transactional_id, "query", partitions)
        commit_sink_batch(writer, 0)  # the producer now knows its group coordinator
        restart = restart_later(broker_process)
        started = time.monotonic()
        try:
            writer.begin(1, "query")
            outcomes.append("began")
        except ClientCallStuck:
            outcomes.append("abandoned")
            assert writer.stuck
        except KafkaException as exc:
            outcomes.append(f"failed: {exc}")
        elapsed = time.monotonic() - started
        restart.join()
        assert elapsed < bound_s, f"try {attempt}: the transaction start took {elapsed:.1f} s ({outcomes[-1]})"
        closing = time.monotonic()
        writer.close()
        assert time.monotonic() - closing < 15, "closing the producer waited for its blocked call"

        successor = _TransactionalWriter(options, transactional_id, "query", partitions)
        try:
            assert successor.last_committed_batch("query") == 0
            commit_sink_batch(successor, 1)
            assert successor.last_committed_batch("query") == 1
        finally:
            successor.close()
    print(outcomes)


# Each read in a process of its own: a crash then fails the test, not the test process.
FIRST_READS = {
    "the source's starting offsets": (
        "import sys; from sparkeos.spark.kafka.cluster import KafkaCluster; "
        "print(KafkaCluster({'bootstrap.servers': sys.argv[1]}).group_offsets('g', [(sys.argv[2], 0)]))", 0, "{}"),
    "sparkeos lag --group": (
        "import sys; from sparkeos.cli import main; "
        "sys.exit(main(['lag', '--bootstrap-servers', sys.argv[1], '--group', 'g']))",
        1, "group 'g' has no committed offsets"),
}


@pytest.mark.parametrize("read", FIRST_READS)
def test_a_groups_offsets_asked_first_of_a_fresh_apache_kafka_node_are_answered(read, tmp_path):
    code, exit_code, expected = FIRST_READS[read]
    with ApacheKafkaCluster(tmp_path, VERSIONS[0]) as cluster:
        topic = create_topic(cluster.bootstrap_servers, unique("in"))
        done = subprocess.run([sys.executable, "-c", code, cluster.bootstrap_servers, topic], capture_output=True,
                              text=True, timeout=120)
    assert done.returncode == exit_code, f"exit {done.returncode}:\n{done.stdout}\n{done.stderr[-3000:]}"
    assert expected in done.stdout + done.stderr
