"""A running query's Kafka connections under network faults: a broker that advertises a fault proxy, so that every
connection of the query (the driver's, the source's readers', the sink's producers and marker readers) runs
through it, and a thread that keeps injecting faults until the query has consumed its input.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sparkeos.broker.embedded import EmbeddedBroker
from sparkeos.chaos.network import Fault, FaultInjector
from sparkeos.chaos.proxy import TcpProxy
from support.apache_kafka import ApacheKafkaCluster
from support.crash import STARTUP_TIMEOUT_S, Driver, InputFeeder, caught_up, job_output, wait_until_stable
from support.spark import create_topic, unique, wait_for


@contextmanager
def proxied_broker(directory: Path, kind: str = "embedded",
                   **broker_options) -> Iterator[tuple[TcpProxy, EmbeddedBroker | ApacheKafkaCluster]]:
    """A broker whose only advertised address is the proxy's: clients reach it through the proxy alone. `kind` is
    `embedded` (with `broker_options`) or `kafka-<version>`, a one-node Apache Kafka."""
    with TcpProxy(seed=random.randrange(1 << 30)) as proxy:
        if kind == "embedded":
            with EmbeddedBroker(directory, advertised_host="127.0.0.1", advertised_port=proxy.port,
                                **broker_options) as broker:
                proxy.target = ("127.0.0.1", broker.config.port)
                yield proxy, broker
            return
        if broker_options:
            raise ValueError(f"options of the embedded broker given for {kind}: {sorted(broker_options)}")
        cluster = ApacheKafkaCluster(directory, kind.removeprefix("kafka-"), advertised_port=proxy.port)
        proxy.target = ("127.0.0.1", cluster.nodes[1].port)
        with cluster:
            yield proxy, cluster


def feed_input(bootstrap: str, topic: str, seed: int, records: int) -> InputFeeder:
    """Plain records, committed and aborted transactions, at least `records` of them committed, all appended
    before any fault: the input's own producers must not be what a fault breaks."""
    feeder = InputFeeder(bootstrap, topic, seed, pause_s=0.0, chunk=(20, 60))
    feeder.start()
    wait_for(lambda: len(feeder.committed) >= records or not feeder.is_alive(), timeout_s=120, interval_s=0.05,
             what=f"{records} input records")
    feeder.stop()
    return feeder


class FaultyPipeline:
    """A broker behind a fault proxy, a source topic fed before any fault, and a checkpoint: the set-up of a
    Kafka -> Spark -> sink query (tests/support/pipeline_job.py) run under network faults."""

    def __init__(self, directory: Path, proxy: TcpProxy, seed: int, records: int, partitions: int = 3):
        self.directory, self.proxy, self.seed = directory, proxy, seed
        self.bootstrap = proxy.address
        self.source = create_topic(self.bootstrap, unique("in"), partitions=partitions)
        self.feeder = feed_input(self.bootstrap, self.source, seed, records)
        self.checkpoint = directory / "checkpoint"
        self.driver: Driver | None = None

    def job_args(self, *sink_args: str, records_per_batch: int = 150) -> list[str]:
        """The job's arguments: this pipeline's source and checkpoint, Spark retrying failed tasks, `sink_args`."""
        return ["--bootstrap", self.bootstrap, "--source", self.source, "--checkpoint", str(self.checkpoint),
                "--master", "local[2,8]", "--max-offsets-per-trigger", str(records_per_batch), *sink_args]

    def run(self, job_args: list[str], faults: tuple[Fault, ...],
            more: tuple[FaultInjector, ...] = ()) -> Counter[str]:
        """Run the job with `faults` on the broker's proxy (and the injectors `more` on other proxies) until it
        consumed its input; every fault must have taken effect, and the driver must have ridden through."""
        self.driver = Driver(self.directory, unique("tag"), job_args)
        for injector in more:
            injector.start()
        try:
            injected = run_under_faults(self.driver, self.checkpoint, self.bootstrap, self.source,
                                        FaultInjector(self.proxy, faults, self.seed))
            for injector in more:
                injected += injector.stop()
        finally:
            for injector in more:
                injector.stop_requested.set()
        every = faults + tuple(fault for injector in more for fault in injector.faults)
        print(f"seed {self.seed}: faults that took effect {dict(injected)}")
        missing = [fault.name for fault in every if not injected[fault.name]]
        assert not missing, f"faults that never took effect: {missing}; took effect: {dict(injected)}"
        return injected

    def expected(self) -> Counter:
        return job_output(self.feeder.committed)

    def aborted(self) -> Counter:
        return job_output(self.feeder.aborted)

    def close(self) -> None:
        if self.driver is not None:
            self.driver.kill()


@contextmanager
def faulty_pipeline(directory: Path, records: int, broker: str = "embedded") -> Iterator[FaultyPipeline]:
    """`broker`: a kind of proxied_broker."""
    seed = random.randrange(1 << 30)
    with proxied_broker(directory / "broker", broker) as (proxy, _broker):
        pipeline = FaultyPipeline(directory, proxy, seed, records)
        try:
            yield pipeline
        finally:
            pipeline.close()


def run_under_faults(driver: Driver, checkpoint: Path, bootstrap: str, source: str,
                     injector: FaultInjector) -> Counter[str]:
    """Start the driver and inject faults until the query has consumed its input; return the faults that took
    effect. The driver must ride through them without dying."""
    ends = wait_until_stable(bootstrap, source)
    driver.start(0)
    driver.wait_running(STARTUP_TIMEOUT_S)
    injector.start()
    try:
        wait_for(lambda: caught_up(checkpoint, source, ends) or not driver.alive() or not injector.is_alive(),
                 timeout_s=300, interval_s=0.5, what="the query to consume its input under network faults")
    finally:
        injected = injector.stop()
    assert driver.alive(), f"the driver died under network faults {dict(injected)}:\n{driver.error_tail()}"
    return injected
