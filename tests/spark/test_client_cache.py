"""The per-worker client cache: leases, LRU capacity and idle eviction, on real librdkafka consumers."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Consumer

from sparkeos.spark.client_cache import ClientCache
from sparkeos.spark.kafka.options import CONSUMER_TIMEOUT_ENV


def is_closed(consumer: Consumer) -> bool:
    try:
        consumer.assignment()
    except RuntimeError:
        return True
    return False


@pytest.fixture
def new_consumer(broker):
    def create() -> Consumer:
        return Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": "cache-test"})

    return create


@pytest.fixture
def cache(new_consumer):
    """A consumer cache, emptied before the broker stops (the environment is read at first use)."""
    created = ClientCache(1, Consumer.close, CONSUMER_TIMEOUT_ENV, "5m")
    yield created
    created.clear()


def test_a_released_client_is_reused_and_closed_only_after_the_idle_timeout(monkeypatch, cache, new_consumer):
    monkeypatch.setenv(CONSUMER_TIMEOUT_ENV, "30s")
    with cache.lease("a", new_consumer) as first:
        pass
    with cache.lease("a", new_consumer) as again:
        assert again is first
    assert cache.evict_idle(time.monotonic() + 29) == 0
    assert not is_closed(first)
    assert cache.evict_idle(time.monotonic() + 31) == 1
    assert is_closed(first)
    assert len(cache) == 0


def test_a_leased_client_is_never_evicted(monkeypatch, cache, new_consumer):
    monkeypatch.setenv(CONSUMER_TIMEOUT_ENV, "1s")
    held = cache.acquire("held", new_consumer)
    assert cache.evict_idle(time.monotonic() + 3600) == 0
    # Over capacity, the LRU closes only clients no task holds: here none, so both stay open.
    other = cache.acquire("other", new_consumer)
    assert not is_closed(held) and not is_closed(other) and len(cache) == 2
    cache.release(other)
    cache.release(held)
    third = cache.acquire("third", new_consumer)
    assert is_closed(held) and is_closed(other) and not is_closed(third)
    cache.release(third)


def test_forgetting_a_client_closes_it_even_while_leased(cache, new_consumer):
    with cache.lease("a", new_consumer) as client:
        cache.forget(client)
        assert is_closed(client)
    assert cache.acquire("a", new_consumer) is not client


def test_the_evictor_thread_closes_idle_clients_by_itself(monkeypatch, cache, new_consumer):
    monkeypatch.setenv(CONSUMER_TIMEOUT_ENV, "1s")
    with cache.lease("a", new_consumer) as client:
        time.sleep(2.5)  # held past the timeout: the evictor must leave it alone
        assert not is_closed(client)
    deadline = time.monotonic() + 10
    while not is_closed(client) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert is_closed(client) and len(cache) == 0


@pytest.mark.parametrize("value", ["soon", "-5s", "0", "10 parsecs"])
def test_a_bad_timeout_names_the_environment_variable(monkeypatch, cache, new_consumer, value):
    monkeypatch.setenv(CONSUMER_TIMEOUT_ENV, value)
    with pytest.raises(ValueError, match=f"{CONSUMER_TIMEOUT_ENV} must be a positive duration"):
        cache.acquire("a", new_consumer)


def test_a_client_forgotten_twice_is_closed_once(new_consumer):
    closed = []
    cache: ClientCache = ClientCache(4, closed.append, CONSUMER_TIMEOUT_ENV, "10m")
    client = cache.acquire("a", new_consumer)
    cache.forget(client)
    cache.forget(client)
    assert closed == [client]
    client.close()
