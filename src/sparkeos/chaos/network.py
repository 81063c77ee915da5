"""Network faults, one at a time, through the fault proxy (proxy.py): what each is and how to see it took effect,
and a thread that keeps injecting them."""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from .proxy import TcpProxy

PRODUCE, FETCH, LIST_OFFSETS, METADATA = 0, 1, 2, 3
ADD_PARTITIONS_TO_TXN, END_TXN, TXN_OFFSET_COMMIT = 24, 26, 28


@dataclass(frozen=True)
class Fault:
    """One fault and how to see that it took effect."""

    name: str
    inject: Callable[[TcpProxy], None]
    took_effect: Callable[[TcpProxy], bool]


def dropped_answer(name: str, api_key: int) -> Fault:
    """A request of `api_key` reaches the broker, its answer never reaches the client, the connection is cut."""
    def inject(proxy: TcpProxy) -> None:
        proxy.drop_answers(api_key, 1)

    return Fault(name, inject, lambda proxy: proxy.answers_left_to_drop(api_key) == 0)


def refused_connections(name: str, seconds: float, after_api: int | None = None) -> Fault:
    """Every connection cut and new ones refused for `seconds`; with `after_api`, at the next request of that API
    (END_TXN: mid-commit)."""
    def inject(proxy: TcpProxy) -> None:
        if after_api is not None:
            seen = proxy.requests_seen(after_api)
            deadline = time.monotonic() + 30
            while proxy.requests_seen(after_api) == seen and time.monotonic() < deadline:
                time.sleep(0.002)
        proxy.refuse_for(seconds)

    return Fault(name, inject, lambda proxy: not proxy.refusing())


def slow_network(name: str, seconds: float, latency_s: float) -> Fault:
    def inject(proxy: TcpProxy) -> None:
        proxy.delay(latency_s)
        time.sleep(seconds)
        proxy.delay(0)

    return Fault(name, inject, lambda proxy: True)


def split_frames(name: str, seconds: float) -> Fault:
    def inject(proxy: TcpProxy) -> None:
        proxy.split_frames = True
        time.sleep(seconds)
        proxy.split_frames = False

    return Fault(name, inject, lambda proxy: True)


SOURCE_AND_DRIVER_FAULTS = (
    dropped_answer("fetch answer dropped", FETCH),
    dropped_answer("list-offsets answer dropped", LIST_OFFSETS),
    dropped_answer("metadata answer dropped", METADATA),
    refused_connections("connections refused", 2.0),
    slow_network("latency 30 ms", 2.0, 0.03),
    split_frames("frames split", 2.0),
)
SINK_FAULTS = (
    dropped_answer("produce answer dropped", PRODUCE),
    dropped_answer("add-partitions answer dropped", ADD_PARTITIONS_TO_TXN),
    dropped_answer("txn-offset-commit answer dropped", TXN_OFFSET_COMMIT),
    dropped_answer("end-txn answer dropped", END_TXN),
    refused_connections("connections refused mid-commit", 2.0, after_api=END_TXN),
)


def counted(name: str, counter: str, arm) -> Fault:
    """A fault of the PostgreSQL proxy, armed by `arm(proxy)`, that took effect once the proxy's `counter` grew."""
    seen: list[int] = []

    def inject(proxy: TcpProxy) -> None:
        seen[:] = [proxy.counters()[counter]]
        arm(proxy)

    return Fault(name, inject, lambda proxy: proxy.counters()[counter] > seen[0])


DATABASE_FAULTS = (
    counted("connection cut mid-COPY", "cuts_within", lambda proxy: proxy.cut_within(b"COPY ")),
    counted("PREPARE answer withheld", "answers_withheld",
            lambda proxy: proxy.withhold_answer_after(b"PREPARE TRANSACTION")),
)


class FaultInjector(threading.Thread):
    """Injects `faults` in turn, a random pause apart, until stopped; counts those that took effect.

    With `progress` (a count that grows as the query moves on, such as its committed batches), a fault that took
    effect is followed by no other until the count grew. For faults that fail the task they hit: paced by the
    clock alone, they hit every attempt of a task once attempts take longer than the pauses (as on a loaded
    machine), and Spark gives the query up after its last attempt."""

    def __init__(self, proxy: TcpProxy, faults: tuple[Fault, ...], seed: int,
                 pause_s: tuple[float, float] = (0.3, 1.0), progress: Callable[[], int] | None = None,
                 on_effect: Callable[[str], None] | None = None):
        super().__init__(name="fault-injector", daemon=True)
        self.proxy, self.faults = proxy, faults
        self.on_effect = on_effect or (lambda _name: None)
        self.random = random.Random(seed)
        self.pause_s = pause_s
        self.progress = progress
        self.stop_requested = threading.Event()
        self.injected: Counter[str] = Counter()
        self.failure: BaseException | None = None

    def run(self) -> None:
        try:
            turn = 0
            while not self.stop_requested.wait(self.random.uniform(*self.pause_s)):
                fault = self.faults[turn % len(self.faults)]
                turn += 1
                fault.inject(self.proxy)
                # A fault aimed at an API takes effect at that API's next request, which an idle query may not send.
                deadline = time.monotonic() + 30
                while not fault.took_effect(self.proxy) and not self.stop_requested.is_set():
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.01)
                took_effect = fault.took_effect(self.proxy)
                if took_effect:
                    self.injected[fault.name] += 1
                    self.on_effect(fault.name)
                self.proxy.clear_faults()
                if took_effect and self.progress is not None:
                    reached = self.progress()
                    while self.progress() <= reached and not self.stop_requested.wait(0.05):
                        pass
        except BaseException as exc:  # reported by stop()
            self.failure = exc

    def stop(self) -> Counter[str]:
        """Stop injecting, withdraw faults not yet taken effect; returns the faults that took effect."""
        self.stop_requested.set()
        self.join(60)
        assert not self.is_alive(), "the fault injector did not stop"
        self.proxy.clear_faults()
        if self.failure is not None:
            raise AssertionError(f"the fault injector failed: {self.failure!r}") from self.failure
        return self.injected
