"""Two drivers of one query deciding one batch at the same moment: the check every decision log must pass."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from sparkeos.spark.two_phase_commit import Decision, DecisionLog, Handle


def assert_drivers_agree(logs: list[Callable[[], DecisionLog]], batches: int = 3) -> None:
    """Each of ``logs`` (one per driver) records its own decision of each batch at once: every one must get back the
    same decision, one of those recorded, and a later read must find it."""
    for batch in range(batches):
        decisions = [Decision("q", batch, (Handle(f"{batch}-0-{n}", batch, 0, 10),)) for n in range(len(logs))]
        with ThreadPoolExecutor(len(logs)) as pool:
            held = list(pool.map(lambda pair: pair[0]().record(pair[1]), zip(logs, decisions, strict=True)))
        assert held[0] in decisions and held == [held[0]] * len(logs)
        assert logs[0]().read(batch) == held[0]
