"""The `sparkeos.kafka` source: Spark's Kafka source semantics on the Python Data Source API.

The driver plans offset ranges [start, end) per Kafka partition; Spark writes them to the
checkpoint's offset log before a batch runs, so a restarted query re-reads exactly the same ranges
(offsets restored from the checkpoint always win over `startingOffsets`). Executors read one range
each with librdkafka, `read_committed` by default, and yield Arrow record batches. Under
read_committed a range may end on a control marker or on aborted records and may contain no visible
record at all; the reader therefore finishes on the first offset >= end or on an end-of-partition
event at or past the end, never by counting records.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Iterator, Sequence

import pyarrow as pa
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, ReadMinRows
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

try:  # SupportsTriggerAvailableNow arrived in pyspark 4.2
    from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow
except ImportError:  # pragma: no cover - older pyspark
    SupportsTriggerAvailableNow = object  # type: ignore[misc,assignment]

from .clients import CONSUMER_TIMEOUT_ENV, ClientCache
from .cluster import KafkaCluster, learn_topic
from .gcpause import cyclic_gc_paused
from .options import EARLIEST, LATEST, SourceOptions, StartSpec

log = logging.getLogger("sparkeos.source")

Partition = tuple[str, int]
Offsets = dict[Partition, int]

HEADERS_TYPE = ArrayType(StructType([StructField("key", StringType()), StructField("value", BinaryType())]))


def source_schema(include_headers: bool) -> StructType:
    """Spark's Kafka source schema, column for column."""
    fields = [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
    ]
    if include_headers:
        fields.append(StructField("headers", HEADERS_TYPE))
    return StructType(fields)


ARROW_HEADERS = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))


def arrow_schema(include_headers: bool) -> pa.Schema:
    fields = [
        ("key", pa.binary()), ("value", pa.binary()), ("topic", pa.string()), ("partition", pa.int32()),
        ("offset", pa.int64()), ("timestamp", pa.timestamp("us", tz="UTC")), ("timestampType", pa.int32()),
    ]
    if include_headers:
        fields.append(("headers", ARROW_HEADERS))
    return pa.schema(fields)


class DataLossError(RuntimeError):
    """Offsets the query still has to read are gone from Kafka and failOnDataLoss is true."""


def encode_offsets(offsets: Offsets) -> dict:
    """Spark's Kafka offset JSON: {"topic": {"0": 23}}, sorted so equal offsets compare equal."""
    encoded: dict[str, dict[str, int]] = {}
    for (topic, partition), offset in sorted(offsets.items()):
        encoded.setdefault(topic, {})[str(partition)] = offset
    return encoded


# A key no topic can have (':' is not allowed in topic names): the start of batch 0, kept inside its end offsets.
BATCH_START_KEY = "sparkeos:batchStart"


def decode_offsets(encoded: dict | None) -> Offsets:
    return {(topic, int(p)): int(o) for topic, parts in (encoded or {}).items() if topic != BATCH_START_KEY
            for p, o in parts.items()}


def batch_start(start: dict, end: dict) -> dict:
    """Where the batch (start, end] Spark hands over really began: see `KafkaStreamReader.latestOffset`."""
    return end.get(BATCH_START_KEY, start)


def data_loss_message(what: str) -> str:
    return (
        f"{what}; the data was deleted by retention or DeleteRecords, or the topic was deleted, before the "
        "query read it. Set the source option failOnDataLoss=false to skip what was lost."
    )


# --- planning (driver) --------------------------------------------------------------------------


class OffsetPlanner:
    """Resolves start/end specifications to concrete offsets on the driver."""

    def __init__(self, options: SourceOptions):
        self.options = options
        self.cluster = KafkaCluster(options.consumer_config(), timeout_s=options.api_timeout_ms / 1000)

    def partitions(self) -> list[Partition]:
        o = self.options
        return self.cluster.partitions_of(o.subscribe, o.subscribe_pattern, o.assign)

    def latest(self, partitions: Sequence[Partition]) -> Offsets:
        return self.cluster.latest(partitions, self.options.read_committed)

    def resolve(self, spec: StartSpec, partitions: Sequence[Partition], ending: bool = False) -> Offsets:
        if spec.kind == "earliest":
            return self.cluster.earliest(partitions)
        if spec.kind == "latest":
            return self.latest(partitions)
        if spec.kind == "group":
            return self._group_offsets(partitions)
        if spec.kind == "offsets":
            return self._specific_offsets(spec, partitions)
        return self._timestamp_offsets(spec, partitions, ending)

    def _group_offsets(self, partitions: Sequence[Partition]) -> Offsets:
        committed = self.cluster.group_offsets(self.options.group_id or "", partitions)
        missing = [p for p in partitions if p not in committed]
        if missing:
            reset = self.options.kafka.get("auto.offset.reset", "latest").lower()
            if reset in ("earliest", "smallest", "beginning"):
                committed.update(self.cluster.earliest(missing))
            elif reset in ("latest", "largest", "end"):
                committed.update(self.latest(missing))
            else:
                named = ", ".join(f"{t}-{p}" for t, p in missing)
                raise ValueError(
                    f"startingOffsets=group: group {self.options.group_id!r} has no committed offset for {named} "
                    f"and kafka.auto.offset.reset={reset!r} says not to guess"
                )
        return committed

    def _specific_offsets(self, spec: StartSpec, partitions: Sequence[Partition]) -> Offsets:
        given = {(t, p): o for t, parts in spec.offsets.items() for p, o in parts.items()}
        unknown = sorted(set(given) - set(partitions))
        if unknown:
            named = ", ".join(f"{t}-{p}" for t, p in unknown)
            raise ValueError(f"option '{spec.option}' names partitions that are not read: {named}")
        # Left out of a start map, a partition matched by subscribePattern starts at earliest, as new partitions
        # do; left out of an end map it would silently read nothing.
        if self.options.assign is not None or self.options.subscribe or spec.option != "startingOffsets":
            unmatched = sorted(set(partitions) - set(given))
            if unmatched:
                named = ", ".join(f"{t}-{p}" for t, p in unmatched)
                raise ValueError(f"option '{spec.option}' must give an offset for every partition; missing {named}")
        earliest = [p for p, o in given.items() if o == EARLIEST]
        latest = [p for p, o in given.items() if o == LATEST]
        resolved = dict(given)
        resolved.update(self.cluster.earliest(earliest))
        resolved.update(self.latest(latest))
        # Partitions the map leaves out (subscribePattern) start at earliest, as new partitions do.
        resolved.update(self.cluster.earliest([p for p in partitions if p not in resolved]))
        return {p: resolved[p] for p in partitions if p in resolved}

    def _timestamp_offsets(self, spec: StartSpec, partitions: Sequence[Partition], ending: bool) -> Offsets:
        if spec.kind == "timestamp":
            per_partition = {p: spec.timestamp for p in partitions}
        else:
            per_partition = {(t, p): ts for t, parts in spec.offsets.items() for p, ts in parts.items()}
            unknown = sorted(set(per_partition) - set(partitions))
            if unknown:
                named = ", ".join(f"{t}-{p}" for t, p in unknown)
                raise ValueError(f"option '{spec.option}' names partitions that are not read: {named}")
            missing = sorted(set(partitions) - set(per_partition))
            if missing and (self.options.assign is not None or self.options.subscribe):
                # As Spark: a partition left out would silently start (or end) at latest.
                named = ", ".join(f"{t}-{p}" for t, p in missing)
                raise ValueError(f"option '{spec.option}' must give a timestamp for every partition; missing {named}")
        resolved: Offsets = {}
        by_timestamp: dict[int, list[Partition]] = {}
        for partition, timestamp in per_partition.items():
            by_timestamp.setdefault(int(timestamp or 0), []).append(partition)
        latest = self.latest(partitions)
        for timestamp, group in by_timestamp.items():
            for partition, offset in self.cluster.for_timestamp(group, timestamp).items():
                if offset >= 0:
                    resolved[partition] = min(offset, latest[partition])
                elif ending or self.options.timestamp_strategy == "latest":
                    resolved[partition] = latest[partition]
                else:
                    raise ValueError(
                        f"option '{spec.option}': no record in {partition[0]}-{partition[1]} has a timestamp "
                        f">= {timestamp}; set startingOffsetsByTimestampStrategy=latest to start at the end"
                    )
        for partition in partitions:
            resolved.setdefault(partition, latest[partition])
        return resolved

    def start_of_new_partitions(self, new: Sequence[Partition]) -> Offsets:
        """Partitions that appeared after the query started are read from their beginning, offset 0: if their
        log starts later, records were deleted before the query could see them."""
        earliest = self.cluster.earliest(new)
        log.info("new partitions %s are read from earliest", sorted(new))
        for (topic, partition), offset in sorted(earliest.items()):
            if offset != 0:
                what = f"new partition {topic}-{partition} starts at offset {offset}, not 0"
                if self.options.fail_on_data_loss:
                    raise DataLossError(data_loss_message(what))
                log.warning("%s: records were lost before the query saw the partition", what)
        return earliest

    def check_data_loss(self, start: Offsets, partitions: Sequence[Partition]) -> Offsets:
        """Where planned start offsets are gone, fail or (failOnDataLoss=false) move to what is left."""
        live = set(partitions)
        vanished = [p for p in start if p not in live]
        if vanished and self.options.fail_on_data_loss:
            named = ", ".join(f"{t}-{p}" for t, p in vanished)
            raise DataLossError(data_loss_message(f"partitions {named} no longer exist"))
        present = {p: o for p, o in start.items() if p in live}
        earliest = self.cluster.earliest(list(present))
        adjusted = dict(present)
        for partition, offset in present.items():
            if offset < earliest[partition]:
                if self.options.fail_on_data_loss:
                    raise DataLossError(data_loss_message(
                        f"offsets {offset}..{earliest[partition]} of {partition[0]}-{partition[1]} are gone"
                    ))
                log.warning("skipping lost offsets %d..%d of %s-%d", offset, earliest[partition], *partition)
                adjusted[partition] = earliest[partition]
        return adjusted


def rate_limit(begin: Offsets, end: Offsets, max_records: int) -> Offsets:
    """Spread `max_records` over partitions in proportion to their backlog, as Spark's Kafka source does."""
    sizes = {p: max(end[p] - begin.get(p, end[p]), 0) for p in end}
    total = sum(sizes.values())
    if total <= max_records:
        return dict(end)
    limited = {}
    for partition, size in sizes.items():
        start = begin.get(partition, end[partition])
        share = max_records * (size / total)
        step = math.ceil(share) if share < 1 else math.floor(share)
        limited[partition] = min(start + step, end[partition])
    return limited


class KafkaRange(InputPartition):
    """One Spark task's share: offsets [start, end) of one Kafka partition."""

    def __init__(self, topic: str, partition: int, start: int, end: int):
        super().__init__((topic, partition, start, end))
        self.topic, self.partition, self.start, self.end = topic, partition, start, end

    @property
    def size(self) -> int:
        return max(self.end - self.start, 0)


def plan_ranges(begin: Offsets, end: Offsets, min_partitions: int | None,
                max_records: int | None) -> list[KafkaRange]:
    ranges = [KafkaRange(t, p, begin[(t, p)], end[(t, p)]) for (t, p) in sorted(end) if end[(t, p)] > begin[(t, p)]]
    if max_records:
        ranges = [piece for r in ranges for piece in _split(r, math.ceil(r.size / max_records))]
    if min_partitions and len(ranges) < min_partitions:
        ranges = _spread_over(ranges, min_partitions)
    return ranges


def _spread_over(ranges: list[KafkaRange], min_partitions: int) -> list[KafkaRange]:
    """Spark's KafkaOffsetRangeCalculator: ranges too small for a second part stay whole, and the parts left
    are shared among the others in proportion to their sizes (rounded half up)."""
    def parts(size: int, total: int, wanted: int) -> int:
        return max(math.floor(size / total * wanted + 0.5), 1)

    total = sum(r.size for r in ranges)
    stays_whole = [parts(r.size, total, min_partitions) == 1 for r in ranges]
    split_total = sum(r.size for r, whole in zip(ranges, stays_whole, strict=True) if not whole)
    split_parts = max(min_partitions - sum(stays_whole), 1)
    return [piece for r, whole in zip(ranges, stays_whole, strict=True)
            for piece in ([r] if whole else _split(r, parts(r.size, split_total, split_parts)))]


def _split(whole: KafkaRange, parts: int) -> list[KafkaRange]:
    """As Spark: each part takes an even share of what is left, so the later parts take the remainder."""
    if parts <= 1:
        return [whole]
    pieces, start, remaining = [], whole.start, whole.size
    for part in range(parts):
        size = remaining // (parts - part)
        remaining -= size
        if size:
            pieces.append(KafkaRange(whole.topic, whole.partition, start, start + size))
        start += size
    return pieces


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: SourceOptions):
        self.options = options
        self._planner: OffsetPlanner | None = None
        self.latest_seen: Offsets | None = None
        self.available_now_target: Offsets | None = None
        # As Spark's: no batch yet, so maxTriggerDelay has long passed and minOffsetsPerTrigger does not hold
        # back the first batch of a start.
        self.last_trigger_ms = 0.0
        self._group_committer = None
        self._group_committed: Offsets | None = None
        self._initial: dict | None = None

    def __getstate__(self) -> dict:
        # Spark ships the reader to executors for read(); Kafka clients stay on the driver.
        return {"options": self.options}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["options"])

    @property
    def planner(self) -> OffsetPlanner:
        if self._planner is None:
            self._planner = OffsetPlanner(self.options)
        return self._planner

    def initialOffset(self) -> dict:
        # Spark asks more than once as a query starts (twice per start in Spark 4.3). Asked again, `latest` or a
        # timestamp would move with the log: the first answer stands, as Spark's Kafka source keeps its own.
        if self._initial is None:
            partitions = self.planner.partitions()
            offsets = self.planner.resolve(self.options.starting, partitions)
            log.info("initial offsets from %s: %s", self.options.starting.option, offsets)
            self._initial = encode_offsets(offsets)
        return self._initial

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.min_offsets_per_trigger is not None:
            return ReadMinRows(self.options.min_offsets_per_trigger)
        if self.options.max_offsets_per_trigger is not None:
            return ReadMaxRows(self.options.max_offsets_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        partitions = self.planner.partitions()
        self.available_now_target = self.planner.latest(partitions)

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        begin = decode_offsets(start)
        # Spark calls commit(end) of batch N only once batch N+1 has data, so an idle query would never report
        # its last batch; `start` here is always the end of a completed batch (or the initial offsets).
        self._report_to_group(begin)
        if self.available_now_target is not None:
            partitions = sorted(self.available_now_target)
            latest = dict(self.available_now_target)
        else:
            partitions = self.planner.partitions()
            latest = self.planner.latest(partitions)
        self.latest_seen = latest
        begin = self.planner.check_data_loss(begin, partitions)
        new = [p for p in partitions if p not in begin]
        if new:
            begin.update(self.planner.start_of_new_partitions(new))
        if self.available_now_target is not None:
            self._settle_starts_past_the_target(begin, latest)
        for partition in partitions:
            if latest[partition] < begin[partition]:
                what = (f"the end of {partition[0]}-{partition[1]} went back from {begin[partition]} "
                        f"to {latest[partition]}")
                if self.options.fail_on_data_loss:
                    raise DataLossError(data_loss_message(what))
                # As Spark: nothing is read there in this batch, and the next one starts at the new end (a topic
                # deleted and made again is read from its new records on).
                log.warning("%s; reading on from %d", what, latest[partition])
        end = self._admit(begin, latest, limit)
        if end == decode_offsets(start):
            # The very same offsets: Spark compares them as JSON, and must see no new data.
            return start
        self.last_trigger_ms = time.time() * 1000
        encoded = encode_offsets(end)
        if start == self._initial:
            # Spark's offset log keeps only ends. Replaying batch 0 after a restart, Spark begins it at a fresh
            # initialOffset(), which `latest` or a timestamp puts later than the first time: the records in
            # between would be lost. The start travels in the end instead, which the log does keep.
            encoded[BATCH_START_KEY] = start
        return encoded

    def _settle_starts_past_the_target(self, begin: Offsets, target: Offsets) -> None:
        """Spark fixes the Trigger.AvailableNow target before it asks for the initial offsets, so with
        startingOffsets=latest (or a timestamp) records written in between put a start past the target. Such a
        partition has nothing left to read; only a fresh look at its end tells that from lost records."""
        past = [p for p in target if target[p] < begin[p]]
        if not past:
            return
        now = self.planner.latest(past)
        for partition in past:
            if now[partition] >= begin[partition]:
                target[partition] = begin[partition]

    def _admit(self, begin: Offsets, latest: Offsets, limit: ReadLimit) -> Offsets:
        if isinstance(limit, ReadAllAvailable):
            return latest
        available = sum(max(latest[p] - begin[p], 0) for p in latest)  # an end that went back adds nothing
        # Under Trigger.AvailableNow a delayed batch would end the query short of its target: no minimum there.
        minimum = self.options.min_offsets_per_trigger if self.available_now_target is None else None
        waited_ms = time.time() * 1000 - self.last_trigger_ms
        if minimum is not None and available < minimum and waited_ms < self.options.max_trigger_delay_ms:
            return begin
        maximum = limit.max_rows if isinstance(limit, ReadMaxRows) else self.options.max_offsets_per_trigger
        return rate_limit(begin, latest, maximum) if maximum is not None else latest

    def reportLatestOffset(self) -> dict | None:
        return encode_offsets(self.latest_seen) if self.latest_seen is not None else None

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        begin = decode_offsets(batch_start(start, end))
        finish = decode_offsets(end)
        new = [p for p in finish if p not in begin]
        if new:
            # latestOffset checked these for data loss as it planned the batch.
            begin.update(self.planner.cluster.earliest(new))
        return plan_ranges(begin, finish, self.options.min_partitions, self.options.max_records_per_partition)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_range(self.options, partition)

    def commit(self, end: dict) -> None:
        self._report_to_group(decode_offsets(end))

    def _report_to_group(self, offsets: Offsets) -> None:
        if not self.options.commit_offsets_to_group or offsets == self._group_committed:
            return
        # Lag tools only: exactly-once never reads these back (the checkpoint owns positions).
        try:
            self._commit_to_group(offsets)
            self._group_committed = dict(offsets)
        except Exception as exc:  # noqa: BLE001 - a lag report must never fail the query
            log.warning("committing offsets to group %r failed: %s", self.options.group_id, exc)

    def _commit_to_group(self, offsets: Offsets) -> None:
        if self._group_committer is None:
            config = self.options.consumer_config()
            config["group.id"] = self.options.group_id or ""
            self._group_committer = Consumer(config)
        self._group_committer.commit(
            offsets=[TopicPartition(t, p, o) for (t, p), o in offsets.items()], asynchronous=False
        )

    def stop(self) -> None:
        if self._group_committer is not None:
            self._group_committer.close()
            self._group_committer = None


class KafkaBatchReader(DataSourceReader):
    def __init__(self, options: SourceOptions):
        self.options = options
        planner = OffsetPlanner(options)
        partitions = planner.partitions()
        self.start = planner.check_data_loss(planner.resolve(options.starting, partitions), partitions)
        self.end = planner.resolve(options.ending, partitions, ending=True)
        for partition, end in self.end.items():
            if end < self.start.get(partition, end):
                raise ValueError(
                    f"endingOffsets {end} of {partition[0]}-{partition[1]} is before its starting offset "
                    f"{self.start[partition]}"
                )

    def partitions(self) -> Sequence[InputPartition]:
        return plan_ranges(self.start, self.end, self.options.min_partitions, self.options.max_records_per_partition)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_range(self.options, partition)


# --- reading (executors) ------------------------------------------------------------------------

ROWS_PER_ARROW_BATCH = 8192
CONSUME_POLL_S = 0.02
TOPIC_LOOKUP_TIMEOUT_S = 5.0  # counts towards kafkaConsumer.pollTimeoutMs, after which a read fails
# One consumer per Python worker and configuration: connections survive from task to task.
_consumers: ClientCache[Consumer] = ClientCache(8, Consumer.close, CONSUMER_TIMEOUT_ENV, "5m")


class _ArrowBuilder:
    def __init__(self, topic: str, partition: int, include_headers: bool):
        self.topic, self.partition, self.include_headers = topic, partition, include_headers
        self.schema = arrow_schema(include_headers)
        self.reset()

    def reset(self) -> None:
        self.keys: list = []
        self.values: list = []
        self.offsets: list = []
        self.timestamps: list = []
        self.types: list = []
        self.headers: list = []

    def add(self, message) -> None:
        """Add one record (a message without error)."""
        self.add_records_below([message], message.offset() + 1)

    def add_records_below(self, messages: list, end: int) -> int:
        """Add the leading messages that are records with offsets below `end`; return how many were added.

        The reader's hot loop: per record, a method call to add() cost as much as the rest of the loop."""
        keys, values, offsets = self.keys.append, self.values.append, self.offsets.append
        timestamps, types, headers = self.timestamps.append, self.types.append, self.headers.append
        include_headers = self.include_headers
        before = len(self.offsets)
        for message in messages:
            if message.error() is not None or (offset := message.offset()) >= end:
                break
            keys(message.key())
            values(message.value())
            offsets(offset)
            kind, timestamp = message.timestamp()
            # Spark turns a missing timestamp (-1) into -1 ms, not null.
            timestamps(timestamp * 1000 if kind else -1000)
            # librdkafka: 0 none, 1 create time, 2 log append time; Spark: -1, 0, 1.
            types(kind - 1)
            if include_headers:
                headers(message.headers())  # None without headers: null, as in Spark
        return len(self.offsets) - before

    def __len__(self) -> int:
        return len(self.offsets)

    def build(self) -> pa.RecordBatch:
        count = len(self.offsets)
        columns = [
            pa.array(self.keys, pa.binary()),
            pa.array(self.values, pa.binary()),
            # One value for the whole batch: filled by Arrow, 8x faster than from a Python list of it.
            pa.repeat(pa.scalar(self.topic, pa.string()), count),
            pa.repeat(pa.scalar(self.partition, pa.int32()), count),
            pa.array(self.offsets, pa.int64()),
            pa.array(self.timestamps, pa.timestamp("us", tz="UTC")),
            pa.array(self.types, pa.int32()),
        ]
        if self.include_headers:
            columns.append(pa.array(self.headers, ARROW_HEADERS))
        batch = pa.RecordBatch.from_arrays(columns, schema=self.schema)
        self.reset()
        return batch


def read_range(options: SourceOptions, task: InputPartition) -> Iterator[pa.RecordBatch]:
    """Yield the visible records of offsets [start, end) of one partition, then stop."""
    # A batch read with nothing to read gets one placeholder partition, InputPartition(None), from Spark.
    if not isinstance(task, KafkaRange) or task.start >= task.end:
        return
    config = options.consumer_config()
    with _consumers.lease(json.dumps(config, sort_keys=True), lambda: Consumer(config)) as consumer, \
            cyclic_gc_paused():
        yield from _read_assigned(consumer, options, task)


def _read_assigned(consumer: Consumer, options: SourceOptions, task: KafkaRange) -> Iterator[pa.RecordBatch]:
    idle_since = time.monotonic()
    learn_topic(consumer, task.topic, min(options.poll_timeout_ms / 1000, TOPIC_LOOKUP_TIMEOUT_S))
    consumer.assign([TopicPartition(task.topic, task.partition, task.start)])
    builder = _ArrowBuilder(task.topic, task.partition, options.include_headers)
    timeout_s = options.poll_timeout_ms / 1000
    next_offset = task.start
    last_offset = task.end - 1
    try:
        done = False
        while not done:
            # consume() waits for num_messages or the timeout. Asking for no more than the range can still
            # hold usually returns at once, but control records take offsets and never arrive: a range ending
            # at the end of a transactional partition comes up short, so each wait is kept short (it was 0.2 s,
            # once per such range).
            wanted = max(min(task.end - next_offset, ROWS_PER_ARROW_BATCH), 1)
            messages = consumer.consume(num_messages=wanted, timeout=min(timeout_s, CONSUME_POLL_S))
            if not messages:
                if time.monotonic() - idle_since > timeout_s:
                    raise TimeoutError(
                        f"reading {task.topic}-{task.partition} offsets [{task.start}, {task.end}) got nothing for "
                        f"{timeout_s:.0f} s (kafkaConsumer.pollTimeoutMs)"
                    )
                continue
            idle_since = time.monotonic()
            # The common message, a record short of the range's last offset, in bulk; everything after the
            # first other one (an event, the range's last record) goes to _take.
            added = builder.add_records_below(messages, last_offset)
            if added:
                next_offset = max(next_offset, messages[added - 1].offset() + 1)
            for message in messages[added:]:
                try:
                    if _take(message, task, builder, options.fail_on_data_loss):
                        done = True
                        break
                except _OffsetsGone:
                    resumed = _resume_after_lost_offsets(consumer, task, next_offset, timeout_s)
                    if resumed is None:
                        done = True
                        break
                    next_offset = resumed
                    continue
                next_offset = max(next_offset, message.offset() + 1)
            if len(builder) >= ROWS_PER_ARROW_BATCH:
                yield builder.build()
        if len(builder):
            yield builder.build()
    finally:
        consumer.unassign()


class _OffsetsGone(Exception):
    """The reader's position is no longer in Kafka, and failOnDataLoss=false."""


def _resume_after_lost_offsets(consumer: Consumer, task: KafkaRange, position: int, timeout_s: float) -> int | None:
    """Where reading goes on within the range once `position` is gone from Kafka; None if nothing of it is left.

    As Spark's reader: the records still in Kafka are read, and a log that now ends below `position` (the topic
    was deleted and made again) ends the range."""
    partition = TopicPartition(task.topic, task.partition)
    low, high = consumer.get_watermark_offsets(partition, timeout=timeout_s, cached=False)
    name = f"{task.topic}-{task.partition}"
    if position >= high or low >= task.end:
        log.warning("offsets [%d, %d) of %s are gone (Kafka now holds [%d, %d)); failOnDataLoss=false skips them",
                    position, task.end, name, low, high)
        return None
    resume = max(position, low)
    log.warning("offsets [%d, %d) of %s are gone; failOnDataLoss=false reads on from %d", position, resume, name,
                resume)
    # Not seek(): librdkafka stopped fetching the partition at the error, and refuses to seek it.
    consumer.assign([TopicPartition(task.topic, task.partition, resume)])
    return resume


def _take(message, task: KafkaRange, builder: _ArrowBuilder, fail_on_data_loss: bool) -> bool:
    """Add one message; True once the range is finished."""
    error = message.error()
    if error is not None:
        if error.code() == KafkaError._PARTITION_EOF:
            # The end of what is readable (LSO under read_committed): finished if it reached `end`.
            return message.offset() >= task.end
        if error.code() in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE):
            if fail_on_data_loss:
                raise DataLossError(data_loss_message(
                    f"offsets [{task.start}, {task.end}) of {task.topic}-{task.partition} are no longer in Kafka"
                ))
            raise _OffsetsGone()
        raise KafkaException(error)
    offset = message.offset()
    if offset >= task.end:
        return True
    builder.add(message)
    return offset == task.end - 1
