"""The transactional ids of an exactly-once Kafka sink, for ``sparkeos sinks``: what they committed, and aborting what
they left open, as Flink does with lingering transactions.

A task of the sink commits its transaction itself, together with its marker, so nothing is ever decided and left
uncommitted: what a crashed or abandoned query leaves is open transactions, which hold back the last stable offset
of the partitions they wrote (``read_committed`` readers see nothing past it) until the broker aborts them after
``transaction.timeout.ms``, or until a producer of the same transactional id starts.

The ids are found from their marker groups, ``<id>/<query>/<topic>`` (``markers.marker_key``), with the last batch
each committed for the query. Aborting a query's work starts a producer under each of its ids (InitProducerId),
which aborts the id's open transaction at once and fences any producer still writing under it: a task of a query
that still runs fails and Spark retries it, which the sink's markers make safe. Two queries sharing a
``transactionalIdPrefix`` share their ids: aborting one fences the other's tasks too, which they survive the same
way. Kafka's own listing of every open
transaction (ListTransactions and DescribeTransactions, Kafka 3.0+) is not offered by librdkafka. An id that never
committed a batch has no marker group, so its open transaction ends with ``transaction.timeout.ms``; batch writes
name no query, and are not listed.
"""

from __future__ import annotations

import re

from confluent_kafka import KafkaException, Producer

from ...pending_work import AbortOutcome, PendingWork
from ..cluster import KafkaCluster, connection_config
from ..options import SinkOptions, parse_sink_options

TRANSACTIONAL_ID = "transactional-id"
SINK_TRANSACTIONAL_ID = re.compile(r".+-\d+")
SPARK_QUERY_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
FENCE_TIMEOUT_S = 60.0


class FenceFailed(RuntimeError):
    """A producer could not be started under a transactional id, so its open transaction stays."""


class KafkaSinkOperator:
    """``sparkeos sinks`` for the ``sparkeos.kafka`` sink writing to one topic."""

    def __init__(self, options: SinkOptions):
        if not options.topic:
            raise ValueError("sparkeos sinks needs the Kafka sink's option topic: its transactional ids are found "
                             "by the topic they write")
        self.options = options
        self.cluster = KafkaCluster(options.producer_config(), timeout_s=options.api_timeout_ms / 1000)

    @classmethod
    def from_options(cls, raw: dict[str, str]) -> KafkaSinkOperator:
        return cls(parse_sink_options(raw))

    def _ids(self) -> dict[str, list[str]]:
        """query -> the transactional ids with a marker group for it and the sink's topic. Only names the sink
        gives are taken: ``<prefix>-<Spark partition>/<Spark's query id, a UUID>/<topic>``, so that no one else's
        group, and no one else's transactional id, is taken for the sink's."""
        suffix = f"/{self.options.topic}"
        found: dict[str, list[str]] = {}
        for group in self.cluster.group_ids():
            if not group.endswith(suffix):
                continue
            transactional_id, separator, query = group[: -len(suffix)].rpartition("/")
            if separator and SINK_TRANSACTIONAL_ID.fullmatch(transactional_id) and SPARK_QUERY_ID.fullmatch(query):
                found.setdefault(query, []).append(transactional_id)
        return found

    def _marker_partitions(self) -> int:
        partitions = self.cluster.topics().get(self.options.marker_topic)
        if not partitions:
            raise ValueError(f"the commit marker topic {self.options.marker_topic!r} does not exist: give the sink's "
                             "option commitMarkerTopic as its queries had it")
        return partitions

    def list_pending(self, query: str | None = None) -> list[PendingWork]:
        ids = self._ids()
        if not any(ids.get(name) for name in (ids if query is None else [query])):
            return []
        # Every partition, as the sink reads its markers: partitions added to the marker topic since an id last
        # committed moved its home partition, and its newest offset sits on the old one.
        markers = [(self.options.marker_topic, partition) for partition in range(self._marker_partitions())]
        work = []
        for name in sorted(ids) if query is None else [query]:
            for transactional_id in sorted(ids.get(name, [])):
                # Not require_stable: an open transaction of the id may be committing one of these offsets.
                offsets = self.cluster.group_offsets(f"{transactional_id}/{name}/{self.options.topic}", markers,
                                                     require_stable=False)
                batch = max(offsets.values(), default=0) - 1
                work.append(PendingWork(
                    name, batch, TRANSACTIONAL_ID, transactional_id, None, False,
                    note=(f"committed through batch {batch if batch >= 0 else '-'}; an open transaction of it ends "
                          "after transaction.timeout.ms, or with sparkeos sinks abort")))
        return work

    def abort_query(self, query: str, older_than_s: float) -> AbortOutcome:
        ids = self._ids()
        if query not in ids:
            raise ValueError(f"no transactional id of the Kafka sink writing to {self.options.topic!r} committed for "
                             f"query {query!r}; queries found: {', '.join(sorted(ids)) or 'none'}")
        outcome = AbortOutcome(query, True, fence_note=(
            "each transactional id fenced: its open transaction, if it had one, is aborted now, and a task still "
            "writing under it fails and is retried by Spark"))
        for work in self.list_pending(query):
            try:
                self._fence(work.name)
            except FenceFailed as exc:
                done = ", ".join(w.name for w in outcome.aborted) or "none"
                raise FenceFailed(f"{exc}; fenced before it: {done}") from exc
            outcome.aborted.append(work)
        return outcome

    def _fence(self, transactional_id: str) -> None:
        config = connection_config(self.options.producer_config())
        config.update({"transactional.id": transactional_id,
                       "transaction.timeout.ms": str(self.options.transaction_timeout_ms)})
        producer = Producer(config)
        try:
            producer.init_transactions(FENCE_TIMEOUT_S)
        except KafkaException as exc:
            raise FenceFailed(f"fencing transactional id {transactional_id!r} failed: {exc}") from exc
        finally:
            producer.flush(0)
