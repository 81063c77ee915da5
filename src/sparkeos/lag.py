"""`sparkeos lag`: how far a streaming query, or a consumer group, is behind its Kafka input.

Per topic-partition: the processed offset (the next offset the query reads), the latest offset (the last stable
offset, the end of what read_committed readers can reach), and the lag between them, like
`kafka-consumer-groups --describe`.

A query's processed offsets come from its checkpoint, so they can be read while the query is down: Spark's offset
log (`offsets/<batch>`) holds the end offsets it planned for each micro-batch, and its commit log (`commits/<batch>`)
names the batches that finished. The end offsets of the last committed batch are what the query has processed; a
newer batch in the offset log is planned and not committed (running, or to be run again on the next start). A
group's processed offsets are its committed offsets. Latest and earliest offsets come from ListOffsets, the
group's offsets from OffsetFetch: standard requests that any Kafka answers.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from confluent_kafka import KafkaException
from pyarrow import fs as pafs

from .client_settings import ClientSettingsError, client_config
from .locations import open_location
from .spark.kafka.cluster import KAFKA_INTERNAL_TOPICS, KafkaCluster
from .spark.kafka.source.offsets import BATCH_START_KEY, RESERVED_KEY_PREFIX, Offsets

DEFAULT_TIMEOUT_S = 15.0
VOID_OFFSET = "-"  # Spark's offset log line of a source that has no offset yet


class LagError(RuntimeError):
    """The lag cannot be told now: nothing planned yet, the cluster did not answer, ... (exit code 1)."""


class LagUsageError(LagError):
    """The command line names something that cannot work: no checkpoint there, a bad client property (exit code 2)."""


# --- the checkpoint -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CheckpointOffsets:
    """What a checkpoint says about its Kafka sources. `processed` and `planned` map a source (its position in the
    offset log, or its id in a version 2 log) to offsets; `planned` is empty unless a batch is planned and not
    committed."""

    location: str
    committed_batch: int | None
    planned_batch: int | None
    processed: dict[str, Offsets]
    planned: dict[str, Offsets]
    other_sources: int = 0

    @property
    def sources(self) -> list[str]:
        return sorted(set(self.processed) | set(self.planned), key=_source_order)


def _source_order(source: str) -> tuple[int, int | str]:
    return (0, int(source)) if source.isdigit() else (1, source)


class CheckpointFiles:
    """The offset and commit logs of a checkpoint: a local directory or a URI pyarrow can open (file://, s3://,
    s3a://, hdfs://, gs://; credentials from the environment)."""

    def __init__(self, location: str):
        self.location = location
        try:
            self.fs, self.root = open_location(location)
        except (OSError, ValueError) as exc:
            raise LagUsageError(f"cannot open checkpoint {location}: {exc}") from None

    def check(self) -> None:
        """A usage error unless `location` is a directory that holds a Spark checkpoint."""
        info = self._info(self.root)
        if info.type == pafs.FileType.NotFound:
            raise LagUsageError(f"no checkpoint at {self.location}: it does not exist")
        if info.type != pafs.FileType.Directory:
            raise LagUsageError(f"no checkpoint at {self.location}: it is not a directory")
        marks = [self._info(f"{self.root}/{name}").type for name in ("metadata", "offsets")]
        if all(mark == pafs.FileType.NotFound for mark in marks):
            raise LagUsageError(f"no checkpoint at {self.location}: it has neither a metadata file nor an offsets/ "
                                "directory (is it the checkpointLocation of a streaming query?)")

    def batches(self, log: str) -> list[int]:
        """The batch ids of `log` ("offsets" or "commits"): its files named by a number. Spark writes each one to a
        temporary name first, so a numbered file is complete."""
        try:
            infos = self.fs.get_file_info(pafs.FileSelector(f"{self.root}/{log}", allow_not_found=True))
        except OSError as exc:
            raise LagError(f"cannot list {self.location}/{log}: {exc}") from None
        return sorted(int(info.base_name) for info in infos
                      if info.type == pafs.FileType.File and info.base_name.isdigit())

    def read(self, log: str, batch: int) -> str:
        try:
            with self.fs.open_input_stream(f"{self.root}/{log}/{batch}") as stream:
                return stream.read().decode("utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise LagError(f"cannot read {self.location}/{log}/{batch}: {exc}") from None

    def _info(self, path: str):
        try:
            return self.fs.get_file_info(path)
        except OSError as exc:
            raise LagError(f"cannot read checkpoint {self.location}: {exc}") from None


def parse_offset_log_entry(text: str, where: str) -> dict[str, Any]:
    """Source -> its offset (parsed JSON, or None for a source without one) from one offset log entry.

    Version 1 (Spark's default): a version line, a metadata line, then one line per source in the query's order.
    Version 2 (written with spark.sql.streaming.queryEvolution.enableSourceEvolution): the same, with each source
    line prefixed by the source's id and a colon."""
    lines = text.splitlines()
    if len(lines) < 2 or lines[0] not in ("v1", "v2"):
        found = repr(lines[0][:20]) if lines else "an empty file"
        raise LagError(f"{where} is not a Spark offset log entry of version v1 or v2 (it starts with {found})")
    entries: dict[str, Any] = {}
    for index, line in enumerate(lines[2:]):
        if lines[0] == "v1":
            source, value = str(index), line
        else:
            source, colon, value = line.partition(":")
            if not colon:
                raise LagError(f"{where}: line {index + 3} is not SOURCE:OFFSET")
        if value == VOID_OFFSET:
            entries[source] = None
            continue
        try:
            entries[source] = json.loads(value)
        except json.JSONDecodeError:
            entries[source] = value  # not JSON: some source other than Kafka
    return entries


def kafka_offsets(value: Any) -> Offsets | None:
    """Offsets from a source's offset in Spark's Kafka JSON ({"topic": {"0": 42}}), the extra keys of sparkeos'
    source left out; None if `value` is not in that shape (a source other than Kafka)."""
    if not isinstance(value, dict):
        return None
    offsets: Offsets = {}
    for topic, partitions in value.items():
        if topic.startswith(RESERVED_KEY_PREFIX):
            continue
        if not isinstance(partitions, dict):
            return None
        for partition, offset in partitions.items():
            if not (isinstance(partition, str) and partition.isdigit() and type(offset) is int):
                return None
            offsets[(topic, int(partition))] = offset
    return offsets


def read_checkpoint(location: str) -> CheckpointOffsets:
    files = CheckpointFiles(location)
    files.check()
    planned_ids = files.batches("offsets")
    if not planned_ids:
        raise LagError(f"the query of checkpoint {location} has not planned a batch yet: its offsets log is empty")
    committed_ids = files.batches("commits")
    committed = committed_ids[-1] if committed_ids else None
    planned = planned_ids[-1] if committed is None or planned_ids[-1] > committed else None
    if committed is not None and committed not in planned_ids:
        raise LagError(f"checkpoint {location} is inconsistent: batch {committed} is in the commit log and not in "
                       "the offsets log")

    entries = {batch: parse_offset_log_entry(files.read("offsets", batch), f"{location}/offsets/{batch}")
               for batch in {committed, planned} if batch is not None}
    processed: dict[str, Offsets] = {}
    planned_offsets: dict[str, Offsets] = {}
    other: set[str] = set()
    for batch, entry in entries.items():
        for source, value in entry.items():
            offsets = kafka_offsets(value)
            if offsets is None:
                if value is not None:
                    other.add(source)
                continue
            if batch == committed:
                processed[source] = offsets
            else:
                planned_offsets[source] = offsets
                if committed is None:
                    # Nothing is committed yet: what the query has processed is where its first batch starts, which
                    # sparkeos' source keeps in that batch's end offsets (Spark's own source does not).
                    processed[source] = kafka_offsets(value.get(BATCH_START_KEY)) or {}
    for source in planned_offsets:
        processed.setdefault(source, {})
    return CheckpointOffsets(location, committed, planned, processed, planned_offsets,
                             len(other - set(processed)))


# --- the cluster --------------------------------------------------------------------------------------------


class LagCluster(KafkaCluster):
    def committed_offsets(self, group: str) -> Offsets:
        """Every offset `group` committed on a topic of the cluster (require_stable: transactional commits still
        pending are waited for). Kafka drops a group's offsets of a deleted topic."""
        partitions = [(topic, partition) for topic, count in self.topics().items()
                      if topic not in KAFKA_INTERNAL_TOPICS for partition in range(count)]
        return self.group_offsets(group, partitions)


# --- the report ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PartitionLag:
    source: str | None  # the query's source, in checkpoint mode
    topic: str
    partition: int
    processed: int | None  # None: the query or group has no offset for the partition
    planned: int | None
    latest: int
    lag: int


@dataclass
class Report:
    subject: dict[str, Any]  # {"checkpoint", "committed_batch", "planned_batch"} or {"group"}
    partitions: list[PartitionLag]
    missing_topics: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    other_sources: int = 0
    taken_at: float = field(default_factory=time.time)

    @property
    def total_lag(self) -> int:
        return sum(row.lag for row in self.partitions)

    @property
    def checkpoint_mode(self) -> bool:
        return "checkpoint" in self.subject

    def to_json(self) -> dict[str, Any]:
        rows = []
        for row in self.partitions:
            entry: dict[str, Any] = {"topic": row.topic, "partition": row.partition, "processed": row.processed}
            if self.checkpoint_mode:
                entry = {"source": row.source, **entry, "planned": row.planned}
            rows.append({**entry, "latest": row.latest, "lag": row.lag})
        stamp = datetime.fromtimestamp(self.taken_at, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
        return {"time": stamp, **self.subject, "partitions": rows, "total_lag": self.total_lag,
                "missing_topics": self.missing_topics}

    def title(self) -> str:
        if not self.checkpoint_mode:
            return f"group {self.subject['group']}"
        committed, planned = self.subject["committed_batch"], self.subject["planned_batch"]
        state = [f"batch {committed} committed" if committed is not None else "no batch committed yet"]
        if planned is not None:
            state.append(f"batch {planned} planned, not committed")
        if self.other_sources:
            state.append(f"{self.other_sources} source(s) other than Kafka left out")
        return f"checkpoint {self.subject['checkpoint']}: {', '.join(state)}"

    def to_text(self, timestamp: bool = False) -> str:
        columns = ["TOPIC", "PARTITION", "PROCESSED", "LATEST", "LAG"]
        if self.checkpoint_mode and self.subject["planned_batch"] is not None:
            columns.insert(3, "PLANNED")
        if self.checkpoint_mode and len({row.source for row in self.partitions}) > 1:
            columns.insert(0, "SOURCE")
        table = [columns]
        for row in self.partitions:
            cells = {"SOURCE": row.source, "TOPIC": row.topic, "PARTITION": row.partition,
                     "PROCESSED": row.processed, "PLANNED": row.planned, "LATEST": row.latest, "LAG": row.lag}
            table.append([VOID_OFFSET if cells[name] is None else str(cells[name]) for name in columns])
        table.append(["TOTAL", *[""] * (len(columns) - 2), str(self.total_lag)])
        widths = [max(len(line[i]) for line in table) for i in range(len(columns))]
        left = {"SOURCE", "TOPIC"}
        lines = []
        for line in table:
            cells = [cell.ljust(width) if name in left else cell.rjust(width)
                     for cell, width, name in zip(line, widths, columns, strict=True)]
            lines.append("  ".join(cells).rstrip())
        title = self.title()
        if timestamp:
            title = f"{datetime.fromtimestamp(self.taken_at).astimezone().strftime('%Y-%m-%d %H:%M:%S %z')}  {title}"
        return "\n".join([title, *lines])


def _rows(cluster: LagCluster, wanted: dict[str | None, tuple[Offsets, Offsets]]) -> tuple[list[PartitionLag],
                                                                                            list[str], list[str]]:
    """The rows of sources (or of a group, source None): for each, its processed and planned offsets. Every
    partition the cluster has of a topic named there gets a row."""
    counts = cluster.topics()
    missing: set[str] = set()
    warnings: list[str] = []
    keys: list[tuple[str | None, str, int]] = []
    for source, (processed, planned) in wanted.items():
        known = set(processed) | set(planned)
        for topic in sorted({topic for topic, _ in known}):
            if topic not in counts:
                missing.add(topic)
                continue
            gone = sorted(p for t, p in known if t == topic and p >= counts[topic])
            if gone:
                warnings.append(f"topic {topic!r} has {counts[topic]} partitions now; partitions "
                                f"{', '.join(map(str, gone))} no longer exist (was the topic deleted and made again?)")
            keys.extend((source, topic, partition) for partition in range(counts[topic]))
    for topic in sorted(missing):
        warnings.append(f"topic {topic!r} is not in the cluster's metadata (deleted, or not visible to these "
                        "credentials): its partitions are left out")
    partitions = sorted({(topic, partition) for _, topic, partition in keys})
    latest = cluster.latest(partitions, read_committed=True)
    unprocessed = sorted({(topic, p) for source, topic, p in keys if (topic, p) not in wanted[source][0]})
    earliest = cluster.earliest(unprocessed)
    rows = []
    for source, topic, partition in keys:
        processed, planned = wanted[source]
        done = processed.get((topic, partition))
        end = latest[(topic, partition)]
        # A partition without a processed offset is read from its earliest offset, as Spark's Kafka source reads a
        # partition that appears after the query started.
        lag = max(end - (done if done is not None else earliest[(topic, partition)]), 0)
        rows.append(PartitionLag(source, topic, partition, done, planned.get((topic, partition)), end, lag))
    return rows, sorted(missing), warnings


def _check_some_topic_exists(rows: list[PartitionLag], missing: list[str]) -> None:
    if not rows and missing:
        names = ", ".join(repr(topic) for topic in missing)
        raise LagError(f"none of the topics {names} is in the cluster's metadata (deleted, or not visible to these "
                       "credentials)")


def checkpoint_report(cluster: LagCluster, location: str) -> Report:
    checkpoint = read_checkpoint(location)
    if not checkpoint.sources:
        raise LagError(f"checkpoint {location} holds no Kafka source offsets ({checkpoint.other_sources} other "
                       "source(s))")
    wanted = {source: (checkpoint.processed.get(source, {}), checkpoint.planned.get(source, {}))
              for source in checkpoint.sources}
    rows, missing, warnings = _rows(cluster, wanted)
    _check_some_topic_exists(rows, missing)
    subject = {"checkpoint": location, "committed_batch": checkpoint.committed_batch,
               "planned_batch": checkpoint.planned_batch}
    return Report(subject, rows, missing, warnings, checkpoint.other_sources)


def group_report(cluster: LagCluster, group: str) -> Report:
    committed = cluster.committed_offsets(group)
    if not committed:
        raise LagError(f"group {group!r} has no committed offsets (there is no such group, or it never committed)")
    rows, missing, warnings = _rows(cluster, {None: (committed, {})})
    _check_some_topic_exists(rows, missing)
    return Report({"group": group}, rows, missing, warnings)


# --- the command --------------------------------------------------------------------------------------------


def _emit(report: Report, as_json: bool, watching: bool) -> None:
    for warning in report.warnings:
        print(f"sparkeos lag: warning: {warning}", file=sys.stderr, flush=True)
    if as_json:
        print(json.dumps(report.to_json()), flush=True)
    else:
        print(report.to_text(timestamp=watching) + ("\n" if watching else ""), flush=True)


def run(args: argparse.Namespace) -> int:
    try:
        if args.watch is not None and not args.watch > 0:
            raise LagUsageError(f"--watch must be more than 0 seconds, got {args.watch}")
        if not args.timeout > 0:
            raise LagUsageError(f"--timeout must be more than 0 seconds, got {args.timeout}")
        config = client_config(args.bootstrap_servers, args.command_config, args.properties)
        if args.checkpoint is not None:
            CheckpointFiles(args.checkpoint).check()
    except ClientSettingsError as exc:
        print(f"sparkeos lag: {exc}", file=sys.stderr)
        return 2
    except LagError as exc:
        print(f"sparkeos lag: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, LagUsageError) else 1
    cluster = LagCluster(config, args.timeout)

    def report() -> Report:
        try:
            if args.checkpoint is not None:
                return checkpoint_report(cluster, args.checkpoint)
            return group_report(cluster, args.group)
        except KafkaException as exc:
            raise LagError(str(exc.args[0]) if exc.args else str(exc)) from None
        except LagError:
            raise
        except RuntimeError as exc:  # the cluster's: KafkaUnavailable and failed requests
            raise LagError(str(exc)) from None

    try:
        if args.watch is None:
            try:
                _emit(report(), args.json, watching=False)
            except LagError as exc:
                print(f"sparkeos lag: {exc}", file=sys.stderr)
                return 2 if isinstance(exc, LagUsageError) else 1
            return 0
        while True:
            started = time.monotonic()
            try:
                _emit(report(), args.json, watching=True)
            except LagUsageError as exc:
                print(f"sparkeos lag: {exc}", file=sys.stderr)
                return 2
            except LagError as exc:  # a query not started yet, a broker restarting: the next look may do
                print(f"sparkeos lag: {datetime.now().astimezone():%Y-%m-%d %H:%M:%S %z}: {exc}", file=sys.stderr,
                      flush=True)
            time.sleep(max(args.watch - (time.monotonic() - started), 0))
    except KeyboardInterrupt:
        return 0 if args.watch is not None else 130
    except SystemError as exc:
        # Ctrl-C inside a call of confluent-kafka's C code comes out as a SystemError caused by the interrupt.
        if not isinstance(exc.__cause__, KeyboardInterrupt):
            raise
        return 0 if args.watch is not None else 130
    except BrokenPipeError:  # piped into `head`, say: Python's flush of stdout at exit must not fail again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
