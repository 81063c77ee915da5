"""One module per Kafka API; importing this package registers them all."""

from . import (  # noqa: F401
    api_versions,
    fetch,
    find_coordinator,
    init_producer_id,
    list_offsets,
    metadata,
    offset_for_leader_epoch,
    produce,
)
