"""What a two-phase-commit sink holds that is neither published nor discarded, and an operator's abort of one query's
part of it: ``sparkeos sinks pending`` and ``sparkeos sinks abort``, as Kafka has ``kafka-transactions.sh``.

The ``sparkeos.kafka`` sink holds no decisions: its tasks commit their own transactions, and what it leaves is open
transactions, listed and aborted by transactional id (``kafka/sink/lingering.py``).

A running query cleans up after itself: each batch's commit aborts every transaction of the query that no
decision names (failed, retried and speculative attempts, what a crashed driver left), and its next run finishes
what was decided. What is left for good belongs to queries that will not run again: a query abandoned after a
failure, one restarted with a new checkpoint (a new query id), the last attempts of a query that stopped. Their
pre-committed transactions hold locks, prepared-transaction slots and VACUUM's horizon (PostgreSQL) or storage
(staged files).

Aborting a query's work never touches a transaction that an unfinished decision names: the decision is final, and
the query's next run commits it. Where the sink can fence the query (PostgreSQL), it does so first, so that a run
still writing cannot decide on what is being aborted; where it cannot (files), only work older than a bound is
aborted, and the query must not be running.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from .two_phase_commit import TwoPhaseCommitSink, discard

DECISION = "decision"  # recorded, and not all of its transactions committed yet
TRANSACTION = "transaction"  # pre-committed by a task (or abandoned), named by a decision or by none


@dataclass(frozen=True)
class PendingWork:
    query: str
    batch: int
    kind: str
    name: str  # how the store shows it: a prepared transaction's gid, a staging directory, a decision
    since: datetime | None
    decided: bool  # an unfinished decision names it: the query's next run commits it, and nothing may abort it
    records: int | None = None  # a decision's records
    handle_id: str | None = None  # a transaction's, as the sink's ``abort`` takes it
    note: str | None = None  # its state in words, where the kind does not say it

    def age_s(self, now: datetime) -> float | None:
        return None if self.since is None else max((now - self.since).total_seconds(), 0.0)

    def to_json(self, now: datetime) -> dict[str, Any]:
        return {"query": self.query, "batch": self.batch, "kind": self.kind, "name": self.name,
                "since": self.since.isoformat() if self.since else None, "age_s": self.age_s(now),
                "decided": self.decided, "records": self.records, "note": self.note}


def list_pending(sink: TwoPhaseCommitSink, query: str | None = None) -> list[PendingWork]:
    """Every unfinished decision and pre-committed transaction the sink holds, of ``query`` or of every query."""
    work: list[PendingWork] = []
    for name in sorted(set(sink.queries())) if query is None else [query]:
        log = sink.decision_log(name)
        decisions = log.unfinished()
        named = {h.id for d in decisions for h in d.handles}
        for decision in decisions:
            work.append(PendingWork(name, decision.batch, DECISION, f"decision of batch {decision.batch}",
                                    log.recorded_at(decision.batch), True,
                                    sum(h.records for h in decision.handles)))
        pending = list(sink.pending(name))
        details = sink.pending_details(name, [handle_id for handle_id, _batch in pending])
        for handle_id, batch in pending:
            shown, since = details.get(handle_id, (handle_id, None))
            work.append(PendingWork(name, batch, TRANSACTION, shown, since, handle_id in named, None, handle_id))
    return sorted(work, key=lambda w: (w.query, w.batch, w.kind != DECISION, w.name))


@dataclass
class AbortOutcome:
    query: str
    fenced: bool  # the sink stopped the query's runs from deciding before anything was aborted
    aborted: list[PendingWork] = field(default_factory=list)
    decided: list[PendingWork] = field(default_factory=list)  # kept: a decision names them
    too_young: list[PendingWork] = field(default_factory=list)  # kept: younger than the bound
    fence_note: str | None = None  # what fencing did, where it is not a decision that was fenced


class SinkOperator(Protocol):
    """What ``sparkeos sinks`` does with one sink's target: each sink's data source gives one (``operator``)."""

    def list_pending(self, query: str | None = None) -> list[PendingWork]: ...

    def abort_query(self, query: str, older_than_s: float) -> AbortOutcome: ...


class TwoPhaseCommitOperator:
    """``sparkeos sinks`` for a two-phase-commit sink."""

    def __init__(self, sink: TwoPhaseCommitSink):
        self.sink = sink

    def list_pending(self, query: str | None = None) -> list[PendingWork]:
        return list_pending(self.sink, query)

    def abort_query(self, query: str, older_than_s: float) -> AbortOutcome:
        return abort_query(self.sink, query, older_than_s)


def abort_query(sink: TwoPhaseCommitSink, query: str, older_than_s: float,
                now: datetime | None = None) -> AbortOutcome:
    """Abort the pre-committed transactions of ``query`` that no decision names and that are older than
    ``older_than_s`` (those of unknown age count as old), after fencing the query where the sink can."""
    queries = sorted(set(sink.queries()))
    if query not in queries:
        raise ValueError(f"{sink.describe()} holds nothing pending of query {query!r}; queries with pending work: "
                         f"{', '.join(queries) or 'none'}")
    outcome = AbortOutcome(query, sink.fence(query))
    # Listed after the fence: a decision recorded before it is seen here, and none can be recorded after it.
    now = now or datetime.now(UTC)
    for work in list_pending(sink, query):
        if work.kind != TRANSACTION:
            continue
        age = work.age_s(now)
        if work.decided:
            outcome.decided.append(work)
        elif age is not None and age < older_than_s:
            outcome.too_young.append(work)
        else:
            discard(sink, query, work.handle_id or work.name)
            outcome.aborted.append(work)
    return outcome


def sink_operator(format_name: str, options: dict[str, str]) -> SinkOperator:
    """``sparkeos sinks`` for the sink of format ``format_name`` at the target its ``options`` name (as
    ``writeStream.option`` takes them)."""
    from . import sink_data_source

    return sink_data_source(format_name).operator(options)


def _age(work: PendingWork, now: datetime) -> str:
    age = work.age_s(now)
    if age is None:
        return "?"
    for unit, seconds in (("d", 86400), ("h", 3600), ("m", 60)):
        if age >= seconds:
            return f"{age / seconds:.1f}{unit}"
    return f"{age:.0f}s"


def pending_lines(work: list[PendingWork], now: datetime) -> list[str]:
    """A table: one line per decision and transaction, with its age and whether a decision names it."""
    if not work:
        return ["nothing pending"]
    rows = [("QUERY", "BATCH", "KIND", "AGE", "STATE", "NAME")]
    for item in work:
        if item.note is not None:
            state = item.note
        elif item.kind == DECISION:
            state = f"decided, {item.records} records: the query's next run commits it"
        elif item.decided:
            state = "decided: the query's next run commits it"
        else:
            state = "undecided: the query's next batch aborts it, or sparkeos sinks abort"
        rows.append((item.query, str(item.batch), item.kind, _age(item, now), state, item.name))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    return ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=False)) + "  " + row[-1]
            for row in rows]


def abort_lines(outcome: AbortOutcome, older_than_s: float) -> list[str]:
    if outcome.fence_note:
        fenced = outcome.fence_note
    elif outcome.fenced:
        fenced = "fenced: a run still writing can no longer decide"
    else:
        fenced = "not fenced (the sink cannot): the query must not be running"
    lines = [f"query {outcome.query}: {fenced}"]
    kinds = {work.kind for work in outcome.aborted} or {TRANSACTION}
    what = "undecided transactions" if kinds == {TRANSACTION} else "open transactions of transactional ids"
    lines.append(f"aborted {len(outcome.aborted)} {what}")
    lines += [f"  {w.name} (batch {w.batch})" for w in outcome.aborted]
    if outcome.decided:
        lines.append(f"kept {len(outcome.decided)} transactions an unfinished decision names: run the query again to "
                     "commit them")
        lines += [f"  {w.name} (batch {w.batch})" for w in outcome.decided]
    if outcome.too_young:
        lines.append(f"kept {len(outcome.too_young)} transactions younger than --older-than ({older_than_s:g} s)")
        lines += [f"  {w.name} (batch {w.batch})" for w in outcome.too_young]
    return lines
