"""The commit markers of the exactly-once sink (steps 2 to 4 of the protocol in `protocol`): the marker topic, the
marker partition of a transactional.id, and reading back the last batch an id committed for a query.

A marker of query Q (writing to the sink's ``topic``) is the offset B+1 of group ``T/Q/topic`` on T's marker
partition, and a record keyed ``T/Q/topic`` in the marker topic; the group offset is read first, the records when
it is missing or another query's.
"""

from __future__ import annotations

import json
import logging
import time
import zlib
from collections.abc import Iterator

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from ...client_cache import ClientCache
from ..cluster import (
    WARMUP_TIMEOUT_S,
    KafkaCluster,
    KafkaNotAuthorized,
    connection_config,
    is_authorization_failure,
    is_transient,
    learn_topic,
    until_deadline,
)
from ..options import PRODUCER_CACHE_TIMEOUT, PRODUCER_TIMEOUT_ENV, SinkOptions

log = logging.getLogger("sparkeos.sink")

MARKER_PARTITIONS = 8
# A new id's scan reads every marker partition from its log start, and Kafka compacts only rolled segments: with
# Kafka's default segment size and age, a huge number of markers would wait in the active segment. Small segments
# let Kafka compact all but the newest segment of each partition. Once compaction has removed a transaction's marker
# record, its commit marker stays for delete.retention.ms: Kafka's default (a day) would keep a day of commits' markers.
MARKER_TOPIC_CONFIG = {"cleanup.policy": "compact", "retention.ms": "-1", "segment.bytes": str(16 * 1024 * 1024),
                       "segment.ms": str(3_600_000), "delete.retention.ms": str(600_000)}
MARKER_SCAN_BATCH = 1000
# A cluster that refuses the marker group's coordinator to the sink's principal (no READ on the group) makes
# librdkafka ask again and again, and committed() only times out: it is asked in slices this long, and the errors
# reported between them say why.
COMMITTED_SLICE_S = 5.0
# consume() waits its whole timeout unless it has num_messages in hand, and a range's control records never
# count: the last poll of a scan always runs out, so a short poll keeps a fresh id's scan short.
MARKER_SCAN_POLL_S = 0.005


def marker_key(transactional_id: str, query_id: str | None, topic: str | None = None) -> str:
    """The name of T's markers for query Q writing to ``topic`` (the sink's option): the group of its marker
    offsets and the key of its marker records.

    Named by the query as well as T: a transactionalIdPrefix reused by another query (a new checkpoint) writes under
    the same T, and with T alone the other query's commits would take over the group offset, and Kafka's compaction,
    which keeps the newest record per key, would drop this query's marker records. Named by the topic too: a copied
    checkpoint, or a query pointed at another topic, runs the same batches of the same query again for another
    target, whose batches must not be taken for committed by the first target's markers. A batch write (no query)
    has a transactional id of its own."""
    if not query_id:
        return transactional_id
    return f"{transactional_id}/{query_id}" + (f"/{topic}" if topic else "")


def marker_partition(transactional_id: str, marker_partitions: int) -> int:
    """The marker topic partition that holds `transactional_id`'s markers: fixed for the id."""
    return zlib.crc32(transactional_id.encode()) % marker_partitions


# Every new id scans (a new query's first batch, a restart), and a new admin client's connection set-up was a
# large part of a scan. librdkafka has no close() for admin clients; an evicted one is freed with its last
# reference.
_scan_clusters: ClientCache[KafkaCluster] = ClientCache(8, lambda _cluster: None, PRODUCER_TIMEOUT_ENV,
                                                        PRODUCER_CACHE_TIMEOUT)


class MarkerReader:
    """The markers of one transactional.id T for one query Q: T's marker partition, and the last batch T committed
    for Q."""

    def __init__(self, options: SinkOptions, transactional_id: str, query_id: str | None, marker_partitions: int):
        self.options = options
        self.transactional_id = transactional_id
        self.query_id = query_id
        self.marker_key = marker_key(transactional_id, query_id, options.topic)
        self.marker = TopicPartition(options.marker_topic, marker_partition(transactional_id, marker_partitions))
        self.marker_partitions = marker_partitions
        consumer_config = connection_config(options.producer_config())
        consumer_config.update({
            "group.id": self.marker_key, "isolation.level": "read_committed", "enable.auto.commit": "false",
            "enable.partition.eof": "true", "auto.offset.reset": "earliest",
            "fetch.wait.max.ms": "10",  # scans read only what exists, as the source's readers do
        })
        refused: list[KafkaError] = []  # a list the callback closes over: a bound method would make a cycle
        self.refused = refused
        consumer_config["error_cb"] = lambda error: refused.append(error) if is_authorization_failure(error) else None
        self.consumer = Consumer(consumer_config)
        # Bounds every call of T's transaction as well as the marker reads.
        self.timeout_s = options.transaction_timeout_ms / 1000 + 30

    def close(self) -> None:
        self.consumer.close()

    def last_committed_batch(self, query_id: str | None, scan_records: bool = True,
                             timeout_s: float | None = None) -> int | None:
        """The newest batch query `query_id` committed with T, or None; `scan_records=False` trusts a missing
        group offset. Another query's marker (a transactionalIdPrefix reused with a new checkpoint) is not ours:
        its batch numbers say nothing of this query's batches. `timeout_s` bounds the wait for a pending group
        offset (an open transaction of T), the transaction's bound by default."""
        # Every partition, in one OffsetFetch: if partitions were added to the marker topic since T last
        # committed, T's home partition moved and its newest offset sits on the old one.
        everywhere = [TopicPartition(self.marker.topic, p) for p in range(self.marker_partitions)]
        newest, owners = -1, set()
        for committed in self._committed(everywhere, self.timeout_s if timeout_s is None else timeout_s):
            if committed.offset >= 0:
                owner = committed.metadata or None
                owners.add(owner)
                if owner == query_id:
                    newest = max(newest, committed.offset)
        if newest >= 0:
            return newest - 1
        if owners:
            log.warning("%s last committed for query %s; query %s reuses the id (a transactionalIdPrefix "
                        "reused with a new checkpoint) and writes its own batches", self.transactional_id,
                        ", ".join(sorted(str(o) for o in owners)), query_id)
        return self._scan_marker_records(query_id) if scan_records else None

    def _committed(self, partitions: list[TopicPartition], timeout_s: float) -> list[TopicPartition]:
        """T's marker group offsets, asked again while its coordinator moves or loads: Apache Kafka then answers
        NOT_COORDINATOR or COORDINATOR_LOAD_IN_PROGRESS, which librdkafka hands to the caller."""
        def attempt(timeout_s: float) -> list[TopicPartition]:
            found = self._committed_in_slices(partitions, timeout_s)
            failed = next((tp.error for tp in found if tp.error is not None), None)
            if failed is not None:
                raise KafkaException(failed)
            return found

        return until_deadline(
            attempt, timeout_s, lambda exc: exc.args[0] if is_transient(exc) else None,
            lambda error: log.info("reading the marker offsets of %s failed (%s); asking again",
                                   self.transactional_id, error))

    def _committed_in_slices(self, partitions: list[TopicPartition], timeout_s: float) -> list[TopicPartition]:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                return self.consumer.committed(partitions, timeout=min(COMMITTED_SLICE_S,
                                                                       max(deadline - time.monotonic(), 0.001)))
            except KafkaException as exc:
                timed_out = exc.args and exc.args[0].code() == KafkaError._TIMED_OUT
                if not timed_out or time.monotonic() >= deadline:
                    raise
                # Serves the errors librdkafka reported meanwhile (no partition is assigned between scans).
                message = self.consumer.poll(0)
                if message is not None and is_authorization_failure(message.error()):
                    self.refused.append(message.error())
                if self.refused:
                    raise KafkaNotAuthorized(
                        f"reading the markers of {self.transactional_id} failed: {self.refused[0]}; the sink's "
                        f"principal needs READ on the group {self.marker_key!r} (a prefixed ACL on the "
                        "transactionalIdPrefix covers them all)") from exc

    def _scan_marker_records(self, query_id: str | None) -> int | None:
        """The newest marker record of T and `query_id`, for when the group offset is gone, never existed, or is
        another query's."""
        return max((value["batch"] for value in self._marker_records(query_id)), default=None)

    def committed_marker(self, query_id: str | None, batch: int) -> dict | None:
        """The marker record T committed for `batch` of `query_id` (records, digest), or None if Kafka no longer
        holds it. Read only when a replay finds the batch committed, to compare the replay's input with it."""
        return next((value for value in self._marker_records(query_id) if value["batch"] == batch), None)

    def _marker_records(self, query_id: str | None) -> list[dict]:
        """T's marker records of `query_id`.

        Every partition is read, as for the group offsets: the records T wrote before partitions were added
        sit on its old home partition."""
        with _scan_clusters.lease(json.dumps(connection_config(self.options.producer_config()), sort_keys=True),
                                  lambda: KafkaCluster(self.options.producer_config())) as cluster:
            ranges = self._decided_marker_ranges(cluster)
        return [value for value in self._read_records(ranges) if value.get("query_id") == query_id]

    def _decided_marker_ranges(self, cluster: KafkaCluster) -> dict[tuple[str, int], tuple[int, int]]:
        """Per marker partition, [log start, high watermark), once no open transaction lies below the watermark."""
        everywhere = [(self.marker.topic, p) for p in range(self.marker_partitions)]
        # Our last marker may sit above another id's open transaction: wait until everything written so
        # far is decided, so the read_committed read below cannot stop short of it.
        high = cluster.latest(everywhere, read_committed=False)
        deadline = time.monotonic() + self.timeout_s
        while unstable := [tp for tp, stable in cluster.latest(everywhere, read_committed=True).items()
                           if stable < high[tp]]:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{', '.join(f'{t}-{p}' for t, p in unstable)} stayed unstable below "
                                   f"{', '.join(str(high[tp]) for tp in unstable)}")
            time.sleep(0.05)
        start = cluster.earliest(everywhere)
        return {tp: (start[tp], high[tp]) for tp in everywhere if start[tp] < high[tp]}

    def _read_records(self, ranges: dict[tuple[str, int], tuple[int, int]]) -> Iterator[dict]:
        """T's marker records in the offset ranges [start, end) given per partition."""
        if not ranges:
            return
        # Without it, the scan of a new query's first task could wait for librdkafka's periodic topic scan.
        learn_topic(self.consumer, self.marker.topic, min(self.timeout_s, WARMUP_TIMEOUT_S))
        self.consumer.assign([TopicPartition(t, p, start) for (t, p), (start, _) in ranges.items()])
        ends = {tp: end for tp, (_, end) in ranges.items()}
        position = {tp: start for tp, (start, _) in ranges.items()}
        idle_since = time.monotonic()
        # Markers written before they were keyed by query are keyed T; their query_id field tells whose they are.
        keys = {self.marker_key.encode(), self.transactional_id.encode()}
        try:
            while ends:
                # consume() returns early only with num_messages in hand, and control records never count: asking
                # for a full batch with a long timeout made every scan of a short range wait out the timeout.
                wanted = max(1, min(MARKER_SCAN_BATCH, sum(ends[tp] - position[tp] for tp in ends)))
                messages = self.consumer.consume(num_messages=wanted, timeout=MARKER_SCAN_POLL_S)
                if messages:
                    idle_since = time.monotonic()
                elif time.monotonic() - idle_since > self.timeout_s:
                    raise TimeoutError(f"reading {self._describe_ranges(ends, position)} got nothing for "
                                       f"{self.timeout_s:.0f} s")
                for message in messages:
                    tp = (message.topic(), message.partition())
                    if tp not in ends:
                        continue
                    error = message.error()
                    if error is None:
                        position[tp] = message.offset() + 1
                        if message.key() in keys and message.offset() < ends[tp]:
                            yield json.loads(message.value())
                        finished = position[tp] >= ends[tp]
                    elif error.code() == KafkaError._PARTITION_EOF:
                        # What remained below the end was control records or aborted data.
                        finished = message.offset() >= ends[tp]
                    else:
                        raise KafkaException(error)
                    if finished:
                        del ends[tp]
        finally:
            self.consumer.unassign()

    @staticmethod
    def _describe_ranges(ends: dict[tuple[str, int], int], position: dict[tuple[str, int], int]) -> str:
        return ", ".join(f"{t}-{p} offsets [{position[(t, p)]}, {end})" for (t, p), end in ends.items())
