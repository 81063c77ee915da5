"""TxnOffsetCommit (28): offsets staged in the transaction, published only when it commits.

Leaves out:
- nothing known for versions 0-3.
"""

from __future__ import annotations

from kafka.protocol.producer import TxnOffsetCommitRequest, TxnOffsetCommitResponse

from ..acls import GROUP, READ, TRANSACTIONAL_ID, WRITE
from ..coordinator.transactions import TransactionError
from ..dispatch import api
from ..errors import GROUP_AUTHORIZATION_FAILED, INVALID_PRODUCER_EPOCH, TRANSACTIONAL_ID_AUTHORIZATION_FAILED
from ..offset_commits import answer_topics, read_offsets

Topic_ = TxnOffsetCommitResponse.TxnOffsetCommitResponseTopic
Partition_ = Topic_.TxnOffsetCommitResponsePartition


@api(TxnOffsetCommitRequest, TxnOffsetCommitResponse, 0, 3)
async def handle_txn_offset_commit(broker, context, request):
    version = context.version
    denied = (TRANSACTIONAL_ID_AUTHORIZATION_FAILED
              if not broker.allowed(context, WRITE, TRANSACTIONAL_ID, request.transactional_id) else
              GROUP_AUTHORIZATION_FAILED if not broker.allowed(context, READ, GROUP, request.group_id) else 0)
    if denied:
        errors = {(t.name, p.partition_index): denied for t in request.topics for p in t.partitions}
        return TxnOffsetCommitResponse(throttle_time_ms=0,
                                       topics=answer_topics(Topic_, Partition_, request.topics, errors))
    await broker.transactions.wait_completed(request.transactional_id)
    offsets, errors = read_offsets(broker, request.topics, with_leader_epoch=version >= 2, context=context)
    error = _check(broker, request, version)
    if not error and offsets:
        await broker.groups.stage_transactional_offsets(request.group_id, request.producer_id, offsets)
    for key in offsets:
        errors[key] = error
    return TxnOffsetCommitResponse(throttle_time_ms=0, topics=answer_topics(Topic_, Partition_, request.topics, errors))


def _check(broker, request, version: int) -> int:
    # No TxnOffsetCommit version added PRODUCER_FENCED (KIP-588 bumped only the transaction
    # coordinator's APIs): Kafka's group coordinator answers a fenced producer with
    # INVALID_PRODUCER_EPOCH at every version.
    try:
        broker.transactions.check_offset_commit(
            request.transactional_id,
            request.producer_id,
            request.producer_epoch,
            request.group_id,
            fenced_error=INVALID_PRODUCER_EPOCH,
        )
    except TransactionError as exc:
        return exc.error_code
    if version >= 3:
        # KIP-447: a zombie consumer generation must not commit through a live transaction.
        return broker.groups.validate_txn_offset_commit(
            request.group_id, request.generation_id, request.member_id or "", request.group_instance_id
        )
    return 0
