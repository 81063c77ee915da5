"""Fetch (1): long-poll reads of whole stored batches within the request's byte limits.

Leaves out:
- incremental fetch sessions (KIP-227): none is ever opened (the answer's session id is 0), a request
  naming one is answered FETCH_SESSION_ID_NOT_FOUND, so clients keep to full fetches, and
  `forgotten_topics_data` goes unused;
- what only followers and racks use: `replica_id`, `rack_id`, a follower's `log_start_offset`, and a
  preferred read replica (always -1);
- log divergence checks: `last_fetched_epoch` is not compared and no `diverging_epoch` is sent, since
  the one leader epoch never changes.
"""

from __future__ import annotations

import asyncio

from kafka.protocol.consumer import FetchRequest, FetchResponse

from ..acls import READ, TOPIC
from ..dispatch import api
from ..errors import FETCH_SESSION_ID_NOT_FOUND, TOPIC_AUTHORIZATION_FAILED, UNKNOWN_TOPIC_OR_PARTITION
from ..fetch_encoding import FetchedPartition, FetchResult
from ..leader_epoch import leader_epoch_error
from ..storage.log import OffsetOutOfRange

READ_COMMITTED = 1


@api(FetchRequest, FetchResponse, 4, 12)
async def handle_fetch(broker, context, request):
    if context.version >= 7 and request.session_id != 0:
        # We keep no incremental fetch sessions; the client falls back to full fetches.
        return FetchResult(topics=[], error_code=FETCH_SESSION_ID_NOT_FOUND)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + max(request.max_wait_ms, 0) / 1000
    denied = {topic.topic for topic in request.topics if not broker.allowed(context, READ, TOPIC, topic.topic)}
    while True:
        responses, total, errors = read_all(broker, request, denied)
        remaining = deadline - loop.time()
        if total >= request.min_bytes or errors or remaining <= 0:
            return FetchResult(topics=responses)
        await broker.wait_for_append(remaining, partitions_read(broker, request))


def partitions_read(broker, request) -> list:
    """The partition logs a fetch reads: only appends to these wake it early."""
    logs = (broker.partition(topic.topic, wanted.partition) for topic in request.topics for wanted in topic.partitions)
    return [partition_log for partition_log in logs if partition_log is not None]


def read_all(broker, request, denied: set[str]) -> tuple[list[tuple[str, list[FetchedPartition]]], int, bool]:
    """Every partition asked for; those of the `denied` topics (no READ for the principal) are
    TOPIC_AUTHORIZATION_FAILED."""
    read_committed = request.isolation_level == READ_COMMITTED
    budget = request.max_bytes if request.max_bytes > 0 else 0x7FFFFFFF
    total = 0
    errors = False
    responses = []
    for topic in request.topics:
        partitions = []
        for wanted in topic.partitions:
            if topic.topic in denied:
                data = FetchedPartition(partition_index=wanted.partition, error_code=TOPIC_AUTHORIZATION_FAILED,
                                        high_watermark=-1, aborted_transactions=[])
            else:
                data = read_partition(broker, topic.topic, wanted, read_committed, budget - total, total == 0)
            if data.error_code:
                errors = True
            elif data.records:
                total += len(data.records)
            partitions.append(data)
        responses.append((topic.topic, partitions))
    return responses, total, errors


def read_partition(broker, topic: str, wanted, read_committed: bool, budget: int, first: bool) -> FetchedPartition:
    index = wanted.partition
    partition_log = broker.partition(topic, index)
    if partition_log is None:
        # Kafka sends empty records, never null, with an error: librdkafka refuses a null set.
        return FetchedPartition(partition_index=index, error_code=UNKNOWN_TOPIC_OR_PARTITION, high_watermark=-1,
                                aborted_transactions=[])
    epoch_error = leader_epoch_error(getattr(wanted, "current_leader_epoch", -1))
    high_watermark = partition_log.high_watermark
    stable = broker.last_stable_offset(topic, index, partition_log)
    common = dict(partition_index=index, high_watermark=high_watermark, last_stable_offset=stable,
                  log_start_offset=partition_log.log_start_offset)
    if epoch_error:
        return FetchedPartition(error_code=epoch_error, aborted_transactions=[], **common)
    limit = min(wanted.partition_max_bytes, budget)
    records = b""
    aborted = None
    try:
        if limit > 0 or first:
            upper = stable if read_committed else high_watermark
            # Kafka lets the first partition of a response exceed the limits by one batch,
            # so a consumer always makes progress.
            records = partition_log.read(wanted.fetch_offset, max(limit, 1), upper, min_one=first)
            if read_committed:
                aborted = [
                    (a.producer_id, a.first_offset)
                    for a in broker.aborted_transactions(partition_log, wanted.fetch_offset, records)
                ]
        elif wanted.fetch_offset < partition_log.log_start_offset or (
            wanted.fetch_offset > partition_log.log_end_offset
        ):
            raise OffsetOutOfRange()
    except OffsetOutOfRange:
        return FetchedPartition(error_code=OffsetOutOfRange.error_code, aborted_transactions=[], **common)
    if read_committed and aborted is None:
        aborted = []
    return FetchedPartition(error_code=0, records=records, aborted_transactions=aborted, **common)
