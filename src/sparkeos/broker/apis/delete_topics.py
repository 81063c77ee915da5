"""DeleteTopics (20): by name, or (v6+) by topic id.

Leaves out:
- `timeout_ms`: the topic is gone before the answer is sent.
"""

from __future__ import annotations

import logging
import uuid

from kafka.protocol.admin import DeleteTopicsRequest, DeleteTopicsResponse

from ..acls import DELETE, TOPIC
from ..dispatch import api
from ..errors import (
    INVALID_REQUEST,
    TOPIC_AUTHORIZATION_FAILED,
    UNKNOWN_SERVER_ERROR,
    UNKNOWN_TOPIC_ID,
    UNKNOWN_TOPIC_OR_PARTITION,
)

log = logging.getLogger("sparkeos.broker.admin")

ZERO_UUID = uuid.UUID(int=0)

Result = DeleteTopicsResponse.DeletableTopicResult


@api(DeleteTopicsRequest, DeleteTopicsResponse, 0, 6)
async def handle_delete_topics(broker, context, request):
    if context.version >= 6:
        wanted = [(t.name, t.topic_id or ZERO_UUID) for t in request.topics]
    else:
        wanted = [(name, ZERO_UUID) for name in request.topic_names]
    names = [n for n, i in wanted if n is not None]
    ids = [i for n, i in wanted if n is None]
    results = []
    for name, topic_id in wanted:
        if name is not None and topic_id != ZERO_UUID:
            results.append(_result(None, ZERO_UUID, INVALID_REQUEST,
                                   "You may not specify both topic name and topic id."))
        elif name is not None and names.count(name) > 1:
            results.append(_result(name, ZERO_UUID, INVALID_REQUEST, "Duplicate topic name."))
        elif name is None and ids.count(topic_id) > 1:
            results.append(_result(None, topic_id, INVALID_REQUEST, "Duplicate topic id."))
        elif (name is not None or broker.store.by_id(topic_id) is not None) and not broker.allowed(
                context, DELETE, TOPIC, name or _name_of(broker, topic_id)):
            results.append(_result(name, topic_id, TOPIC_AUTHORIZATION_FAILED, "Authorization failed."))
        else:
            results.append(_delete(broker, name, topic_id))
    return DeleteTopicsResponse(throttle_time_ms=0, responses=results)


def _name_of(broker, topic_id: uuid.UUID) -> str:
    topic = broker.store.by_id(topic_id)
    return topic.name if topic is not None else ""


def _delete(broker, name: str | None, topic_id: uuid.UUID) -> Result:
    if name is None:
        topic = broker.store.by_id(topic_id)
        if topic is None:
            return _result(None, topic_id, UNKNOWN_TOPIC_ID, f"topic id {topic_id} does not exist")
    else:
        topic = broker.store.get(name)
        if topic is None:
            return _result(name, ZERO_UUID, UNKNOWN_TOPIC_OR_PARTITION, f"topic '{name}' does not exist")
    if topic.internal:
        # The broker's own state lives there; Kafka's tools refuse this as well.
        return _result(topic.name, topic.topic_id, INVALID_REQUEST, f"internal topic '{topic.name}' cannot be deleted")
    try:
        broker.store.delete(topic.name)
    except OSError as exc:
        log.error("deleting topic %s failed: %s", topic.name, exc)
        return _result(topic.name, topic.topic_id, UNKNOWN_SERVER_ERROR, f"deleting the topic failed: {exc}")
    log.info("deleted topic %s", topic.name)
    return _result(topic.name, topic.topic_id, 0, None)


def _result(name: str | None, topic_id: uuid.UUID, error_code: int, message: str | None) -> Result:
    return Result(name=name, topic_id=topic_id, error_code=error_code, error_message=message)
