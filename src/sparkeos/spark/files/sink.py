"""The `sparkeos.files` sink: files in a directory that any reader lists, published by two-phase commit.

Layout of ``path``::

    path/k=v/part-<batch>-<partition>-<query>.c<n>.parquet  published files (Hive-style directories with partitionBy;
                                                            n counts a task's files in a directory: maxRecordsPerFile)
    path/_sparkeos/<query>/staging/<batch>-<partition>-<attempt>/<n>.inprogress     pre-committed, invisible
    path/_sparkeos/<query>/decisions/<batch>.decision, <batch>.finished           the decision log

A task writes one staged file per partitionBy directory it has rows for, under ``_sparkeos`` with a name that
ends in no format's extension: directory readers skip ``_``-prefixed paths (pyarrow, pandas, Spark), and a glob
such as DuckDB's ``**/*.parquet``, which does not, matches no staged file. A commit moves each staged file to its
final name: a rename on a file system that has one (local, HDFS: atomic, so a reader sees the whole file or
none), a copy and then a delete on an object store (S3: the object appears whole at once). Both are repeatable: a
staged file that is gone means its move was done, provided its final file is there. Final names depend only on
the query, batch and partition, so a repeated commit rewrites the same file with the same bytes, never adds one.
The protocol (decisions, recovery) is `sparkeos.spark.two_phase_commit`'s.
"""

from __future__ import annotations

import posixpath
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from urllib.parse import quote

import pyarrow as pa
import pyarrow.fs as pafs

from ... import failpoints
from ...locations import open_location
from ..s3 import S3Client
from ..two_phase_commit import (
    DecisionLog,
    FileDecisionLog,
    Handle,
    TaskAttempt,
    TwoPhaseCommitSink,
    parse_handle_id,
)
from .formats import FormatWriter, file_extension
from .options import FileSinkOptions

CONTROL_DIR = "_sparkeos"
STAGED_SUFFIX = ".inprogress"
HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"
# The characters Spark escapes in a partition directory's value (ExternalCatalogUtils.escapePathName).
_ESCAPED = set('"#%\'*/:=?\\\x7f{[]^') | {chr(c) for c in range(0x20)}


def file_system(path: str, s3: dict[str, str] | None = None) -> tuple[pafs.FileSystem, str]:
    """pyarrow's file system for ``path`` (a local path, or a URI: file://, s3://, s3a://, hdfs://...), and the path
    within it. ``s3`` holds Hadoop's `fs.s3a.*` settings for S3 and S3-compatible stores."""
    if s3 and path.startswith(("s3://", "s3a://")):
        return _s3_file_system(s3), path.split("://", 1)[1].rstrip("/")
    return open_location(path)


def _s3_file_system(s3: dict[str, str]) -> pafs.S3FileSystem:
    settings: dict = {}
    endpoint = s3.get("fs.s3a.endpoint")
    scheme = "https" if s3.get("fs.s3a.connection.ssl.enabled", "true").lower() == "true" else "http"
    if endpoint:
        if "://" in endpoint:
            scheme, endpoint = endpoint.split("://", 1)
        settings["endpoint_override"] = endpoint.rstrip("/")
    settings["scheme"] = scheme
    for option, argument in (("fs.s3a.endpoint.region", "region"), ("fs.s3a.access.key", "access_key"),
                             ("fs.s3a.secret.key", "secret_key"), ("fs.s3a.session.token", "session_token")):
        if option in s3:
            settings[argument] = s3[option]
    return pafs.S3FileSystem(**settings)


def escape_partition_value(value) -> str:
    if value is None:
        return HIVE_NULL
    text = value.isoformat(sep=" ") if hasattr(value, "isoformat") and not isinstance(value, str) else str(value)
    if text == "":
        return HIVE_NULL
    return "".join(f"%{ord(c):02X}" if c in _ESCAPED else c for c in text)


@dataclass
class StagedFiles:
    """A task attempt's transaction: its open file per partitionBy directory, and every file it staged."""

    task: TaskAttempt
    directory: str
    writers: dict[str, FormatWriter] = field(default_factory=dict)  # partition directory -> its open file
    staged: dict[str, list[str]] = field(default_factory=dict)  # partition directory -> its staged files, in order
    closed_records: int = 0  # in files closed because they were full


class FileSink(TwoPhaseCommitSink[StagedFiles]):
    format_name = "sparkeos.files"

    def __init__(self, options: FileSinkOptions):
        self.options = options
        self._fs: tuple[pafs.FileSystem, str] | None = None
        self._s3_client: S3Client | None = None

    def __getstate__(self) -> dict:
        # File system clients do not travel; each process opens its own.
        return {**self.__dict__, "_fs": None, "_s3_client": None}

    @property
    def fs(self) -> pafs.FileSystem:
        return self._resolved()[0]

    @property
    def root(self) -> str:
        return self._resolved()[1]

    def _s3(self) -> S3Client:
        if self._s3_client is None:
            self._s3_client = S3Client(dict(self.options.s3))
        return self._s3_client

    def _resolved(self) -> tuple[pafs.FileSystem, str]:
        if self._fs is None:
            self._fs = file_system(self.options.path, dict(self.options.s3))
        return self._fs

    def describe(self) -> str:
        return f"sparkeos.files {self.options.format} at {self.options.path}"

    def checkpoint_target(self) -> str:
        return f"directory {self.root} ({self.fs.type_name})"

    def _query_dir(self, query: str) -> str:
        return f"{self.root}/{CONTROL_DIR}/{query}"

    def _staging_dir(self, query: str) -> str:
        return f"{self._query_dir(query)}/staging"

    def prepare(self) -> None:
        """On the driver before the query writes: ``path`` must be a directory we can write in."""
        info = self.fs.get_file_info(self.root)
        if info.type == pafs.FileType.File:
            raise FileSinkPathError(f"path {self.options.path!r} of the sparkeos.files sink is a file, not a directory")
        probe = f"{self.root}/{CONTROL_DIR}/.probe-{uuid.uuid4().hex[:8]}"
        try:
            self.fs.create_dir(f"{self.root}/{CONTROL_DIR}", recursive=True)
            with self.fs.open_output_stream(probe) as stream:
                stream.write(b"")
            self.fs.delete_file(probe)
        except (OSError, pa.ArrowException) as error:
            raise FileSinkPathError(f"path {self.options.path!r} of the sparkeos.files sink cannot be written: "
                                    f"{error}") from error

    # --- executor side ---

    def begin_transaction(self, task: TaskAttempt) -> StagedFiles:
        directory = f"{self._staging_dir(task.query)}/{task.handle_id}"
        self.fs.create_dir(directory, recursive=True)
        return StagedFiles(task, directory)

    def invoke(self, transaction: StagedFiles, rows: pa.RecordBatch) -> None:
        limit = self.options.max_records_per_file
        for partition_dir, part in self._split(rows):
            written = 0
            while written < part.num_rows:
                writer = transaction.writers.get(partition_dir)
                if writer is not None and limit and writer.records >= limit:
                    writer.close()  # full: staged whole, and the task goes on in a new file
                    transaction.closed_records += writer.records
                    writer = None
                if writer is None:
                    files = transaction.staged.setdefault(partition_dir, [])
                    staged = f"{transaction.directory}/{sum(map(len, transaction.staged.values()))}{STAGED_SUFFIX}"
                    writer = FormatWriter(self.fs.open_output_stream(staged), part.schema, self.options.format,
                                          self.options.codec, self.options.header)
                    transaction.writers[partition_dir] = writer
                    files.append(staged)
                take = part.num_rows - written if not limit else min(limit - writer.records, part.num_rows - written)
                writer.write(part.slice(written, take))
                written += take

    def _split(self, rows: pa.RecordBatch) -> Iterable[tuple[str, pa.RecordBatch]]:
        columns = self.options.partition_by
        if not columns:
            return [("", rows)]
        data = rows.drop_columns(list(columns))
        keys = list(zip(*(rows.column(name).to_pylist() for name in columns), strict=True))
        groups: dict[tuple, list[int]] = {}
        for index, key in enumerate(keys):
            groups.setdefault(key, []).append(index)
        parts = []
        for key, indices in groups.items():
            directory = "/".join(f"{quote_name(name)}={escape_partition_value(value)}"
                                 for name, value in zip(columns, key, strict=True))
            parts.append((directory, data.take(pa.array(indices, pa.int64()))))
        return parts

    def pre_commit(self, transaction: StagedFiles, task: TaskAttempt) -> Handle:
        records = transaction.closed_records
        for writer in transaction.writers.values():
            writer.close()  # the bytes are in the staged file; nothing is visible yet
            records += writer.records
        name = f"part-{task.batch:05d}-{task.partition:05d}-{task.query}"
        extension = file_extension(self.options.format, self.options.codec)
        files = []
        for partition_dir, staged_files in sorted(transaction.staged.items()):
            for number, staged in enumerate(staged_files):
                final = f"{name}.c{number:03d}{extension}"
                files.append([self._relative(staged), f"{partition_dir}/{final}" if partition_dir else final])
        return Handle(task.handle_id, task.batch, task.partition, records, {"files": files})

    def abort_transaction(self, transaction: StagedFiles) -> None:
        for writer in transaction.writers.values():
            try:
                writer.close()
            except Exception:  # a half-written file is deleted below whatever state it is in
                pass
        self.fs.delete_dir(transaction.directory)

    def _relative(self, path: str) -> str:
        return path[len(self.root) + 1:]

    # --- driver side ---

    def commit(self, handle: Handle) -> None:
        for number, (staged, final) in enumerate(handle.data["files"]):
            if number == 1:
                failpoints.fire("files.between_renames")
            self._publish(f"{self.root}/{staged}", f"{self.root}/{final}")
        staging = f"{self.root}/{posixpath.dirname(handle.data['files'][0][0])}" if handle.data["files"] else None
        if staging and self.fs.get_file_info(staging).type != pafs.FileType.NotFound:
            self.fs.delete_dir(staging)

    def _publish(self, staged: str, final: str) -> None:
        staged_info, final_info = self.fs.get_file_info([staged, final])
        if staged_info.type == pafs.FileType.NotFound:
            if final_info.type == pafs.FileType.File:
                return  # moved by an earlier commit of this handle
            raise FileSinkCommitError(f"neither the staged file {staged} nor the published file {final} exists: "
                                      "the staged file was removed by something other than this sink")
        parent = posixpath.dirname(final)
        if parent != self.root:
            self.fs.create_dir(parent, recursive=True)
        if self.fs.type_name == "s3":
            # S3 has no rename: an object copied under its final name appears whole, and the copy can be repeated.
            # In parts when large: a single CopyObject is refused above 5 GiB, which would leave a decided batch
            # half published for good.
            self._s3().copy(staged, final)
            self.fs.delete_file(staged)
        else:
            self.fs.move(staged, final)

    def abort(self, query: str, handle_id: str) -> None:
        directory = f"{self._staging_dir(query)}/{handle_id}"
        if self.fs.get_file_info(directory).type != pafs.FileType.NotFound:
            self.fs.delete_dir(directory)

    def pending(self, query: str) -> list[tuple[str, int]]:
        selector = pafs.FileSelector(self._staging_dir(query), allow_not_found=True)
        found = []
        for info in self.fs.get_file_info(selector):
            parsed = parse_handle_id(info.base_name)
            if info.type == pafs.FileType.Directory and parsed is not None:
                found.append((info.base_name, parsed[0]))
        return found

    def decision_log(self, query: str) -> DecisionLog:
        return FileDecisionLog(self.fs, f"{self._query_dir(query)}/decisions", self._s3)

    # --- for operators ---

    def queries(self) -> list[str]:
        selector = pafs.FileSelector(f"{self.root}/{CONTROL_DIR}", allow_not_found=True)
        return [info.base_name for info in self.fs.get_file_info(selector)
                if info.type == pafs.FileType.Directory and not info.base_name.startswith(".")]

    def pending_details(self, query: str, handle_ids: list[str]) -> dict[str, tuple[str, datetime | None]]:
        shown = f"{self.options.path.rstrip('/')}/{CONTROL_DIR}/{query}/staging"
        details = {}
        for handle_id in handle_ids:
            directory = f"{self._staging_dir(query)}/{handle_id}"
            # An object store's directories have no time of their own: their files' newest is when they were staged.
            times = [info.mtime for info in self.fs.get_file_info(pafs.FileSelector(directory, allow_not_found=True))
                     if info.mtime is not None]
            details[handle_id] = (f"{shown}/{handle_id}", max(times) if times else None)
        return details


def quote_name(name: str) -> str:
    return quote(name, safe=" ")


class FileSinkPathError(ValueError):
    """The sink's path cannot hold its output."""


class FileSinkCommitError(RuntimeError):
    """A pre-committed file is missing when the driver commits it."""
