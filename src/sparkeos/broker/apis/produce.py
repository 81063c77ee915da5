"""Produce (0): validate batches and every record in them, check producer sequences, append, and
acknowledge per acks.

A topic the broker does not have is UNKNOWN_TOPIC_OR_PARTITION: as in Kafka, only Metadata creates
topics, and clients ask it before they produce. Each record is read before its batch is appended
(record_validation.py; a compressed batch is decompressed for it), and a batch with one record that
cannot be read is refused whole; the per-record `record_errors` of v8+ report the records a
compacted topic refuses for having no key.

Leaves out:
- message formats v0 and v1 (magic 0 and 1), the only ones clients of Produce v0-v2 send: every
  partition must hold exactly one magic-2 batch;
- `timeout_ms`: with one replica there is nothing to wait for but the fsync of acks=-1;
- rewriting a batch's records: a batch whose record offset deltas are not 0, 1, 2... is refused
  where Kafka would rewrite it (a batch is recompressed, as Kafka does, only when its codec is not
  the one its topic's `compression.type` names);
- record timestamp checks (`message.timestamp.before.max.ms` / `after.max.ms` are not topic configs
  here): every timestamp is accepted.
"""

from __future__ import annotations

import logging

from kafka.protocol.producer import ProduceRequest, ProduceResponse

from ..acls import TOPIC, TRANSACTIONAL_ID, WRITE
from ..compression import ZSTD
from ..dispatch import api
from ..errors import (
    CORRUPT_MESSAGE,
    INVALID_RECORD,
    INVALID_REQUIRED_ACKS,
    KAFKA_STORAGE_ERROR,
    TOPIC_AUTHORIZATION_FAILED,
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
    UNKNOWN_TOPIC_OR_PARTITION,
    UNSUPPORTED_COMPRESSION_TYPE,
)
from ..produce_decoding import MIN_VERSION as FIRST_DEDICATED_VERSION
from ..produce_decoding import decode_produce_request
from ..protocol import decode_generic
from ..records import ATTR_COMPRESSION_MASK, HEADER_SIZE, InvalidBatch, parse_header
from ..storage.producer_state import SequenceError

log = logging.getLogger("sparkeos.broker.produce")

LOG_OVERHEAD = 12
HEADER_SIZE_UP_TO_MAGIC = 17
RECORD_OVERHEAD_V0 = 14

FIRST_ZSTD_VERSION = 7
ATTRIBUTES_LOW_BYTE = 22  # the byte of the batch attributes that holds the compression codec

TopicResponse = ProduceResponse.TopicProduceResponse
PartitionResponse = TopicResponse.PartitionProduceResponse
RecordError = PartitionResponse.BatchIndexAndErrorMessage


def _error(index: int, code: int, message: str | None = None,
           record_errors: list[tuple[int, str]] | None = None) -> PartitionResponse:
    return PartitionResponse(
        index=index, error_code=code, base_offset=-1, error_message=message,
        record_errors=[RecordError(batch_index=i, batch_index_error_message=m) for i, m in record_errors or []],
    )


def decode_request(body: memoryview, version: int):
    """v3+ (one magic-2 batch per partition, what every current client sends): records stay views of the frame."""
    if version >= FIRST_DEDICATED_VERSION:
        return decode_produce_request(body, version)
    return decode_generic(ProduceRequest, body, version, ProduceRequest.API_KEY)


@api(ProduceRequest, ProduceResponse, 0, 9, decode=decode_request)
async def handle_produce(broker, context, request):
    acks = request.acks
    results: list[TopicResponse] = []
    touched = []
    # WRITE on the transactional id for transactional batches, WRITE on each topic, as Kafka's checks. With the
    # authorizer on, transactional batches need a transactional id, and it must be their producer's: else a
    # principal allowed to write a topic could append to another producer's transaction.
    transactional = broker.authorizer.enabled and any(
        _is_transactional(partition_data.records)
        for topic_data in request.topic_data for partition_data in topic_data.partition_data)
    transactional_denied = (transactional and not request.transactional_id) or (
        bool(request.transactional_id) and not broker.allowed(context, WRITE, TRANSACTIONAL_ID,
                                                              request.transactional_id))
    for topic_data in request.topic_data:
        partitions = []
        topic_denied = not broker.allowed(context, WRITE, TOPIC, topic_data.name)
        for partition_data in topic_data.partition_data:
            if acks not in (0, 1, -1):
                partitions.append(_error(partition_data.index, INVALID_REQUIRED_ACKS))
                continue
            if transactional_denied or topic_denied:
                partitions.append(_error(partition_data.index, TRANSACTIONAL_ID_AUTHORIZATION_FAILED
                                         if transactional_denied else TOPIC_AUTHORIZATION_FAILED))
                continue
            partitions.append(
                append_partition(broker, request, topic_data.name, partition_data, touched, context.version)
            )
        results.append(TopicResponse(name=topic_data.name, partition_responses=partitions))
    if touched:
        broker.notify_appended(touched)
    if acks == 0:
        return None
    if acks == -1:
        for partition_log in touched:
            await broker.make_durable(partition_log)
    return ProduceResponse(responses=results, throttle_time_ms=0)


def _is_transactional(records) -> bool:
    return records is not None and len(records) >= HEADER_SIZE and parse_header(records).is_transactional


def _whole_batch_size(records: bytes | memoryview, pos: int) -> int | None:
    """Size of the batch at `pos`, None if no whole batch is there (Kafka's nextBatchSize + nextBatch)."""
    remaining = len(records) - pos
    if remaining < LOG_OVERHEAD:
        return None
    record_size = int.from_bytes(records[pos + 8 : pos + 12], "big", signed=True)
    if record_size < RECORD_OVERHEAD_V0:
        raise InvalidBatch(CORRUPT_MESSAGE, f"record size {record_size} is less than the minimum record overhead")
    if remaining < HEADER_SIZE_UP_TO_MAGIC:
        return None
    magic = int.from_bytes(records[pos + 16 : pos + 17], "big", signed=True)
    if not 0 <= magic <= 2:
        raise InvalidBatch(CORRUPT_MESSAGE, f"invalid magic found in record: {magic}")
    size = record_size + LOG_OVERHEAD
    return size if remaining >= size else None


def validate_produce_records(version: int, records: bytes | memoryview) -> None:
    """Kafka's checks of a v3+ Produce's records before the log sees them (ProduceRequest.validateRecords
    and the first checks of UnifiedLog.analyzeAndValidateRecords): exactly one whole magic-2 batch
    with base offset 0."""
    if version < 3:
        return
    size = _whole_batch_size(records, 0)
    if size is None:
        raise InvalidBatch(INVALID_RECORD, f"Produce requests with version {version} must have at least one "
                                           "record batch per partition")
    if records[16] != 2:
        raise InvalidBatch(INVALID_RECORD, f"Produce requests with version {version} are only allowed to contain "
                                           "record batches with magic version 2")
    if version < FIRST_ZSTD_VERSION and len(records) > ATTRIBUTES_LOW_BYTE and (
            records[ATTRIBUTES_LOW_BYTE] & ATTR_COMPRESSION_MASK == ZSTD):
        raise InvalidBatch(UNSUPPORTED_COMPRESSION_TYPE, f"Produce requests with version {version} are not allowed "
                                                         "to use ZStandard compression")
    if _whole_batch_size(records, size) is not None:
        raise InvalidBatch(INVALID_RECORD, f"Produce requests with version {version} are only allowed to contain "
                                           "exactly one record batch per partition")
    if int.from_bytes(records[0:8], "big", signed=True) != 0:
        raise InvalidBatch(INVALID_RECORD, "the baseOffset of a produced record batch should be 0")


def append_partition(broker, request, topic_name: str, partition_data, touched: list,
                     version: int = 3) -> PartitionResponse:
    index = partition_data.index
    partition_log = broker.partition(topic_name, index)
    if partition_log is None:
        # Also for a name no topic could have, as Kafka answers (its metadata cache has no such topic).
        return _error(index, UNKNOWN_TOPIC_OR_PARTITION)
    records = partition_data.records
    if records is None:
        return _error(index, CORRUPT_MESSAGE, "no records")
    try:
        validate_produce_records(version, records)
        if len(records) == 0:
            return _error(index, CORRUPT_MESSAGE, "no records")
        broker.check_transactional_produce(request, topic_name, index, records)
        result = partition_log.append(records, max_uncompressed_bytes=broker.config.max_request_bytes)
    except InvalidBatch as exc:
        return _error(index, exc.error_code, str(exc), exc.record_errors)
    except SequenceError as exc:
        return _error(index, exc.error_code, str(exc))
    except OSError as exc:
        log.error("append to %s-%d failed: %s", topic_name, index, exc)
        return _error(index, KAFKA_STORAGE_ERROR, str(exc))
    # A duplicate is acknowledged like its original, which may still await its fsync.
    touched.append(partition_log)
    return PartitionResponse(
        index=index,
        error_code=0,
        base_offset=result.base_offset,
        log_append_time_ms=result.log_append_time,
        log_start_offset=partition_log.log_start_offset,
    )
