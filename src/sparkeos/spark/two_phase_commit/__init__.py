"""Two-phase commit for Spark sinks: Flink's ``TwoPhaseCommitSinkFunction`` on Spark's Python Data Source API.

A sink implements :class:`TwoPhaseCommitSink` (``sink.py``): Flink's five methods, how a transaction is begun,
written, pre-committed, committed and aborted. The framework keeps the rest in a directory of the sink's
(``control_location``): an :class:`AttemptJournal` of the tasks' attempts, which lists what the store may hold
pre-committed, and a :class:`FileDecisionLog`. A sink whose store lists its own pre-committed work, or has a better
place for decisions, overrides ``pending`` or ``decision_log`` (``sparkeos.files`` and ``sparkeos.postgres`` do
both). :class:`TwoPhaseCommitDataSource` makes a sink a Spark data source whose writers (``writers.py``) run the
protocol below (``protocol.py``).

Invariant
---------
For every micro-batch B of a query Q, the transactions that become visible are exactly those named by one
decision "Q's batch B commits handles H", which is made durable before any of them is committed and never
changes afterwards. Every other transaction pre-committed for B (failed, retried and speculative task attempts,
and every attempt of a replay of B that Spark runs after B was decided) is aborted, never committed.

Protocol
--------
Tasks, once per attempt of (B, partition p), on an executor:

1. ``begin_transaction``: open a transaction private to this attempt (a staged file, a database transaction),
   named by the attempt's handle id. Where the framework keeps the sink's journal, the attempt is entered in it
   first, so that no transaction exists that ``pending`` cannot list.
2. ``invoke``: write the task's rows into it.
3. ``pre_commit``: make it durable but invisible, and return its :class:`Handle`, which reaches the driver in the
   task's commit message. An error in 1-3 aborts the attempt's transaction and fails the task; Spark retries it.
   A journaled attempt that the driver marked aborted meanwhile (step 7 of its batch ran without it) aborts what it
   pre-committed and fails.

The driver, in ``commit(messages, B)`` once every task of B succeeded:

0. Refuse to go on if the log holds a decision of a batch above B: Spark runs B only after it logged B - 1
   committed, which it does only after this commit returned, so such a decision was made in a run whose checkpoint
   went further than this one's (restored, or copied while the query went on), and Spark has planned B anew.
4. Recover: finish every decision of Q that is not finished (a crash between steps 5 and 7 left it so).
5. Decide: if B already has a decision (Spark replays a batch it had not logged as committed when the driver
   died, after the sink had decided it), keep it; else record "B commits H", H the handles of ``messages``,
   unless another driver of Q recorded a decision of B first, which then holds.
6. Commit every handle of the decision, and end its journal entry. A commit is idempotent: after a crash it is
   repeated, and finds done what was done.
7. Mark the decision finished, then abort every transaction of Q the sink still holds for a batch <= B that no
   unfinished decision names (failed attempts, the replay's own handles, attempts of a driver that died), and
   forget decisions older than ``RETAINED_DECISIONS`` batches. A journaled attempt that may still run is marked
   aborted before its abort, and aborted again by later commits until it cannot run any more.

``abort(messages, B)``, which Spark calls when a task or the driver's commit failed, aborts the handles of
``messages`` unless a decision names them: a commit that failed after step 5 must leave its handles for step 4.

Why this is exactly once: only a decision publishes, a batch is decided once, and its handles are committed
until done (steps 4-6), whichever driver gets there; Spark re-runs B from its checkpointed input until B is in
its commit log, which Spark writes only after ``commit(messages, B)`` returned, so step 7 has happened by then.
What it needs from a sink: pre-committed work that survives the task and the driver (a file, a prepared database
transaction), named by its attempt's handle id; a commit and an abort that can be repeated, the abort finding by that
id whatever the attempt left; and a decision log whose ``record`` is atomic and never replaces a decision.

Batch writes (``df.write``) run the same protocol with Q ``write-<id>``, the id the option ``writeId`` names or
one drawn once per write, and B = 0. A write has no later batch to finish a decision it failed after, nor to abort
what a task Spark cancelled pre-commits after the driver listed: its ``abort`` records a decision without handles
unless one holds, then runs steps 4-7; and each task of a write, after step 3, reads its batch's decision and
aborts what it pre-committed if a decision exists without its handle (the driver records before it lists, the task
reads after it pre-commits, so one of the two sees the other). A failed write is thus never left half published,
nor holding pre-committed work. Run again under the same ``writeId``, a write whose decision published writes
nothing more; one whose earlier runs failed writes the batch after theirs (B = their last + 1).
"""


from .attempt_journal import AttemptJournal
from .datasource import TwoPhaseCommitDataSource
from .decision_log import DecisionLog
from .file_decision_log import FileDecisionLog
from .handles import Decision, Handle, TaskAttempt, parse_handle_id
from .protocol import (
    RETAINED_DECISIONS,
    AttemptAborted,
    CheckpointBehindSink,
    PreCommitted,
    abort_batch,
    checkpoint_behind,
    commit_batch,
    discard,
    task_attempt,
    write_task,
)
from .sink import Transaction, TwoPhaseCommitSink
from .writers import TwoPhaseCommitBatchWriter, TwoPhaseCommitStreamWriter, refuse_complete_mode

__all__ = [
    "RETAINED_DECISIONS", "AttemptAborted", "AttemptJournal", "CheckpointBehindSink", "Decision", "DecisionLog",
    "FileDecisionLog", "Handle", "PreCommitted", "TaskAttempt", "Transaction", "TwoPhaseCommitBatchWriter",
    "TwoPhaseCommitDataSource", "TwoPhaseCommitSink", "TwoPhaseCommitStreamWriter", "abort_batch",
    "checkpoint_behind", "commit_batch", "discard", "parse_handle_id", "refuse_complete_mode", "task_attempt",
    "write_task",
]
