"""Producer id allocation that never hands out the same id twice, across crashes.

Ids are reserved in blocks: the end of the current block is made durable before any id of it
is used, so a restart continues after the block (as Kafka's ProducerIdManager does).
"""

from __future__ import annotations

import os
from pathlib import Path

BLOCK_SIZE = 1000


class ProducerIdManager:
    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self._next = int(path.read_text())
        except (OSError, ValueError):
            self._next = 0
        self._block_end = self._next

    def next_id(self) -> int:
        if self._next >= self._block_end:
            self._reserve(self._next + BLOCK_SIZE)
        producer_id = self._next
        self._next += 1
        return producer_id

    def _reserve(self, block_end: int) -> None:
        tmp = self.path.with_suffix(".tmp")
        with open(tmp, "w") as handle:
            handle.write(str(block_end))
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, self.path)
        self._block_end = block_end
