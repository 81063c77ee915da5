"""Group coordinator (classic protocol) and durable committed offsets."""

from __future__ import annotations

from pathlib import Path


class GroupCoordinator:
    def __init__(self, directory: Path, config) -> None:
        self.directory = directory
        self.config = config
        directory.mkdir(parents=True, exist_ok=True)

    def expire(self, now_ms: int) -> None:
        pass

    def close(self) -> None:
        pass
