"""Independent checks of what a pipeline wrote: read a topic to its end, and judge the output exactly once.

Tests, benchmarks and the demo all ask the same two questions of an output topic, so they are answered here
once, with nothing of the pipeline under test: a fresh confluent-kafka consumer reads the topic, and a multiset
comparison says whether every expected record is there exactly once.

Reading to the end. Under read_committed a partition's readable range ends at its last stable offset, and the
offsets just below it may hold transaction markers or aborted records that no consumer ever receives. A reader
that counts records cannot know how many to wait for, and one that stops once nothing arrives for a while stops
early on a slow broker and waits for nothing on a fast one. So each partition's end is asked for once, before
reading, at the reader's isolation level (the last stable offset under read_committed, the high watermark
otherwise), and a partition is finished when the consumer's position reaches that end: after a record just
below it, or at the partition-end event librdkafka raises at its fetch position, which is past any markers and
aborted records it skipped. An overall timeout turns a reader that cannot get there into an error that names
each unfinished partition, never into a short answer.

Judging the output. Expected and read records are multisets of values. What differs falls in one of four kinds:
lost (expected more often than read), duplicated (an expected value read more often than expected), aborted
visible (a value only an aborted transaction wrote, read) and unexpected (any other value read).
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Hashable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition

READ_COMMITTED = "read_committed"
READ_UNCOMMITTED = "read_uncommitted"
DEFAULT_TIMEOUT_S = 60.0
SAMPLES = 5

_CONSUME_BATCH = 10_000
_POLL_S = 0.2
# librdkafka reconnects by itself after these; the reader's deadline bounds how long it may take.
_TRANSIENT_ERRORS = frozenset({KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN})


class Record(NamedTuple):
    """One record as read, with where it was read from."""

    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]] | None


class ReadTimeout(TimeoutError):
    """A topic could not be read to its end in time. `positions` says how far each unfinished partition got, and
    `records_read` how many records were read before the time ran out."""

    def __init__(self, topic: str, timeout_s: float, ends: dict[int, int], positions: dict[int, int | None],
                 records_read: int):
        self.topic = topic
        self.ends = ends
        self.positions = positions
        self.records_read = records_read
        where = ", ".join(
            f"partition {p} at {'no offset yet' if position is None else f'offset {position}'} of {ends[p]}"
            for p, position in sorted(positions.items())
        )
        super().__init__(f"reading {topic} to its end timed out after {timeout_s} s "
                         f"with {records_read} records read: {where}")


def _consumer(bootstrap: str, isolation_level: str, config: Mapping[str, Any] | None) -> Consumer:
    if isolation_level not in (READ_COMMITTED, READ_UNCOMMITTED):
        raise ValueError(f"isolation_level must be {READ_COMMITTED} or {READ_UNCOMMITTED}, got {isolation_level!r}")
    return Consumer({
        "bootstrap.servers": bootstrap,
        "group.id": f"sparkeos-verify-{uuid.uuid4().hex}",  # assigned, never joined: only names the client
        "isolation.level": isolation_level,
        "enable.auto.commit": False,
        "enable.partition.eof": True,
        "auto.offset.reset": "earliest",
        # librdkafka pauses fetching 1 s whenever 100,000 records wait in its queue.
        "fetch.queue.backoff.ms": 10,
        **(config or {}),
    })


def _ends(consumer: Consumer, topic: str, timeout_s: float) -> dict[int, int]:
    """Each partition's end as `consumer` reaches it; none for a topic that does not exist. A request that fails
    on a connection the broker or a network closed is asked again until `timeout_s` runs out."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return _ends_once(consumer, topic, max(deadline - time.monotonic(), 0.5))
        except KafkaException as exc:
            if exc.args[0].code() not in _TRANSIENT_ERRORS or time.monotonic() >= deadline:
                raise
        time.sleep(0.1)


def _ends_once(consumer: Consumer, topic: str, timeout_s: float) -> dict[int, int]:
    metadata = consumer.list_topics(topic, timeout=timeout_s).topics.get(topic)
    if metadata is None:
        return {}
    if metadata.error is not None:
        if metadata.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
            return {}
        # Any other answer (a broker still starting, say) is no proof that the topic is empty.
        raise KafkaException(metadata.error)
    # A consumer's watermark query is a ListOffsets at its own isolation level: the last stable offset for
    # read_committed.
    return {
        p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout_s, cached=False)[1]
        for p in sorted(metadata.partitions)
    }


def end_offsets(bootstrap: str, topic: str, *, isolation_level: str = READ_COMMITTED,
                timeout_s: float = 10.0, config: Mapping[str, Any] | None = None) -> dict[int, int]:
    """partition -> the offset a reader at `isolation_level` reads up to now: the last stable offset under
    read_committed, the high watermark under read_uncommitted. Empty for a topic that does not exist."""
    consumer = _consumer(bootstrap, isolation_level, config)
    try:
        return _ends(consumer, topic, timeout_s)
    finally:
        consumer.close()


def iter_records(bootstrap: str, topic: str, *, isolation_level: str = READ_COMMITTED,
                 timeout_s: float = DEFAULT_TIMEOUT_S, config: Mapping[str, Any] | None = None,
                 last: int | None = None) -> Iterator[Record]:
    """Every record of `topic` below each partition's end, as a fresh consumer at `isolation_level` sees it; with
    `last`, only those among each partition's last `last` offsets.

    The ends are taken once, when reading begins: records written later are not read. A topic that does not
    exist reads as empty. Records come in each partition's offset order; partitions interleave.

    Raises ReadTimeout when a partition does not reach its end within `timeout_s` (counted from the call), and
    KafkaException on a consumer error other than a lost connection, which librdkafka re-establishes.
    `config` adds to or overrides the consumer's librdkafka settings.
    """
    consumer = _consumer(bootstrap, isolation_level, config)
    try:
        deadline = time.monotonic() + timeout_s
        ends = _ends(consumer, topic, max(deadline - time.monotonic(), 1.0))
        positions: dict[int, int | None] = {p: None for p, end in ends.items() if end > 0}
        if positions:
            consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING if last is None else max(ends[p] - last, 0))
                             for p in positions])
        read = 0
        while positions:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ReadTimeout(topic, timeout_s, ends, positions, read)
            for message in consumer.consume(_CONSUME_BATCH, min(_POLL_S, remaining)):
                error = message.error()
                partition = message.partition()
                if error is not None:
                    if error.code() in _TRANSIENT_ERRORS:
                        continue
                    if error.code() != KafkaError._PARTITION_EOF:
                        raise KafkaException(error)
                    position = message.offset()  # the fetch position, past skipped markers and aborted records
                else:
                    position = message.offset() + 1
                    if message.offset() < ends[partition]:
                        read += 1
                        yield Record(partition, message.offset(), message.key(), message.value(), message.headers())
                if partition in positions and position >= ends[partition]:
                    del positions[partition]
                elif partition in positions:
                    positions[partition] = max(position, positions[partition] or 0)
    finally:
        consumer.close()


def read_records(bootstrap: str, topic: str, *, isolation_level: str = READ_COMMITTED,
                 timeout_s: float = DEFAULT_TIMEOUT_S, config: Mapping[str, Any] | None = None) -> list[Record]:
    """`iter_records` as a list: every record of `topic` up to its end, with partition, offset, key and headers."""
    return list(iter_records(bootstrap, topic, isolation_level=isolation_level, timeout_s=timeout_s, config=config))


def read_values(bootstrap: str, topic: str, *, isolation_level: str = READ_COMMITTED,
                timeout_s: float = DEFAULT_TIMEOUT_S, config: Mapping[str, Any] | None = None) -> list[bytes | None]:
    """The values of every record of `topic` up to its end (see `iter_records`)."""
    return [record.value for record in iter_records(bootstrap, topic, isolation_level=isolation_level,
                                                    timeout_s=timeout_s, config=config)]


def count_records(bootstrap: str, topic: str, *, isolation_level: str = READ_COMMITTED,
                  timeout_s: float = DEFAULT_TIMEOUT_S, config: Mapping[str, Any] | None = None) -> int:
    """How many records of `topic` a reader sees up to its end (see `iter_records`), without keeping them."""
    return sum(1 for _ in iter_records(bootstrap, topic, isolation_level=isolation_level, timeout_s=timeout_s,
                                       config=config))


# --- the exactly-once check ---------------------------------------------------------------------


@dataclass(frozen=True)
class ExactlyOnceReport:
    """How the records read differ from the records expected, as multisets of values.

    Each read value beyond its expected count is exactly one of: `duplicated` (the value was expected),
    `aborted_visible` (not expected, and an aborted transaction wrote it) or `unexpected` (neither). A value
    that is both expected and written by an aborted transaction cannot be told apart when it is read once too
    often: it counts as duplicated.
    """

    expected: Counter[Hashable]
    read: Counter[Hashable]
    lost: Counter[Hashable]
    duplicated: Counter[Hashable]
    unexpected: Counter[Hashable]
    aborted_visible: Counter[Hashable]

    @property
    def exact(self) -> bool:
        """Every expected record read exactly once, and nothing else."""
        return not (self.lost or self.duplicated or self.unexpected or self.aborted_visible)

    def describe(self, samples: int = SAMPLES) -> str:
        """One line of totals, then up to `samples` values of each kind of difference."""
        totals = (f"{'exact' if self.exact else 'NOT exact'}: {self.expected.total()} expected, "
                  f"{self.read.total()} read")
        kinds = {"lost": self.lost, "duplicated": self.duplicated, "unexpected": self.unexpected,
                 "aborted-visible": self.aborted_visible}
        if self.exact:
            return totals
        lines = [totals + "; " + ", ".join(f"{differences.total()} {kind}" for kind, differences in kinds.items())]
        for kind, differences in kinds.items():
            if differences:
                shown = "; ".join(f"{value!r} (expected {self.expected[value]}, read {self.read[value]})"
                                  for value in _ordered(differences)[:samples])
                lines.append(f"  {kind}, e.g. {shown}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.describe()


def _ordered(values: Iterable[Hashable]) -> list[Hashable]:
    values = list(values)
    try:
        return sorted(values)  # type: ignore[type-var]
    except TypeError:  # values of mixed types
        return sorted(values, key=repr)


def check_exactly_once(expected: Iterable[Hashable] | Mapping[Hashable, int], read: Iterable[Hashable],
                       aborted: Iterable[Hashable] = ()) -> ExactlyOnceReport:
    """Compare the records `read` with the `expected` multiset (an iterable of values, or a Counter / mapping of
    value -> count). `aborted` are values that aborted transactions wrote: read, they are reported as
    aborted-visible rather than unexpected."""
    want, have = Counter(expected), Counter(read)
    aborted_values = set(aborted)
    extra = have - want
    return ExactlyOnceReport(
        expected=want,
        read=have,
        lost=want - have,
        duplicated=Counter({v: n for v, n in extra.items() if v in want}),
        unexpected=Counter({v: n for v, n in extra.items() if v not in want and v not in aborted_values}),
        aborted_visible=Counter({v: n for v, n in extra.items() if v not in want and v in aborted_values}),
    )


def assert_exactly_once(expected: Iterable[Hashable] | Mapping[Hashable, int], read: Iterable[Hashable],
                        aborted: Iterable[Hashable] = (), context: str = "") -> ExactlyOnceReport:
    """`check_exactly_once`, raising AssertionError with the report (and `context` after it) unless exact."""
    report = check_exactly_once(expected, read, aborted)
    if not report.exact:
        raise AssertionError(report.describe() + (f"\n{context}" if context else ""))
    return report
