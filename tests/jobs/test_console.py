"""`sparkeos run`'s console: the live table on a terminal and the plain lines elsewhere show the same figures."""

from __future__ import annotations

import io

from sparkeos.jobs.console import LATENCY_WINDOW_S, RunConsole, Snapshot
from sparkeos.spark.visible_latency import BUCKETS, LatencyHistogram


def figures(records_in: int, state: str = "running", latency: LatencyHistogram | None = None) -> Snapshot:
    return Snapshot(state=state, records_in=records_in, delivered=1234, dead_lettered=5, lag=42, batches=7,
                    restarts=1, last_batch_age_s=3.0, visible_latency=latency or LatencyHistogram())


def latencies(**by_bound: int) -> LatencyHistogram:
    """Records visible since the start: `by_bound` records in the bucket of each named bound, e.g. b2=10."""
    counts = [0] * (len(BUCKETS) + 1)
    for name, count in by_bound.items():
        counts[BUCKETS.index(float(name[1:].replace("_", ".")))] = count
    return LatencyHistogram(counts, 0.0)


def test_plain_lines_come_at_a_change_of_state_and_every_interval_with_a_rate():
    stream = io.StringIO()
    console = RunConsole("orders", stream, interactive=False)
    console.show(figures(1000), now=0.0)
    console.show(figures(3000), now=2.0)  # same state, within the interval: no line
    console.show(figures(5000, "restarting"), now=4.0)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2, lines
    assert "orders: running; 1,000 records in (0/s), lag 42, 1,234 delivered, 5 dead-lettered, 7 batches" in lines[0]
    assert "orders: restarting; 5,000 records in (1,000/s)" in lines[1]
    console.show(figures(25000, "restarting"), now=15.0)
    assert len(stream.getvalue().splitlines()) == 3


def test_the_live_table_shows_the_figures_and_its_last_state_stays():
    stream = io.StringIO()
    console = RunConsole("orders", stream, interactive=True, width=160)
    console.show(figures(1000), now=0.0)
    console.close(figures(2000, "stopped"))
    text = stream.getvalue()
    for figure in ("stopped", "2,000", "1,234", "42", "3 s ago", "visible p99"):
        assert figure in text, text


def test_the_visible_latency_p99_is_of_the_records_committed_in_the_last_window():
    stream = io.StringIO()
    console = RunConsole("orders", stream, interactive=False)
    console.show(figures(0), now=0.0)
    assert "visible p99 - " in stream.getvalue()  # nothing committed yet
    # Slow records (2-3 s) in the first minute, then only fast ones (0.3-0.4 s).
    console.show(figures(1000, latency=latencies(b3=1000)), now=30.0)
    console.show(figures(2000, "restarting", latency=latencies(b3=1000, b0_4=1000)), now=40.0)
    console.show(figures(3000, "running", latency=latencies(b3=1000, b0_4=2000)), now=30.0 + LATENCY_WINDOW_S + 1)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 4, lines
    assert "visible p99 2.99 s (last 60 s)" in lines[1]
    assert "visible p99 2.98 s" in lines[2]  # the slow records are still within the window
    assert "visible p99 0.40 s" in lines[3]  # only what became visible since second 30
