"""The sink's transaction start across a broker restart, without Spark.

After its broker went away, librdkafka can block in send_offsets_to_transaction far past the timeout it was
given (confluentinc/librdkafka#5456, #5511); the sink starts every transaction with that call. Started while
the broker was down, the call outlived its 10 s timeout in 4 of 4 tries with librdkafka 2.16.0: by 34-37 s, or
for good. The sink must give up on such a producer within its bound, and a new producer of the same
transactional id must carry on exactly once.
"""

from __future__ import annotations

import threading
import time

from confluent_kafka import KafkaException

from spark_support import commit_sink_batch, create_topic, unique
from sparkeos.spark.clients import ClientCallStuck
from sparkeos.spark.options import parse_sink_options
from sparkeos.spark.sink import BEGIN_TIMEOUT_S, STUCK_CALL_GRACE_S, _TransactionalWriter, prepare_exactly_once

TRIES = 2
SECONDS_DOWN = 1.5


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
        writer = _TransactionalWriter(options, transactional_id, partitions)
        commit_sink_batch(writer, 0)  # the producer now knows its group coordinator
        broker_process.kill()
        restart = threading.Thread(target=lambda: (time.sleep(SECONDS_DOWN), broker_process.start()))
        restart.start()
        started = time.monotonic()
        try:
            writer.begin(1)
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

        successor = _TransactionalWriter(options, transactional_id, partitions)
        try:
            assert successor.last_committed_batch() == 0
            commit_sink_batch(successor, 1)
            assert successor.last_committed_batch() == 1
        finally:
            successor.close()
    print(outcomes)
