"""Crash proof on a three-node Apache Kafka cluster: a Kafka -> Spark -> Kafka query (tests/support/pipeline_job.py)
runs while its driver is killed -9 and, between driver kills, the broker that leads a sink partition or the one that
coordinates a sink transactional id is killed -9 and restarted on the same data and port.

Replication is a real cluster's (factor 3, `min.insync.replicas` 2), so one node down leaves every partition
writable; leaders move, and transaction coordinators fail over with their state in `__transaction_state`. A feeder
appends plain records, committed and aborted transactions all along. At the end an independent read_committed
consumer checks the output: nothing lost, nothing twice, nothing of an aborted transaction.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

import pytest

from sparkeos.verify import assert_exactly_once, read_values
from support.apache_kafka import VERSIONS, ApacheKafkaCluster
from support.crash import (
    Driver,
    InputFeeder,
    batch_in_flight,
    job_output,
    pipeline_job_args,
    run_until_caught_up,
    wait_for_kill_moment,
    wait_until_stable,
)
from support.spark import create_topic, unique

CYCLES = 4
SOURCE_PARTITIONS = 3
SINK_PARTITIONS = 2


@dataclass
class Fault:
    cycle: int
    node: int
    role: str  # what the killed node was to the query
    moment: str
    batch_in_flight: int | None
    driver_killed: bool


@pytest.mark.timeout(1200)
def test_driver_and_broker_kills_on_a_three_node_cluster_keep_the_output_exact(tmp_path):
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    with ApacheKafkaCluster(tmp_path / "kafka", VERSIONS[0], nodes=3) as cluster:
        bootstrap = cluster.bootstrap_servers
        source = create_topic(bootstrap, unique("in"), partitions=SOURCE_PARTITIONS)
        sink = create_topic(bootstrap, unique("out"), partitions=SINK_PARTITIONS)
        prefix = unique("cluster")
        checkpoint = tmp_path / "checkpoint"
        driver = Driver(tmp_path, unique("tag"), pipeline_job_args(
            bootstrap, source, sink, checkpoint, "--master", "local[2]", "--transactional-id-prefix", prefix,
            "--max-offsets-per-trigger", "1000"))
        feeder = InputFeeder(bootstrap, source, seed, pause_s=0.3)
        faults: list[Fault] = []
        started = time.monotonic()
        feeder.start()
        try:
            driver.start(0)
            for cycle in range(CYCLES):
                moment = wait_for_kill_moment(driver, checkpoint, cycle, rng)
                in_flight = batch_in_flight(checkpoint)
                if cycle % 2:
                    role, node = "coordinator of a sink transactional id", cluster.transaction_coordinator(
                        f"{prefix}-{rng.randrange(SOURCE_PARTITIONS)}")
                else:
                    role, node = "leader of a sink partition", cluster.leader_of(sink, rng.randrange(SINK_PARTITIONS))
                kill_driver = cycle % 3 != 2
                cluster.kill(node)
                if kill_driver:
                    driver.kill()
                time.sleep(rng.uniform(0.5, 3.0))
                cluster.restart(node)
                if kill_driver:
                    driver.start(cycle + 1)
                faults.append(Fault(cycle, node, role, moment, in_flight, kill_driver))
            feeder.stop()
            driver.kill()
            run_until_caught_up(driver, CYCLES + 1, checkpoint, bootstrap, source)
            assert driver.stop() == 0, driver.error_tail()
        finally:
            feeder.stop_requested.set()
            driver.kill()
        wait_until_stable(bootstrap, sink)
        output = read_values(bootstrap, sink)

    mid_batch = [fault for fault in faults if fault.batch_in_flight is not None]
    report = (f"seed {seed}: {len(faults)} broker kills ({sum(f.driver_killed for f in faults)} with the driver) in "
              f"{time.monotonic() - started:.0f} s, {len(mid_batch)} mid-batch; input {len(feeder.committed)} "
              f"committed + {len(feeder.aborted)} aborted records; output {len(output)} records\n"
              + "\n".join(str(fault) for fault in faults))
    print(report)
    assert_exactly_once(job_output(feeder.committed), output, aborted=job_output(feeder.aborted), context=report)
    assert {fault.role for fault in faults} == {"coordinator of a sink transactional id", "leader of a sink partition"}
    assert len(mid_batch) >= 2, f"too few kills hit a running batch\n{report}"

