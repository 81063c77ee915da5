"""Offsets of Kafka partitions in Spark's Kafka offset JSON, as the checkpoint's offset log keeps them, and the
error when offsets the query still has to read are gone from Kafka."""

from __future__ import annotations

Partition = tuple[str, int]
Offsets = dict[Partition, int]


class DataLossError(RuntimeError):
    """Offsets the query still has to read are gone from Kafka and failOnDataLoss is true."""


def encode_offsets(offsets: Offsets) -> dict:
    """Spark's Kafka offset JSON: {"topic": {"0": 23}}, sorted so equal offsets compare equal."""
    encoded: dict[str, dict[str, int]] = {}
    for (topic, partition), offset in sorted(offsets.items()):
        encoded.setdefault(topic, {})[str(partition)] = offset
    return encoded


# Keys no topic can have (':' is not allowed in topic names), kept beside the topics in a batch's end offsets, since
# Spark's offset log keeps only ends: where the batch began, and the options its ranges were planned with. A replay
# of the batch after a restart reads those ranges again, whatever the current options or the log's start say.
RESERVED_KEY_PREFIX = "sparkeos:"
BATCH_START_KEY = "sparkeos:batchStart"
PLAN_KEY = "sparkeos:plan"


def decode_offsets(encoded: dict | None) -> Offsets:
    return {(topic, int(p)): int(o) for topic, parts in (encoded or {}).items()
            if not topic.startswith(RESERVED_KEY_PREFIX) for p, o in parts.items()}


def batch_start(start: dict, end: dict) -> dict:
    """Where the batch (start, end] Spark hands over really began: see `KafkaStreamReader.latestOffset`."""
    return end.get(BATCH_START_KEY, start)


def batch_plan(end: dict) -> dict | None:
    """The options the batch ending at `end` was split into ranges with; None in an offset log of an older
    sparkeos, which did not record them."""
    return end.get(PLAN_KEY)


def data_loss_message(what: str) -> str:
    return (
        f"{what}; the data was deleted by retention or DeleteRecords, or the topic was deleted, before the "
        "query read it. Set the source option failOnDataLoss=false to skip what was lost."
    )
