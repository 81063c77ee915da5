"""An embedded Confluent-compatible schema registry, stored in the broker's `_schemas` topic.

The registry is a client of the broker (it reads and writes the topic with confluent-kafka), so
the broker itself knows nothing about HTTP or schemas.
"""

from .compatibility import check_compatibility, reader_problems
from .errors import RegistryError
from .server import SchemaRegistryServer
from .store import SchemaStore

__all__ = [
    "RegistryError",
    "SchemaRegistryServer",
    "SchemaStore",
    "check_compatibility",
    "reader_problems",
]
