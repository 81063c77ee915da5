"""The classes Spark calls for a `sparkeos.kafka` read: a streaming query's reader and a batch read's."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence

import pyarrow as pa
from confluent_kafka import Consumer, TopicPartition
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)

from ..options import SourceOptions
from .offsets import (
    BATCH_START_KEY,
    PLAN_KEY,
    DataLossError,
    Offsets,
    batch_plan,
    batch_start,
    data_loss_message,
    decode_offsets,
    encode_offsets,
)
from .planner import OffsetPlanner, plan_ranges, rate_limit
from .range_reader import read_range

log = logging.getLogger("sparkeos.source")


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
        # A replay must read the very ranges the first run read: the sink skips a task whose marker shows the batch,
        # so a task given another range would lose it or write another again. Spark's offset log keeps only ends,
        # and a replay would plan from the current options, the previous end (not this batch's begin where lost
        # offsets were skipped or partitions appeared) and, for batch 0, a fresh initialOffset() that `latest` or a
        # timestamp puts later than the first time. So the begin and the plan travel in the end.
        encoded[BATCH_START_KEY] = encode_offsets(begin)
        encoded[PLAN_KEY] = {"minPartitions": self.options.min_partitions,
                             "maxRecordsPerPartition": self.options.max_records_per_partition}
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
            # Only in an offset log of an older sparkeos, whose ends carry no begin for new partitions; latestOffset
            # checked these for data loss as it planned the batch.
            begin.update(self.planner.cluster.earliest(new))
        plan = batch_plan(end)
        if plan is None:
            return plan_ranges(begin, finish, self.options.min_partitions, self.options.max_records_per_partition)
        return plan_ranges(begin, finish, plan.get("minPartitions"), plan.get("maxRecordsPerPartition"))

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
