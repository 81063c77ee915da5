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
