"""The transactional ids of an exactly-once Kafka sink, for ``sparkeos sinks``: what they committed, and aborting what
they left open, as Flink does with lingering transactions.

A task of the sink commits its transaction itself, together with its marker, so nothing is ever decided and left
uncommitted: what a crashed or abandoned query leaves is open transactions, which hold back the last stable offset
of the partitions they wrote (``read_committed`` readers see nothing past it) until the broker aborts them after
``transaction.timeout.ms``, or until a producer of the same transactional id starts.

The ids are found from their marker groups, ``<id>/<query>/<topic>`` (``markers.marker_key``), with the last batch
each committed for the query. Aborting a query's work starts a producer under each of its ids (InitProducerId),
which aborts the id's open transaction at once and fences any producer still writing under it: a task of a query
that still runs fails and Spark retries it, which the sink's markers make safe. Kafka's own listing of every open
transaction (ListTransactions and DescribeTransactions, Kafka 3.0+) is not offered by librdkafka. An id that never
committed a batch has no marker group, so its open transaction ends with ``transaction.timeout.ms``; batch writes
name no query, and are not listed.
"""

from __future__ import annotations

from confluent_kafka import KafkaException, Producer

from ...pending_work import AbortOutcome, PendingWork
from ..cluster import KafkaCluster, connection_config
from ..options import SinkOptions, parse_sink_options
from .markers import marker_partition

TRANSACTIONAL_ID = "transactional-id"
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
        """query -> the transactional ids with a marker group for it and the sink's topic."""
        suffix = f"/{self.options.topic}"
        found: dict[str, list[str]] = {}
        for group in self.cluster.group_ids():
            if not group.endswith(suffix):
                continue
            transactional_id, separator, query = group[: -len(suffix)].rpartition("/")
            if separator and transactional_id and query:
                found.setdefault(query, []).append(transactional_id)
        return found

    def list_pending(self, query: str | None = None) -> list[PendingWork]:
        ids = self._ids()
        partitions = self.cluster.topics().get(self.options.marker_topic, 0)
        work = []
        for name in sorted(ids) if query is None else [query]:
            for transactional_id in sorted(ids.get(name, [])):
                marker = (self.options.marker_topic, marker_partition(transactional_id, partitions))
                # Not require_stable: an open transaction of the id is committing this very offset.
                offset = self.cluster.group_offsets(f"{transactional_id}/{name}/{self.options.topic}", [marker],
                                                    require_stable=False).get(marker)
                work.append(PendingWork(name, -1 if offset is None else offset - 1, TRANSACTIONAL_ID, transactional_id,
                                        None, False,
                                        note=(f"committed through batch {offset - 1 if offset else '-'}; an open "
                                              "transaction of it ends after transaction.timeout.ms, or with "
                                              "sparkeos sinks abort")))
        return work

    def abort_query(self, query: str, older_than_s: float) -> AbortOutcome:
        ids = self._ids()
        if query not in ids:
            raise ValueError(f"no transactional id of the Kafka sink writing to {self.options.topic!r} committed for "
                             f"query {query!r}; queries found: {', '.join(sorted(ids)) or 'none'}")
        outcome = AbortOutcome(query, True, fence_note=(
            "each transactional id fenced: its open transaction is aborted now, and a task still writing under it "
            "fails and is retried by Spark"))
        for work in self.list_pending(query):
            self._fence(work.name)
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
