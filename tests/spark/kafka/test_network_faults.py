"""Exactly-once through a faulty network: a Kafka -> Spark -> Kafka query whose every Kafka connection (the
driver's, the source's readers', the sink's producers) runs through a fault proxy.

While the query works through its input, the proxy withholds answers to Produce, AddPartitionsToTxn,
TxnOffsetCommit and EndTxn (the request was applied, the client cannot know), refuses connections just as a
transaction commits, and hits the source and the driver with lost Fetch, ListOffsets and Metadata answers,
refused connections, latency and frames split into pieces. Spark may retry a failed task (local[2,8]); the
driver must not die. An independent read_committed consumer then finds every expected record once, and none
of the aborted input.
"""

from __future__ import annotations

import pytest

from sparkeos.chaos.network import SINK_FAULTS, SOURCE_AND_DRIVER_FAULTS
from sparkeos.verify import assert_exactly_once, read_values
from support.network_faults import faulty_pipeline
from support.spark import create_topic, unique


# On Apache Kafka: the same faults through the embedded broker's proxy strike the Kafka sink's example jobs in
# sparkeos chaos's test (tests/test_chaos.py), and the network-fault tests of the files and PostgreSQL sinks.
@pytest.mark.apache_kafka(newest_only=True, embedded=False)
@pytest.mark.timeout(600)
def test_query_under_network_faults_output_stays_exact(broker_kind, tmp_path):
    with faulty_pipeline(tmp_path, records=5_000, broker=broker_kind) as pipeline:
        sink = create_topic(pipeline.bootstrap, unique("out"), partitions=2)
        injected = pipeline.run(pipeline.job_args("--sink", sink), SINK_FAULTS + SOURCE_AND_DRIVER_FAULTS)
        pipeline.close()
        assert_exactly_once(pipeline.expected(), read_values(pipeline.bootstrap, sink), aborted=pipeline.aborted(),
                            context=f"seed {pipeline.seed}, faults {dict(injected)}")
