"""The crash tests' input feeder (support/crash.py) outlives a fatal error of its transactional producer, as when
a fresh cluster's coordinator answers EndTxn with an error the client cannot recover from, and still knows exactly
which of its numbers became visible: every crash test counts its output against that."""

from __future__ import annotations

from collections import Counter

import pytest
from confluent_kafka import Producer

from sparkeos.verify import read_values
from support.crash import InputFeeder
from support.spark import create_topic, unique, wait_for


def goes_on(feeder: InputFeeder, chunks: int = 3) -> None:
    target = sum(feeder.transactions.values()) + chunks
    wait_for(lambda: sum(feeder.transactions.values()) >= target or not feeder.is_alive(), timeout_s=60,
             what="the feeder to go on")


@pytest.mark.apache_kafka(newest_only=True)
def test_a_fenced_feeder_goes_on_and_knows_which_numbers_became_visible(broker) -> None:
    bootstrap = broker.bootstrap_servers
    topic = create_topic(bootstrap, unique("feeder-input"), partitions=3)
    feeder = InputFeeder(bootstrap, topic, seed=5, pause_s=0.0)
    feeder.start()
    for fence in range(1, 4):
        goes_on(feeder)
        # A producer of the same transactional id fences the feeder's: its next transaction fails fatally.
        fencer = Producer({"bootstrap.servers": bootstrap, "transactional.id": feeder.transactional_id})
        fencer.init_transactions(30)
        wait_for(lambda: feeder.transactions["uncertain"] >= fence or not feeder.is_alive(),  # noqa: B023
                 timeout_s=60, what="the fenced transaction to fail")
    goes_on(feeder)
    feeder.stop()
    visible = Counter(int(value) for value in read_values(bootstrap, topic))
    # A fence can fail the producer the feeder makes next as well (seen on Apache Kafka 4): it survives any number.
    assert feeder.transactions["uncertain"] >= 3
    assert feeder.transactions["commit"] >= 3
    assert max(visible.values()) == 1
    assert sorted(visible) == sorted(feeder.committed)
    assert not set(feeder.aborted) & set(visible)
    assert not set(feeder.committed) & set(feeder.aborted)
