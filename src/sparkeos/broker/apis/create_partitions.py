"""CreatePartitions (37): grow a topic's partition count (never shrink it).

Leaves out:
- `timeout_ms`: the partitions exist before the answer is sent.
"""

from __future__ import annotations

import logging

from kafka.protocol.admin import CreatePartitionsRequest, CreatePartitionsResponse

from ..acls import ALTER, TOPIC
from ..admin import AdminError, validate_assignment
from ..dispatch import api
from ..errors import (
    INVALID_PARTITIONS,
    INVALID_REPLICA_ASSIGNMENT,
    INVALID_REQUEST,
    TOPIC_AUTHORIZATION_FAILED,
    UNKNOWN_SERVER_ERROR,
    UNKNOWN_TOPIC_OR_PARTITION,
)

log = logging.getLogger("sparkeos.broker.admin")

EXISTING_REPLICATION_FACTOR = 1

Result = CreatePartitionsResponse.CreatePartitionsTopicResult


def check_increase(broker, wanted) -> None:
    topic = broker.store.get(wanted.name)
    if topic is None:
        raise AdminError(UNKNOWN_TOPIC_OR_PARTITION, f"Unable to find topic '{wanted.name}'.")
    current = len(topic.partitions)
    if wanted.count < current:
        raise AdminError(INVALID_PARTITIONS, f"The topic {wanted.name} currently has {current} partition(s); "
                                             f"{wanted.count} would not be an increase.")
    if wanted.count == current:
        raise AdminError(INVALID_PARTITIONS, f"Topic already has {current} partition(s).")
    if wanted.assignments is not None:
        additional = wanted.count - current
        if len(wanted.assignments) != additional:
            raise AdminError(INVALID_REPLICA_ASSIGNMENT,
                             f"Attempted to add {additional} additional partition(s), but only "
                             f"{len(wanted.assignments)} assignment(s) were specified.")
        for assignment in wanted.assignments:
            validate_assignment(list(assignment.broker_ids), EXISTING_REPLICATION_FACTOR)


@api(CreatePartitionsRequest, CreatePartitionsResponse, 0, 3)
async def handle_create_partitions(broker, context, request):
    names = [t.name for t in request.topics]
    results = []
    for wanted in request.topics:
        if names.count(wanted.name) > 1:
            results.append(Result(name=wanted.name, error_code=INVALID_REQUEST, error_message="Duplicate topic name."))
            continue
        if not broker.allowed(context, ALTER, TOPIC, wanted.name):
            results.append(Result(name=wanted.name, error_code=TOPIC_AUTHORIZATION_FAILED,
                                  error_message="Authorization failed."))
            continue
        try:
            check_increase(broker, wanted)
            if not request.validate_only:
                broker.store.add_partitions(wanted.name, wanted.count)
                log.info("topic %s now has %d partitions", wanted.name, wanted.count)
        except AdminError as exc:
            results.append(Result(name=wanted.name, error_code=exc.error_code, error_message=str(exc)))
            continue
        except OSError as exc:
            log.error("adding partitions to %s failed: %s", wanted.name, exc)
            results.append(Result(name=wanted.name, error_code=UNKNOWN_SERVER_ERROR,
                                  error_message=f"adding partitions failed: {exc}"))
            continue
        results.append(Result(name=wanted.name, error_code=0, error_message=None))
    return CreatePartitionsResponse(throttle_time_ms=0, results=results)
