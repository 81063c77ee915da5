"""One module per Kafka API; importing this package registers them all."""

from . import (  # noqa: F401
    add_partitions_to_txn,
    api_versions,
    end_txn,
    fetch,
    find_coordinator,
    init_producer_id,
    list_offsets,
    metadata,
    offset_for_leader_epoch,
    produce,
)
