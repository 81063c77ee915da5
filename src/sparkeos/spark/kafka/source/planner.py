"""Driver-side planning: where reading starts and ends, and the offset ranges [start, end) Spark's tasks read."""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence

from pyspark.sql.datasource import InputPartition

from ..cluster import KafkaCluster
from ..options import EARLIEST, LATEST, SourceOptions, StartSpec
from .offsets import DataLossError, Offsets, Partition, data_loss_message

log = logging.getLogger("sparkeos.source")


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
