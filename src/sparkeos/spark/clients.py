"""Kafka clients cached per Python worker, so tasks do not pay connection set-up (or init_transactions)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

Client = TypeVar("Client")


class ClientCache(Generic[Client]):
    """A small LRU: a long-lived worker that served many queries keeps only the recent clients open."""

    def __init__(self, capacity: int, close: Callable[[Client], None]):
        self.capacity = capacity
        self.close = close
        self.entries: OrderedDict[Hashable, Client] = OrderedDict()

    def get(self, key: Hashable, create: Callable[[], Client]) -> Client:
        client = self.entries.get(key)
        if client is None:
            client = create()
            self.entries[key] = client
            while len(self.entries) > self.capacity:
                _, evicted = self.entries.popitem(last=False)
                self.discard_client(evicted)
        self.entries.move_to_end(key)
        return client

    def forget(self, client: Client) -> None:
        for key, cached in list(self.entries.items()):
            if cached is client:
                del self.entries[key]
        self.discard_client(client)

    def discard_client(self, client: Client) -> None:
        try:
            self.close(client)
        except Exception:  # noqa: BLE001 - a client being dropped may be broken in any way
            pass
