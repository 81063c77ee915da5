"""The invariant of `sparkeos.spark.two_phase_commit` (stated in its package docstring), tested in one place.

A small directory-based sink runs the protocol under a stand-in for Spark's micro-batch loop: tasks are retried
when they fail, a speculative copy of a task pre-commits beside it, Spark's commit log is written only after the
sink's commit returns, and a crash anywhere makes the loop start again from its first batch not in that log. A
crash is injected at every step the sink and its decision log take, one run per step; after each run every record
is published exactly once, nothing pre-committed is left pending, and no record was ever published twice, checked
at every step of the run.

The sink comes in two kinds: one with the five methods a sink must have, whose pending work and decisions the
framework keeps (its attempt journal and file decision log, whose every step is a crash point too), and one that
lists its pending work and keeps its decisions itself.
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest

from sparkeos.spark.two_phase_commit import (
    AttemptAborted,
    Decision,
    DecisionLog,
    Handle,
    PreCommitted,
    TaskAttempt,
    TwoPhaseCommitSink,
    abort_batch,
    commit_batch,
    write_task,
)
from sparkeos.spark.two_phase_commit.attempt_journal import STRAGGLER_GRACE_S
from support.spark import wait_for

BATCHES = 4
PARTITIONS = 3


class Crash(Exception):
    """The process running the step died."""


class Steps:
    """Counts the sink's steps; raises Crash at the step numbered `crash_at` and checks the published output at
    every step."""

    def __init__(self, root: Path, crash_at: int | None):
        self.root = root
        self.crash_at = crash_at
        self.count = 0
        self.names: list[str] = []

    def __call__(self, name: str) -> None:
        duplicated = [record for record, n in Counter(published(self.root)).items() if n > 1]
        assert not duplicated, f"published twice before step {self.count} ({name}): {duplicated[:5]}"
        self.names.append(name)
        self.count += 1
        if self.count == self.crash_at:
            raise Crash(name)


def published(root: Path) -> list[str]:
    return [record for path in sorted((root / "published").glob("*.json")) for record in json.loads(path.read_text())]


class DirectorySink(TwoPhaseCommitSink[dict]):
    """Pre-committed transactions are JSON files under pending/; a commit moves one to published/, under its
    handle id, so a second commit of the same task's rows would show as duplicated records. The five methods only:
    the framework journals its attempts and records its decisions under control/."""

    def __init__(self, root: Path, step: Steps):
        self.root = root
        self.step = step
        self.control_location = str(root / "control")
        (root / "pending").mkdir(parents=True, exist_ok=True)
        (root / "published").mkdir(exist_ok=True)

    def begin_transaction(self, task: TaskAttempt) -> dict:
        self.step("begin_transaction")
        return {"rows": []}

    def invoke(self, transaction: dict, rows) -> None:
        self.step("invoke")
        transaction["rows"].extend(rows.column(0).to_pylist())

    def pre_commit(self, transaction: dict, task: TaskAttempt) -> Handle:
        self.step("pre_commit")
        directory = self.root / "pending" / task.query
        directory.mkdir(exist_ok=True)
        (directory / f"{task.handle_id}.json").write_text(json.dumps(transaction["rows"]))
        return Handle(task.handle_id, task.batch, task.partition, len(transaction["rows"]))

    def commit(self, handle: Handle) -> None:
        self.step("commit")
        staged = next((self.root / "pending").glob(f"*/{handle.id}.json"), None)
        final = self.root / "published" / f"{handle.id}.json"
        if staged is None:
            assert final.exists(), f"handle {handle.id} is neither pending nor published"
            return
        staged.rename(final)

    def abort(self, query: str, handle_id: str) -> None:
        self.step("abort")
        (self.root / "pending" / query / f"{handle_id}.json").unlink(missing_ok=True)

    # Not a sink's own methods: the framework's journal and decision log, wrapped so that each of their steps is
    # counted and can crash.
    def attempt_journal(self, query: str):
        journal = super().attempt_journal(query)
        return None if journal is None else Counted(journal, self.step, JOURNAL_STEPS)

    def decision_log(self, query: str) -> DecisionLog:
        return Counted(super().decision_log(query), self.step, DECISION_LOG_STEPS)


class ListingDirectorySink(DirectorySink):
    """Lists its own pending work and keeps its own decision log, so the framework journals nothing."""

    def pending(self, query: str) -> list[tuple[str, int]]:
        self.step("pending")
        return [(p.stem, int(p.stem.split("-")[0])) for p in (self.root / "pending" / query).glob("*.json")]

    def decision_log(self, query: str) -> DecisionLog:
        return DirectoryDecisionLog(self.root / "decisions" / query, self.step)


JOURNAL_STEPS = {"begin": "journal_begin", "holds": "journal_holds", "mark_aborted": "journal_mark",
                 "end": "journal_end", "attempts": "journal_list"}
DECISION_LOG_STEPS = {"read": "read_decision", "read_settled": "read_decision", "record": "record_decision",
                      "latest": "latest", "unfinished": "unfinished", "finish": "finish",
                      "forget_before": "forget_before"}


class Counted:
    """The framework's object, each of whose methods named in ``steps`` is first counted as that step."""

    def __init__(self, inner, step: Steps, steps: dict[str, str]):
        self.inner, self.step, self.steps = inner, step, steps

    def __getattr__(self, name: str):
        attribute = getattr(self.inner, name)
        if name not in self.steps:
            return attribute

        def counted(*args, **kwargs):
            self.step(self.steps[name])
            return attribute(*args, **kwargs)

        return counted


class DirectoryDecisionLog(DecisionLog):
    def __init__(self, directory: Path, step: Steps):
        self.directory = directory
        self.step = step
        directory.mkdir(parents=True, exist_ok=True)

    def read(self, batch: int) -> Decision | None:
        self.step("read_decision")
        path = self.directory / f"{batch}.decision"
        return Decision.from_bytes(path.read_bytes()) if path.exists() else None

    def record(self, decision: Decision) -> Decision:
        self.step("record_decision")
        temporary = self.directory / f"{decision.batch}.tmp"
        temporary.write_bytes(decision.to_bytes())
        try:
            (self.directory / f"{decision.batch}.decision").hardlink_to(temporary)
        except FileExistsError:
            return Decision.from_bytes((self.directory / f"{decision.batch}.decision").read_bytes())
        finally:
            temporary.unlink()
        return decision

    def latest(self) -> int | None:
        self.step("latest")
        return max((int(p.stem) for p in self.directory.glob("*.decision")), default=None)

    def unfinished(self) -> list[Decision]:
        self.step("unfinished")
        batches = sorted(int(p.stem) for p in self.directory.glob("*.decision"))
        return [Decision.from_bytes((self.directory / f"{b}.decision").read_bytes()) for b in batches
                if not (self.directory / f"{b}.finished").exists()]

    def finish(self, batch: int) -> None:
        self.step("finish")
        (self.directory / f"{batch}.finished").touch()

    def forget_before(self, batch: int) -> None:
        self.step("forget_before")
        for path in self.directory.glob("*.finished"):
            if int(path.stem) < batch:
                (self.directory / f"{path.stem}.decision").unlink()
                path.unlink()


def rows_of(batch: int, partition: int):
    import pyarrow as pa

    return pa.RecordBatch.from_pydict({"v": [f"{batch}/{partition}/{i}" for i in range(batch + partition)]})


def expected() -> Counter:
    return Counter(f"{b}/{p}/{i}" for b in range(BATCHES) for p in range(PARTITIONS) for i in range(b + p))


def run_task(sink: DirectorySink, query: str, batch: int, partition: int) -> PreCommitted:
    """A task as Spark runs it: retried after a failure (a crashed executor), up to four attempts."""
    for attempt in range(4):
        task = TaskAttempt(query, batch, partition, uuid.uuid4().hex[:8])
        try:
            return write_task(sink, task, iter([rows_of(batch, partition)]))
        except Crash:
            if attempt == 3:
                raise
    raise AssertionError("unreachable")


def run_query(kind: type[DirectorySink], root: Path, crash_at: int | None, abort_on_crash: bool = False) -> Steps:
    """Micro-batches 0..BATCHES-1 as Spark runs them, restarted from its commit log after a driver crash. With
    `abort_on_crash` the crash is an error Spark sees (as an armed failpoint raises): Spark aborts the batch
    first."""
    query = "q-1"
    spark_commit_log: set[int] = set()
    step = Steps(root, crash_at)
    for _restart in range(BATCHES + 2):
        sink = kind(root, step)
        try:
            for batch in range(BATCHES):
                if batch in spark_commit_log:
                    continue
                messages = [run_task(sink, query, batch, p) for p in range(PARTITIONS)]
                # A speculative copy of partition 0 that finished second: Spark drops its message.
                write_task(sink, TaskAttempt(query, batch, 0, "spec"), iter([rows_of(batch, 0)]))
                handles = [m.handle for m in messages if m.handle is not None]
                try:
                    commit_batch(sink, query, batch, handles)
                except Crash:
                    if abort_on_crash:
                        abort_batch(sink, query, batch, handles)
                    raise
                spark_commit_log.add(batch)
            return step
        except Crash:
            continue
    raise AssertionError("the query did not finish")


def decisions_dir(root: Path) -> Path:
    own = root / "decisions" / "q-1"
    return own if own.exists() else root / "control" / "q-1" / "decisions"


def journal(root: Path) -> list[str]:
    """The journal's entries, live or marked aborted."""
    return sorted(path.name for path in (root / "control" / "q-1" / "attempts").glob("*"))


def live_attempts(root: Path) -> list[str]:
    """The entries not marked aborted: attempts entered and neither committed nor aborted."""
    return sorted(path.name for path in (root / "control" / "q-1" / "attempts").glob("*")
                  if path.stat().st_size == 0)


def assert_exact(root: Path) -> None:
    assert Counter(published(root)) == expected()
    assert list((root / "pending" / "q-1").glob("*.json")) == [], "pre-committed transactions left pending"
    unfinished = [p for p in decisions_dir(root).glob("*.decision") if not p.with_suffix(".finished").exists()]
    assert unfinished == []
    assert live_attempts(root) == [], "attempts left in the journal, neither committed nor aborted"


KINDS = pytest.mark.parametrize("kind", [DirectorySink, ListingDirectorySink], ids=["five-methods", "own-listing"])
# Where each kind can crash: its own steps, and the steps of what the framework keeps for it.
CRASH_STEPS = {
    DirectorySink: {"begin_transaction", "invoke", "pre_commit", "read_decision", "record_decision", "commit",
                    "finish", "abort", "unfinished", "journal_begin", "journal_holds", "journal_mark",
                    "journal_end", "journal_list"},
    ListingDirectorySink: {"begin_transaction", "invoke", "pre_commit", "read_decision", "record_decision", "commit",
                           "finish", "abort", "pending", "unfinished"},
}


@KINDS
def test_a_run_without_crashes_publishes_every_record_once(tmp_path: Path, kind: type[DirectorySink]) -> None:
    step = run_query(kind, tmp_path, crash_at=None)
    assert_exact(tmp_path)
    assert {"begin_transaction", "pre_commit", "record_decision", "commit", "finish", "abort"} <= set(step.names)
    # Only the five-method sink's attempts are journaled, and every one was ended.
    assert ("journal_begin" in step.names) == (kind is DirectorySink)


@KINDS
@pytest.mark.parametrize("abort_on_crash", [False, True], ids=["killed", "failed-and-aborted"])
def test_a_crash_at_any_step_leaves_every_record_published_exactly_once(
        tmp_path: Path, kind: type[DirectorySink], abort_on_crash: bool) -> None:
    total = run_query(kind, tmp_path / "clean", crash_at=None).count
    crashed_at = Counter()
    for crash_at in range(1, total + 1):
        root = tmp_path / f"crash-{crash_at}"
        step = run_query(kind, root, crash_at, abort_on_crash)
        crashed_at[step.names[crash_at - 1]] += 1
        assert_exact(root)
    assert set(crashed_at) >= CRASH_STEPS[kind]


@KINDS
def test_a_batch_decided_before_a_crash_is_finished_with_its_own_handles_not_the_replays(
        tmp_path: Path, kind: type[DirectorySink]) -> None:
    step = Steps(tmp_path, None)
    sink = kind(tmp_path, step)
    first = [run_task(sink, "q-1", 0, p).handle for p in range(PARTITIONS)]
    sink.decision_log("q-1").record(Decision("q-1", 0, tuple(h for h in first if h)))  # then the driver died
    replay = [run_task(sink, "q-1", 0, p).handle for p in range(PARTITIONS)]
    decision = commit_batch(sink, "q-1", 0, [h for h in replay if h])
    assert {h.id for h in decision.handles} == {h.id for h in first if h}
    assert sorted(p.stem for p in (tmp_path / "published").glob("*.json")) == sorted(h.id for h in first if h)
    assert list((tmp_path / "pending" / "q-1").glob("*.json")) == []
    assert journal(tmp_path) == []


@KINDS
def test_abort_keeps_the_handles_a_decision_names(tmp_path: Path, kind: type[DirectorySink]) -> None:
    sink = kind(tmp_path, Steps(tmp_path, None))
    handles = [run_task(sink, "q-1", 0, p).handle for p in range(PARTITIONS)]
    handles = [h for h in handles if h]
    sink.decision_log("q-1").record(Decision("q-1", 0, tuple(handles)))
    assert abort_batch(sink, "q-1", 0, handles) == 0
    assert len(list((tmp_path / "pending" / "q-1").glob("*.json"))) == len(handles)
    commit_batch(sink, "q-1", 1, [])
    assert len(published(tmp_path)) == sum(h.records for h in handles)


@KINDS
@pytest.mark.parametrize("failing", ["begin_transaction", "invoke", "pre_commit"])
def test_a_task_that_fails_before_its_pre_commit_leaves_nothing(tmp_path: Path, kind: type[DirectorySink],
                                                               failing: str) -> None:
    class FailingSink(kind):
        def abort_transaction(self, transaction: dict) -> None:
            transaction["aborted"] = True

    step = Steps(tmp_path, None)
    sink = FailingSink(tmp_path, step)
    original = getattr(sink, failing)

    def fail(*args):
        original(*args)
        raise RuntimeError(f"{failing} failed")

    setattr(sink, failing, fail)
    with pytest.raises(RuntimeError, match=f"{failing} failed"):
        write_task(sink, TaskAttempt("q-1", 0, 0, "a"), iter([rows_of(0, 1)]))
    assert not list((tmp_path / "published").glob("*"))


def test_an_attempt_that_failed_after_writing_its_store_is_aborted_by_the_next_commit(tmp_path: Path) -> None:
    """A task whose executor died after its pre-commit wrote the store, before its message reached the driver: no
    message names it, and a five-method sink cannot list its store. The journal entry written before its
    transaction began is what the next commit aborts it by."""
    class DyingSink(DirectorySink):
        def pre_commit(self, transaction: dict, task: TaskAttempt) -> Handle:
            super().pre_commit(transaction, task)
            raise Crash("the executor died")

    with pytest.raises(Crash):
        write_task(DyingSink(tmp_path, Steps(tmp_path, None)), TaskAttempt("q-1", 0, 0, "lost"), iter([rows_of(0, 1)]))
    assert [p.name for p in (tmp_path / "pending" / "q-1").glob("*.json")] == ["0-0-lost.json"]
    assert live_attempts(tmp_path) == ["0-0-lost"]
    commit_batch(DirectorySink(tmp_path, Steps(tmp_path, None)), "q-1", 0, [])
    assert list((tmp_path / "pending" / "q-1").glob("*.json")) == []
    assert live_attempts(tmp_path) == []


def test_an_attempt_aborted_while_it_ran_discards_what_it_pre_committed(tmp_path: Path) -> None:
    """A straggling attempt (a speculative copy Spark has not killed yet) whose batch was decided and whose journal
    entry the driver's commit aborted while it still wrote: it pre-commits after the abort, finds its entry gone,
    and discards its own transaction instead of leaving it to nobody."""
    sink = DirectorySink(tmp_path, Steps(tmp_path, None))
    decided = run_task(sink, "q-1", 0, 1).handle

    def rows_while_the_driver_commits():
        yield rows_of(0, 1)
        commit_batch(sink, "q-1", 0, [decided])  # sees the straggler's entry: no decision names it

    with pytest.raises(AttemptAborted, match="0-1-straggler"):
        write_task(sink, TaskAttempt("q-1", 0, 1, "straggler"), rows_while_the_driver_commits())
    assert list((tmp_path / "pending" / "q-1").glob("*.json")) == []
    assert live_attempts(tmp_path) == []
    assert Counter(published(tmp_path)) == Counter(rows_of(0, 1).column(0).to_pylist())


def test_a_five_method_sink_without_a_control_location_is_refused_naming_it(tmp_path: Path) -> None:
    sink = DirectorySink(tmp_path, Steps(tmp_path, None))
    sink.control_location = None
    with pytest.raises(ValueError, match="control_location"):
        write_task(sink, TaskAttempt("q-1", 0, 0, "a"), iter([rows_of(0, 1)]))
    assert list((tmp_path / "pending").glob("*/*.json")) == [], "it began a transaction it could not journal"


class StragglerDuringAbort(DirectorySink):
    """The driver's abort of one attempt lets that attempt, still running, go on at the worst moment: after the
    abort looked for its transaction and before the abort's caller goes on."""

    straggler_id = ""
    during_abort = None

    def abort(self, query: str, handle_id: str) -> None:
        super().abort(query, handle_id)
        if handle_id == self.straggler_id and self.during_abort is not None:
            during, self.during_abort = self.during_abort, None
            during()


def test_a_straggler_that_pre_commits_while_the_driver_aborts_it_aborts_itself(tmp_path: Path) -> None:
    """Step 7 of its batch aborts a straggler (a speculative copy not killed yet) whose transaction is not there yet;
    the straggler then pre-commits. Ended right after the abort, its journal entry was gone before the straggler
    could see it, and what it pre-committed stayed for good, listed nowhere."""
    sink = StragglerDuringAbort(tmp_path, Steps(tmp_path, None))
    decided = run_task(sink, "q-1", 0, 1).handle
    straggler = TaskAttempt("q-1", 0, 1, "straggler")
    sink.straggler_id = straggler.handle_id
    go, outcome = threading.Event(), {}

    def rows():
        yield rows_of(0, 1)
        go.wait(30)

    def run() -> None:
        try:
            outcome["message"] = write_task(sink, straggler, rows())
        except AttemptAborted as aborted:
            outcome["aborted"] = aborted

    thread = threading.Thread(target=run)
    thread.start()
    wait_for(lambda: straggler.handle_id in journal(tmp_path), timeout_s=30, what="the straggler's entry")

    def straggler_goes_on() -> None:
        go.set()
        thread.join(30)

    sink.during_abort = straggler_goes_on
    commit_batch(sink, "q-1", 0, [decided])
    thread.join(30)
    assert "aborted" in outcome, f"the straggler went on as if nothing had happened: {outcome}"
    assert list((tmp_path / "pending" / "q-1").glob("*.json")) == []
    assert live_attempts(tmp_path) == []


def test_a_straggler_killed_after_it_pre_committed_behind_the_abort_is_aborted_by_the_next_commit(
        tmp_path: Path) -> None:
    """The same straggler, killed after its pre-commit and before it could look at its entry: the entry stays
    marked aborted, so the next commit aborts again what the straggler left; once the mark is older than the time a
    straggler may still run, a commit removes it."""
    sink = StragglerDuringAbort(tmp_path, Steps(tmp_path, None))
    decided = run_task(sink, "q-1", 0, 1).handle
    straggler = TaskAttempt("q-1", 0, 1, "killed")
    sink.straggler_id = straggler.handle_id
    transaction = {"rows": rows_of(0, 1).column(0).to_pylist()}
    sink.attempt_journal("q-1").begin(straggler)
    sink.during_abort = lambda: sink.pre_commit(transaction, straggler)  # then killed
    commit_batch(sink, "q-1", 0, [decided])
    assert [p.stem for p in (tmp_path / "pending" / "q-1").glob("*.json")] == [straggler.handle_id]
    assert journal(tmp_path) == [straggler.handle_id] and live_attempts(tmp_path) == []

    commit_batch(sink, "q-1", 1, [])
    assert list((tmp_path / "pending" / "q-1").glob("*.json")) == []
    assert journal(tmp_path) == [straggler.handle_id], "the mark went before a straggler could no longer run"
    marked = tmp_path / "control" / "q-1" / "attempts" / straggler.handle_id
    old = time.time() - STRAGGLER_GRACE_S - 1
    os.utime(marked, (old, old))
    commit_batch(sink, "q-1", 2, [])
    assert journal(tmp_path) == []
    assert Counter(published(tmp_path)) == Counter(rows_of(0, 1).column(0).to_pylist())
