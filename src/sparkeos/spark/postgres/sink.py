"""The `sparkeos.postgres` sink: each task's rows in one PostgreSQL transaction, prepared, then committed by the
driver's decision (PostgreSQL's ``PREPARE TRANSACTION`` / ``COMMIT PREPARED``).

A task of query Q, batch B, partition p opens a transaction, writes its rows with ``COPY ... (FORMAT BINARY)``
(or ``INSERT ... ON CONFLICT (upsertKeys) DO UPDATE`` for upserts) and prepares it under the global id
``sparkeos-<Q>-<B>-<p>-<attempt>-<run>``: durable, invisible, surviving the task, the driver and a restart of the
server. The driver's commit runs ``COMMIT PREPARED`` on the ids its decision names; ``pending`` lists Q's
prepared transactions in ``pg_prepared_xacts``; decisions are rows of ``sparkeos_decisions``, a table of ours
beside the target table (one INSERT records a decision, so it is whole or absent). The protocol (decisions,
recovery) is `sparkeos.spark.two_phase_commit`'s.

Each prepared transaction also inserts its gid into ``sparkeos_commits``, so that its outcome can be told apart
once it is gone from ``pg_prepared_xacts``: a ``COMMIT PREPARED`` answered "does not exist" is a repeated commit
if the row is there, and a decided transaction that something else rolled back (a DBA, another driver of the
query) if it is not, which fails the query rather than logging the batch as committed without its rows.

Runs are fenced, as Kafka fences producers by epoch. A run (``<run>``) is the writer Spark builds for the tasks
of one micro-batch (it builds one per batch), or of one batch write; the first task of a run claims the next epoch
of the query in ``sparkeos_fences`` (one row per query: the newest run) and ``sparkeos_runs`` (each run's epoch).
Two drivers of one query can be alive at once (a YARN or Kubernetes driver retried while the first one still runs,
a checkpoint copied to a second cluster); then only the newest run decides and writes:

- a decision is recorded only while its run is the newest, checked under a share lock of the query's fence row
  that a claim takes exclusively: either the decision is recorded before a newer run claims (and that run's tasks
  then see it), or it is refused (``RunFenced``) and its run's query fails;
- a task of a run older than the newest fails (``RunFenced``) before it touches anything.

A prepared transaction keeps its row locks until it is resolved, so two things are done by each task before
it writes, or a task could wait forever for a transaction that only the driver resolves, after that task:

- a task of a batch that is already decided (Spark replays it after the driver died past the decision) writes
  nothing: the decision is final, and whatever the replay wrote would be aborted anyway;
- a task rolls back the prepared transactions that older runs of its query left, unless a decision names them:
  an older run can no longer record a decision, so they can never become part of one.

With ``deliveryGuarantee`` at_least_once a task commits its own transaction and the driver has nothing to do.
"""

from __future__ import annotations

import hashlib
import logging
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import psycopg
import pyarrow as pa
from psycopg import errors, sql
from psycopg.conninfo import conninfo_to_dict
from psycopg.types.json import Jsonb
from pyspark.sql.types import StructType

from ..options import duration_ms
from ..two_phase_commit import Decision, DecisionLog, Handle, TaskAttempt, TwoPhaseCommitSink, parse_handle_id
from .options import DEFAULT_LOCK_TIMEOUT, PostgresSinkOptions
from .types import UnsupportedColumnType, accepts, converter, postgres_type

GID_PREFIX = "sparkeos-"
MAX_GID_BYTES = 199  # PostgreSQL's limit is under 200 bytes
DECISIONS_TABLE = "sparkeos_decisions"
COMMITS_TABLE = "sparkeos_commits"
FENCES_TABLE = "sparkeos_fences"
RUNS_TABLE = "sparkeos_runs"
RETAINED_RUNS = 100  # runs (one per batch) kept behind the newest: a driver stalled for longer may fence it once

log = logging.getLogger("sparkeos.sink")


class PostgresSinkError(ValueError):
    """The database or table cannot take the query's rows; the message says why and what to change."""


class DecidedTransactionLost(RuntimeError):
    """A prepared transaction that a decision names was rolled back by something other than the sink."""


class RunFenced(RuntimeError):
    """A newer run of the query started (another driver of it): this run may no longer decide or write."""


@dataclass(frozen=True)
class Column:
    name: str
    oid: int
    table_type: str


@dataclass
class TaskTransaction:
    """One task attempt's database transaction; ``connection`` None when the batch was decided before."""

    connection: psycopg.Connection | None
    gid: str | None
    records: int = 0
    converters: list[Callable[[Any], Any] | None] = field(default_factory=list)
    backend_pid: int = 0  # the server process of ``connection``
    task: TaskAttempt | None = None


def run_of(handle_id: str) -> str:
    """The run that prepared a transaction, the last part of its handle id (``PostgresSink.handle_id``)."""
    return handle_id.rsplit("-", 1)[-1]


def describe_url(url: str) -> str:
    """The server and database of a connection string, without its password."""
    try:
        parts = conninfo_to_dict(url)
    except psycopg.Error:
        return "the database of option 'url'"
    host = parts.get("host") or parts.get("hostaddr") or "local socket"
    port = f":{parts['port']}" if parts.get("port") else ""
    user = f"{parts['user']}@" if parts.get("user") else ""
    return f"{user}{host}{port}/{parts.get('dbname') or ''}"


class PostgresSink(TwoPhaseCommitSink[TaskTransaction]):
    format_name = "sparkeos.postgres"

    def __init__(self, options: PostgresSinkOptions, schema: StructType):
        self.options = options
        self.schema = schema
        self.run = uuid.uuid4().hex[:8]
        self.table = options.table
        self.columns: list[Column] = []
        self.decisions_schema = options.table.schema or "public"
        self.target = ""  # set by prepare(): a short name of the database and table written
        self.target_label = ""  # and its long name
        self._connection: psycopg.Connection | None = None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_connection": None}  # connections do not travel; each process opens its own

    def describe(self) -> str:
        return f"sparkeos.postgres table {self.table} at {describe_url(self.options.url)}"

    def checkpoint_target(self) -> str | None:
        return self.target_label or None

    # --- connections ---

    def connect(self, autocommit: bool = True) -> psycopg.Connection:
        try:
            return psycopg.connect(self.options.url, autocommit=autocommit)
        except psycopg.Error as error:
            raise PostgresSinkError(f"cannot connect to PostgreSQL ({describe_url(self.options.url)}): "
                                    f"{str(error).strip()}") from error

    def _driver_connection(self) -> psycopg.Connection:
        if self._connection is None or self._connection.closed or self._connection.broken:
            self._connection = self.connect()
        return self._connection

    def _table_sql(self) -> sql.Composable:
        return sql.Identifier(self.table.schema, self.table.name) if self.table.schema else sql.Identifier(
            self.table.name)

    def _decisions_sql(self) -> sql.Composable:
        return sql.Identifier(self.decisions_schema, DECISIONS_TABLE)

    def _commits_sql(self) -> sql.Composable:
        return sql.Identifier(self.decisions_schema, COMMITS_TABLE)

    def _fences_sql(self) -> sql.Composable:
        return sql.Identifier(self.decisions_schema, FENCES_TABLE)

    def _runs_sql(self) -> sql.Composable:
        return sql.Identifier(self.decisions_schema, RUNS_TABLE)

    # --- before the query writes (driver) ---

    def prepare(self) -> None:
        """Check the server and the table, create what is missing, and learn the table's column types."""
        for column in self.schema.fields:
            try:
                postgres_type(column.dataType, column.name)
            except UnsupportedColumnType as error:
                raise PostgresSinkError(str(error)) from None
        for key in self.options.upsert_keys:
            if key not in self.schema.fieldNames():
                raise PostgresSinkError(f"upsertKeys column {key!r} is not in the DataFrame; columns: "
                                        f"{', '.join(self.schema.fieldNames())}")
        with self.connect() as connection:
            if self.options.exactly_once:
                limit = int(connection.execute("SHOW max_prepared_transactions").fetchone()[0])
                if limit == 0:
                    raise PostgresSinkError(
                        f"PostgreSQL ({describe_url(self.options.url)}) has max_prepared_transactions = 0, so it "
                        "cannot prepare transactions, which deliveryGuarantee exactly_once needs: restart PostgreSQL "
                        "with max_prepared_transactions at least the number of a batch's tasks with rows, the sink's "
                        "input partitions (e.g. in postgresql.conf, or -c max_prepared_transactions=64), or use "
                        "deliveryGuarantee at_least_once")
            self._locate(connection)
            oid = connection.execute("SELECT to_regclass(%s)::oid", [self._table_sql().as_string(connection)]
                                     ).fetchone()[0]
            if oid is None:
                if not self.options.create_table:
                    raise PostgresSinkError(
                        f"table {self.table} does not exist in {describe_url(self.options.url)}: create it, or set "
                        "option createTable to true to create it from the DataFrame's schema")
                self._create_table(connection)
                oid = connection.execute("SELECT to_regclass(%s)::oid", [self._table_sql().as_string(connection)]
                                         ).fetchone()[0]
            self.columns = self._check_columns(connection, oid)
            if self.options.upsert_keys:
                self._check_upsert(connection, oid)
            if self.options.exactly_once:
                self._create_control_tables(connection)

    def _locate(self, connection: psycopg.Connection) -> None:
        """Where the sink's own tables are (the table's schema), and the tag naming the table in them."""
        if self.table.schema is None:
            self.decisions_schema = connection.execute("SELECT current_schema()").fetchone()[0]
        database = connection.execute("SELECT current_database()").fetchone()[0]
        self.target = hashlib.sha256(f"{database}\0{self.decisions_schema}\0{self.table.name}".encode()
                                     ).hexdigest()[:8]
        self.target_label = f"table {self.decisions_schema}.{self.table.name} of database {database}"

    def attach(self) -> None:
        """For an operator's command: find the sink's tables without checking or creating anything."""
        with self.connect() as connection:
            self._locate(connection)

    def _create_control_tables(self, connection: psycopg.Connection) -> None:
        connection.execute(sql.SQL(
            "CREATE TABLE IF NOT EXISTS {} (query text NOT NULL, batch bigint NOT NULL, handles jsonb NOT NULL,"
            " finished boolean NOT NULL DEFAULT false, decided timestamptz NOT NULL DEFAULT now(),"
            " PRIMARY KEY (query, batch))").format(self._decisions_sql()))
        connection.execute(sql.SQL(
            "CREATE TABLE IF NOT EXISTS {} (gid text PRIMARY KEY, query text NOT NULL, batch bigint NOT NULL)"
        ).format(self._commits_sql()))
        connection.execute(sql.SQL(
            "CREATE TABLE IF NOT EXISTS {} (query text PRIMARY KEY, run text NOT NULL, epoch bigint NOT NULL,"
            " claimed timestamptz NOT NULL DEFAULT now())").format(self._fences_sql()))
        connection.execute(sql.SQL(
            "CREATE TABLE IF NOT EXISTS {} (query text NOT NULL, run text NOT NULL, epoch bigint NOT NULL,"
            " claimed timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (query, run))").format(self._runs_sql()))

    def _create_table(self, connection: psycopg.Connection) -> None:
        definitions = [sql.SQL("{} {}{}").format(sql.Identifier(c.name), sql.SQL(postgres_type(c.dataType, c.name)),
                                                 sql.SQL("" if c.nullable else " NOT NULL"))
                       for c in self.schema.fields]
        if self.options.upsert_keys:
            definitions.append(sql.SQL("PRIMARY KEY ({})").format(
                sql.SQL(", ").join(map(sql.Identifier, self.options.upsert_keys))))
        connection.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} ({})").format(
            self._table_sql(), sql.SQL(", ").join(definitions)))

    def _check_columns(self, connection: psycopg.Connection, oid: int) -> list[Column]:
        found = {name: (type_oid, type_name) for name, type_oid, type_name in connection.execute(
            "SELECT attname, atttypid::int, format_type(atttypid, atttypmod) FROM pg_attribute "
            "WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped ORDER BY attnum", [oid])}
        problems, columns = [], []
        for column in self.schema.fields:
            spark_type = column.dataType.simpleString()
            if column.name not in found:
                problems.append(f"column {column.name!r} ({spark_type}) is not in the table")
                continue
            type_oid, type_name = found[column.name]
            if not accepts(column.dataType, type_name):
                problems.append(f"column {column.name!r} is {spark_type} in the DataFrame but {type_name} in the "
                                f"table (expected {postgres_type(column.dataType, column.name)})")
            columns.append(Column(column.name, type_oid, type_name))
        if problems:
            raise PostgresSinkError(f"table {self.table} does not match the DataFrame: {'; '.join(problems)}; "
                                    f"the table's columns: {', '.join(f'{n} {t}' for n, (_, t) in found.items())}")
        return columns

    def _check_upsert(self, connection: psycopg.Connection, oid: int) -> None:
        """``ON CONFLICT (keys)`` needs a unique index on exactly the keys that PostgreSQL can infer as its arbiter:
        immediate (not a deferrable constraint), without a predicate or expressions, valid. Read from the catalog,
        which takes no lock on the table: this runs on the driver before each batch's commit, when the batch's
        prepared transactions may hold the table and DDL wait for them, and any lock on the table would queue
        behind that DDL."""
        indexes = connection.execute(
            "SELECT i.indexrelid::regclass::text, array(SELECT a.attname::text FROM unnest((i.indkey::int2[])"
            "[0:i.indnkeyatts - 1]) AS k(attnum) JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = "
            "k.attnum) FROM pg_index i WHERE i.indrelid = %s AND i.indisunique AND i.indimmediate AND i.indisvalid "
            "AND i.indpred IS NULL AND i.indexprs IS NULL", [oid]).fetchall()
        keys = set(self.options.upsert_keys)
        if not any(set(columns) == keys and len(columns) == len(keys) for _name, columns in indexes):
            found = "; ".join(f"{name} on ({', '.join(columns)})" for name, columns in indexes) or "none"
            raise PostgresSinkError(f"upsertKeys ({', '.join(self.options.upsert_keys)}) cannot be used with table "
                                    f"{self.table}: the keys need a primary key or unique index on exactly these "
                                    f"columns, not deferrable and without a WHERE clause (the table's unique "
                                    f"indexes: {found})")

    def _upsert_sql(self) -> sql.Composed:
        names = [c.name for c in self.columns]
        keys = self.options.upsert_keys
        updates = [sql.SQL("{0} = EXCLUDED.{0}").format(sql.Identifier(n)) for n in names if n not in keys]
        action = (sql.SQL("DO UPDATE SET ") + sql.SQL(", ").join(updates)) if updates else sql.SQL("DO NOTHING")
        values = sql.SQL(", ").join(sql.SQL("%s::" + c.table_type) for c in self.columns)
        return sql.SQL("INSERT INTO {} ({}) VALUES ({}) ON CONFLICT ({}) ").format(
            self._table_sql(), sql.SQL(", ").join(map(sql.Identifier, names)), values,
            sql.SQL(", ").join(map(sql.Identifier, keys))) + action

    # --- executor side ---

    def scoped(self, query: str) -> str:
        """The name under which query ``query`` keeps its decisions and transactions for this table: one query id
        can write more than one table (a copied checkpoint, a query pointed at another table), whose batches must
        not be taken for each other's."""
        return f"{query}.{self.target}"

    def handle_id(self, task: TaskAttempt) -> str:
        return f"{task.handle_id}-{self.run}"

    def gid(self, query: str, handle_id: str) -> str:
        gid = f"{GID_PREFIX}{self.scoped(query)}-{handle_id}"
        if len(gid.encode()) > MAX_GID_BYTES:
            raise PostgresSinkError(f"transaction id {gid!r} is longer than PostgreSQL's {MAX_GID_BYTES} bytes")
        return gid

    def begin_transaction(self, task: TaskAttempt) -> TaskTransaction:
        connection = self.connect()
        try:
            if self.options.exactly_once:
                epoch = self._claim(connection, task.query, self.run)
                if PostgresDecisionLog(self, task.query, connection).read(task.batch) is not None:
                    connection.close()
                    return TaskTransaction(None, None)
                self._abort_older_runs(connection, task.query, task.batch, epoch)
                gid = self.gid(task.query, self.handle_id(task))
                connection.autocommit = False
                connection.tpc_begin(gid)
            else:
                gid = None
                connection.autocommit = False
            self._set_lock_timeout(connection)
        except BaseException:
            connection.close()
            raise
        return TaskTransaction(connection, gid, 0, [converter(c.dataType) for c in self.schema.fields],
                               connection.info.backend_pid, task)

    def _set_lock_timeout(self, connection: psycopg.Connection) -> None:
        """The task's bound on a lock wait: the option, else the session's own lock_timeout (the user's, the role's,
        the url's), else DEFAULT_LOCK_TIMEOUT."""
        timeout_ms = self.options.lock_timeout_ms
        if timeout_ms is not None:
            connection.execute(sql.SQL("SET lock_timeout = {}").format(sql.Literal(f"{timeout_ms}ms")))
            return
        # One round trip either way: the session's own setting stays, and none ('0') becomes the default.
        connection.execute("SELECT set_config('lock_timeout', CASE current_setting('lock_timeout') WHEN '0' THEN %s "
                           "ELSE current_setting('lock_timeout') END, false)",
                           [f"{duration_ms(DEFAULT_LOCK_TIMEOUT)}ms"])

    def _claim(self, connection: psycopg.Connection, query: str, run: str) -> int:
        """The epoch of ``run`` for ``query``: the newest run's, or the next one when ``run`` is new; raises
        ``RunFenced`` when a newer run claimed since."""
        key = self.scoped(query)
        row = connection.execute(sql.SQL("SELECT run, epoch FROM {} WHERE query = %s").format(self._fences_sql()),
                                 [key]).fetchone()
        if row is not None and row[0] == run:
            return row[1]
        with connection.transaction():
            connection.execute(sql.SQL("INSERT INTO {} (query, run, epoch) VALUES (%s, '', 0) ON CONFLICT DO NOTHING"
                                       ).format(self._fences_sql()), [key])
            # Exclusive: waits for a decision being recorded under the share lock, whose run this claim fences.
            newest, epoch, claimed = connection.execute(sql.SQL(
                "SELECT run, epoch, claimed FROM {} WHERE query = %s FOR UPDATE").format(self._fences_sql()),
                [key]).fetchone()
            if newest == run:
                return epoch
            if connection.execute(sql.SQL("SELECT 1 FROM {} WHERE query = %s AND run = %s").format(self._runs_sql()),
                                  [key, run]).fetchone():
                raise self._fenced(query, run, newest, epoch, claimed)
            epoch += 1
            connection.execute(sql.SQL("UPDATE {} SET run = %s, epoch = %s, claimed = now() WHERE query = %s"
                                       ).format(self._fences_sql()), [run, epoch, key])
            connection.execute(sql.SQL("INSERT INTO {} (query, run, epoch) VALUES (%s, %s, %s)").format(
                self._runs_sql()), [key, run, epoch])
        return epoch

    def _fenced(self, query: str, run: str, newest: str, epoch: int, claimed: Any) -> RunFenced:
        return RunFenced(
            f"run {run} of query {query} (table {self.table}) was superseded by run {newest} (epoch "
            f"{epoch}, started {claimed:%Y-%m-%d %H:%M:%S %Z}): another driver of the same query runs (a driver "
            "retried while this one still runs, or a copy of the checkpoint). Only the newest run writes and "
            "decides; this one stops, and the newer run rolls back what it prepared")

    def _abort_older_runs(self, connection: psycopg.Connection, query: str, batch: int, epoch: int) -> None:
        """Roll back what runs older than this one prepared for batches up to ``batch``, unless a decision names it.
        Read after the claim: a decision of an older run is either visible now or was refused."""
        named = {h.id for d in PostgresDecisionLog(self, query, connection).unfinished() for h in d.handles}
        newer_or_same = {run for (run,) in connection.execute(sql.SQL(
            "SELECT run FROM {} WHERE query = %s AND epoch >= %s").format(self._runs_sql()),
            [self.scoped(query), epoch])}
        for handle_id, handle_batch in self._pending(connection, query):
            if handle_batch <= batch and run_of(handle_id) not in newer_or_same and handle_id not in named:
                self._resolve(connection, self.gid(query, handle_id), "ROLLBACK")

    def invoke(self, transaction: TaskTransaction, rows: pa.RecordBatch) -> None:
        if transaction.connection is None:
            return
        values = []
        for convert, column in zip(transaction.converters, rows.columns, strict=True):
            items = column.to_pylist()
            values.append(items if convert is None else [convert(item) for item in items])
        records = list(zip(*values, strict=True))
        try:
            self._write(transaction, records)
        except errors.LockNotAvailable as error:
            raise self._lock_wait_error(transaction) from error
        transaction.records += len(records)

    def _write(self, transaction: TaskTransaction, records: list[tuple]) -> None:
        with transaction.connection.cursor() as cursor:
            if self.options.upsert_keys:
                statement = self._upsert_sql()
                for start in range(0, len(records), self.options.batch_size):
                    cursor.executemany(statement, records[start:start + self.options.batch_size])
            else:
                names = sql.SQL(", ").join(sql.Identifier(c.name) for c in self.columns)
                with cursor.copy(sql.SQL("COPY {} ({}) FROM STDIN (FORMAT BINARY)").format(self._table_sql(),
                                                                                         names)) as copy:
                    copy.set_types([c.oid for c in self.columns])
                    for record in records:
                        copy.write_row(record)

    def _lock_wait_error(self, transaction: TaskTransaction) -> PostgresSinkError:
        """What a task that waited too long for a row lock says: which of this task's earlier attempts holds it, if
        one does (its executor was lost after its PREPARE), and what resolves it."""
        waited = (f"{self.options.lock_timeout_ms} ms (option lockTimeout)" if self.options.lock_timeout_ms
                  is not None else "the session's lock_timeout (option lockTimeout)")
        task = transaction.task
        earlier = []
        if task is not None and self.options.exactly_once:
            try:
                with self.connect() as connection:
                    earlier = [self.gid(task.query, handle_id) for handle_id, _batch in
                               self._pending(connection, task.query)
                               if parse_handle_id(handle_id)[:2] == (task.batch, task.partition)
                               and handle_id != self.handle_id(task)]
            except (psycopg.Error, PostgresSinkError):
                earlier = []
        if earlier:
            return PostgresSinkError(
                f"the task waited {waited} for row locks held by {', '.join(sorted(earlier))}, prepared by an "
                "earlier attempt of this task that died after its PREPARE (an executor lost). Only the driver "
                "resolves prepared transactions, after every task of the batch succeeded, so the wait would not "
                "end. The task fails, and Spark retries it; if the retries fail the same way, restart the query: a "
                "restarted query rolls back what earlier runs left prepared before it writes")
        return PostgresSinkError(
            f"the task waited {waited} for a row lock of table {self.table} held by another transaction (see "
            "pg_locks). With upsertKeys or a unique key, rows of one key in a batch must reach one task (e.g. "
            "repartition by the key): a second task writing the key waits for the first one's prepared transaction, "
            "which the driver commits only after both")

    def pre_commit(self, transaction: TaskTransaction, task: TaskAttempt) -> Handle:
        connection = transaction.connection
        if connection is None:  # the batch was decided before: nothing of this replay is wanted
            return Handle(self.handle_id(task), task.batch, task.partition, 0, {"gid": None})
        try:
            if self.options.exactly_once:
                # Committed with the rows, or rolled back with them: the trace of this transaction's outcome.
                connection.execute(sql.SQL("INSERT INTO {} (gid, query, batch) VALUES (%s, %s, %s)").format(
                    self._commits_sql()), [transaction.gid, self.scoped(task.query), task.batch])
                self._prepare(connection)
            else:
                connection.commit()
        finally:
            connection.close()
        return Handle(self.handle_id(task), task.batch, task.partition, transaction.records,
                      {"gid": transaction.gid})

    def _prepare(self, connection: psycopg.Connection) -> None:
        try:
            connection.tpc_prepare()
        except errors.OutOfMemory as error:  # SQLSTATE 53200, which PostgreSQL also gives when no slot is left
            if "prepared transactions" not in str(error):
                raise
            limit = connection.info.parameter_status("max_prepared_transactions")
            limit = limit if limit is not None else self._setting("max_prepared_transactions")
            raise PostgresSinkError(
                f"PostgreSQL ({describe_url(self.options.url)}) has no prepared transaction left "
                f"(max_prepared_transactions = {limit}): a batch holds one prepared transaction per task with rows "
                "until the driver commits it after its last task, so the setting must be at least the number of "
                "the sink's input partitions, plus what other clients prepare meanwhile. Restart PostgreSQL with a "
                "larger max_prepared_transactions, or give the sink fewer partitions (coalesce)") from error

    def _setting(self, name: str) -> str:
        try:
            with self.connect() as connection:
                return connection.execute(sql.SQL("SHOW {}").format(sql.Identifier(name))).fetchone()[0]
        except (psycopg.Error, PostgresSinkError):
            return "unknown"

    def abort_transaction(self, transaction: TaskTransaction) -> None:
        connection = transaction.connection
        if connection is None:
            return
        try:
            if not connection.closed and not connection.broken:
                if transaction.gid is not None:
                    connection.tpc_rollback()  # rolls back the prepared transaction too, if PREPARE got that far
                else:
                    connection.rollback()
                return
        except psycopg.Error:
            pass  # a transaction whose session ends is rolled back by the server
        finally:
            connection.close()
        if transaction.gid is not None:
            self._roll_back_if_prepared(transaction)

    def _roll_back_if_prepared(self, transaction: TaskTransaction) -> None:
        """The PREPARE of a task whose connection was lost may have been carried out: roll back what it prepared,
        so that its row locks do not hold up the task's retry until the driver's commit, which waits for that
        retry. This attempt's handle never reaches the driver, so nothing else will commit it."""
        try:
            with self.connect() as connection:
                # Until the old session has ended, its PREPARE may still be under way.
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline and connection.execute(
                        "SELECT 1 FROM pg_stat_activity WHERE pid = %s", [transaction.backend_pid]).fetchone():
                    time.sleep(0.05)
                if self._resolve(connection, transaction.gid, "ROLLBACK"):
                    log.info("rolled back %s, prepared by a task whose connection was lost", transaction.gid)
        except (psycopg.Error, PostgresSinkError) as error:
            # The driver rolls it back after the batch's decision (step 7 of the protocol).
            log.warning("could not roll back %s after its task failed: %s", transaction.gid, str(error).strip())

    # --- driver side ---

    def _pending(self, connection: psycopg.Connection, query: str) -> list[tuple[str, int]]:
        prefix = f"{GID_PREFIX}{self.scoped(query)}-"
        found = []
        for (gid,) in connection.execute("SELECT gid FROM pg_prepared_xacts WHERE database = current_database() "
                                         "AND starts_with(gid, %s)", [prefix]):
            handle_id = gid[len(prefix):]
            parsed = parse_handle_id(handle_id)
            if parsed is not None:
                found.append((handle_id, parsed[0]))
        return found

    @staticmethod
    def _resolve(connection: psycopg.Connection, gid: str, verb: str) -> bool:
        """COMMIT or ROLLBACK the prepared transaction ``gid``; False when it is gone (resolved before)."""
        # Another session may be resolving the same transaction at this moment (two tasks rolling back what an
        # earlier run left): PostgreSQL then answers "busy" until that session is done.
        for _ in range(600):
            try:
                connection.execute(sql.SQL(verb + " PREPARED {}").format(sql.Literal(gid)))
            except errors.UndefinedObject:
                return False
            except errors.ObjectNotInPrerequisiteState:
                time.sleep(0.05)
                continue
            return True
        raise PostgresSinkError(f"prepared transaction {gid} stayed busy for 30 s: another session keeps resolving it")

    def commit(self, handle: Handle) -> None:
        gid = handle.data.get("gid")
        if not gid or not self.options.exactly_once:
            return
        connection = self._driver_connection()
        if self._resolve(connection, gid, "COMMIT"):
            return
        # No longer prepared: committed before (a repeated commit after a crash), or rolled back by something else.
        committed = connection.execute(sql.SQL("SELECT 1 FROM {} WHERE gid = %s").format(self._commits_sql()),
                                       [gid]).fetchone()
        if committed is None:
            raise DecidedTransactionLost(
                f"prepared transaction {gid}, which the decision of batch {handle.batch} names (task "
                f"{handle.partition}, {handle.records} rows), was rolled back by something other than this sink (a "
                "ROLLBACK PREPARED by hand, a cleanup of the database): its rows are not in the table. The "
                "batch's decision stays unfinished, so the query fails until it is resolved; see "
                "docs/postgres-sink.md, \"What is left in the database\"")

    def abort(self, query: str, handle_id: str) -> None:
        if self.options.exactly_once:
            self._resolve(self._driver_connection(), self.gid(query, handle_id), "ROLLBACK")

    def pending(self, query: str) -> Iterable[tuple[str, int]]:
        if not self.options.exactly_once:
            return []
        return self._pending(self._driver_connection(), query)

    def decision_log(self, query: str) -> DecisionLog:
        if not self.options.exactly_once:
            return NoDecisionLog()
        return PostgresDecisionLog(self, query)

    # --- for operators ---

    def queries(self) -> list[str]:
        if not self.options.exactly_once:
            return []
        connection = self._driver_connection()
        suffix = f".{self.target}"
        found = set()
        for (gid,) in connection.execute("SELECT gid FROM pg_prepared_xacts WHERE database = current_database() AND "
                                         "starts_with(gid, %s)", [GID_PREFIX]):
            scoped = gid[len(GID_PREFIX):].rsplit("-", 4)[0]  # <query>.<target>-<batch>-<partition>-<attempt>-<run>
            if scoped.endswith(suffix):
                found.add(scoped[:-len(suffix)])
        if connection.execute("SELECT to_regclass(%s)", [self._decisions_sql().as_string(connection)]).fetchone()[0]:
            found.update(query[:-len(suffix)] for (query,) in connection.execute(sql.SQL(
                "SELECT DISTINCT query FROM {} WHERE NOT finished AND right(query, %s) = %s").format(
                self._decisions_sql()), [len(suffix), suffix]))
        return sorted(found)

    def pending_details(self, query: str, handle_ids: list[str]) -> dict[str, tuple[str, datetime | None]]:
        prefix = f"{GID_PREFIX}{self.scoped(query)}-"
        return {gid[len(prefix):]: (gid, prepared) for gid, prepared in self._driver_connection().execute(
            "SELECT gid, prepared FROM pg_prepared_xacts WHERE database = current_database() AND starts_with(gid, %s)",
            [prefix])}

    def fence(self, query: str) -> bool:
        """Claim the query's next epoch for an operator's run, which never writes: a run of the query still writing
        can then record no decision, and its next run claims a newer epoch and goes on."""
        if not self.options.exactly_once:
            return False
        with self.connect() as connection:
            self._create_control_tables(connection)
            self._claim(connection, query, f"operator{uuid.uuid4().hex[:8]}")
        return True

    def forget(self, query: str) -> None:
        """Drop the finished decisions of a query that will run no more (a batch write)."""
        if self.options.exactly_once:
            connection = self._driver_connection()
            connection.execute(sql.SQL("DELETE FROM {} WHERE query = %s AND finished").format(self._decisions_sql()),
                               [self.scoped(query)])
            for table in (self._commits_sql(), self._fences_sql(), self._runs_sql()):
                connection.execute(sql.SQL("DELETE FROM {} WHERE query = %s").format(table), [self.scoped(query)])


class PostgresDecisionLog(DecisionLog):
    """One row per decision in ``sparkeos_decisions``: (query, batch, handles, finished), the query named for the
    table (``PostgresSink.scoped``)."""

    def __init__(self, sink: PostgresSink, query: str, connection: psycopg.Connection | None = None):
        self.sink = sink
        self.query = query
        self.key = sink.scoped(query)
        self.connection = connection

    def _execute(self, statement: str, parameters: list) -> list[tuple]:
        connection = self.connection or self.sink._driver_connection()
        cursor = connection.execute(sql.SQL(statement).format(self.sink._decisions_sql()), parameters)
        return cursor.fetchall() if cursor.description else []

    def _decision(self, batch: int, handles: list) -> Decision:
        return Decision(self.query, batch, tuple(Handle.from_json(h) for h in handles))

    def read(self, batch: int) -> Decision | None:
        rows = self._execute("SELECT handles FROM {} WHERE query = %s AND batch = %s", [self.key, batch])
        return self._decision(batch, rows[0][0]) if rows else None

    def recorded_at(self, batch: int) -> datetime | None:
        rows = self._execute("SELECT decided FROM {} WHERE query = %s AND batch = %s", [self.key, batch])
        return rows[0][0] if rows else None

    def read_settled(self, batch: int) -> Decision | None:
        # An INSERT of the same key waits for one under way in another session (PostgreSQL's unique check), and
        # finds its row once it committed. The probe's own row, if any, is rolled back: it decides nothing.
        connection = self.sink.connect(autocommit=False)
        try:
            connection.execute(sql.SQL("INSERT INTO {} (query, batch, handles) VALUES (%s, %s, '[]') ON CONFLICT DO "
                                       "NOTHING").format(self.sink._decisions_sql()), [self.key, batch])
            connection.rollback()
        finally:
            connection.close()
        return self.read(batch)

    def record(self, decision: Decision) -> Decision:
        # The primary key makes the first decision of a batch the only one; a second driver's INSERT waits for an
        # INSERT of the same key under way, then finds its row.
        connection = self.connection or self.sink._driver_connection()
        with connection.transaction():
            if decision.handles:  # one without handles publishes nothing: a failed batch write's (protocol.py)
                self._check_not_fenced(connection, decision)
            inserted = self._execute("INSERT INTO {} (query, batch, handles) VALUES (%s, %s, %s) ON CONFLICT DO "
                                     "NOTHING RETURNING batch",
                                     [self.key, decision.batch, Jsonb([h.to_json() for h in decision.handles])])
        if inserted:
            return decision
        held = self.read(decision.batch)
        if held is None:  # deleted in between by hand: nothing holds, so this one is recorded after all
            return self.record(decision)
        return held

    def _check_not_fenced(self, connection: psycopg.Connection, decision: Decision) -> None:
        """The decision's run must be the query's newest, and stays so until the decision is committed: the share
        lock holds back a newer run's claim, whose tasks then see the decision."""
        runs = {run_of(h.id) for h in decision.handles}
        fence = connection.execute(sql.SQL("SELECT run, epoch, claimed FROM {} WHERE query = %s FOR SHARE").format(
            self.sink._fences_sql()), [self.key]).fetchone()
        if fence is None:
            raise PostgresSinkError(f"table {self.sink._fences_sql().as_string(connection)} has no run of query "
                                    f"{self.query}, whose tasks each claim one: it was deleted while the query ran")
        newest, epoch, claimed = fence
        stale = sorted(runs - {newest})
        if stale:
            raise self.sink._fenced(self.query, stale[0], newest, epoch, claimed)

    def latest(self) -> int | None:
        return self._execute("SELECT max(batch) FROM {} WHERE query = %s", [self.key])[0][0]

    def unfinished(self) -> list[Decision]:
        rows = self._execute("SELECT batch, handles FROM {} WHERE query = %s AND NOT finished ORDER BY batch",
                             [self.key])
        return [self._decision(batch, handles) for batch, handles in rows]

    def finish(self, batch: int) -> None:
        self._execute("UPDATE {} SET finished = true WHERE query = %s AND batch = %s", [self.key, batch])

    def forget_before(self, batch: int) -> None:
        self._execute("DELETE FROM {} WHERE query = %s AND batch < %s AND finished", [self.key, batch])
        connection = self.connection or self.sink._driver_connection()
        # Below every batch a replay can reach, whose decisions are forgotten too.
        connection.execute(sql.SQL("DELETE FROM {} WHERE query = %s AND batch < %s").format(self.sink._commits_sql()),
                           [self.key, batch])
        # A run forgotten here, if it ever came back, would claim again and fence the newest: it fails no decision,
        # since each is checked against the newest run when it is recorded, and what it prepared counts as older.
        connection.execute(sql.SQL("DELETE FROM {} WHERE query = %s AND epoch < (SELECT epoch FROM {} WHERE query = "
                                   "%s) - %s").format(self.sink._runs_sql(), self.sink._fences_sql()),
                           [self.key, self.key, RETAINED_RUNS])


class NoDecisionLog(DecisionLog):
    """at_least_once: tasks commit their own transactions, so there is nothing to decide."""

    def read(self, batch: int) -> Decision | None:
        return None

    def record(self, decision: Decision) -> Decision:
        return decision

    def latest(self) -> int | None:
        return None

    def unfinished(self) -> list[Decision]:
        return []

    def finish(self, batch: int) -> None:
        pass

    def forget_before(self, batch: int) -> None:
        pass
