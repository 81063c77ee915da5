"""`sparkeos run`'s console: the live table on a terminal and the plain lines elsewhere show the same figures."""

from __future__ import annotations

import io

from sparkeos.jobs.console import RunConsole, Snapshot


def figures(records_in: int, state: str = "running") -> Snapshot:
    return Snapshot(state=state, records_in=records_in, delivered=1234, dead_lettered=5, lag=42, batches=7,
                    restarts=1, last_batch_age_s=3.0)


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
    for figure in ("stopped", "2,000", "1,234", "42", "3 s ago"):
        assert figure in text, text
