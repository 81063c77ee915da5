"""Prometheus metrics of running queries: what `sparkeos run --metrics-port` serves on /metrics, and what
`start_exporter` serves from a script of one's own.

The numbers come from events that Spark's processes write as JSON lines into one directory
(`sparkeos.spark.metric_events`): each sink's commit and abort of a batch, and each batch's progress, which the
driver writes (a `StreamingQueryListener` from `watch`, or `sparkeos run`'s driver polling its query). The
exporter reads what was appended, so it can live in another process than the driver, as `sparkeos run` has it: its
counters then outlive a driver restart. Lag is Spark's
own: the source reports the partitions' ends it saw when it planned a batch (the progress's latestOffset), and
the lag of a partition is that end less the batch's end offset.

Metrics:

- ``sparkeos_input_records_total``: records the query read: the offsets its batches advanced through.
- ``sparkeos_output_records_total{sink}``: records sinks made visible (committed), dead letters apart.
- ``sparkeos_dead_letter_records_total``: records written to the dead-letter topic.
- ``sparkeos_batch_duration_seconds``: histogram of micro-batch durations.
- ``sparkeos_batches_total``: micro-batches that reported progress.
- ``sparkeos_source_lag_records{topic,partition}``: records in Kafka not yet read, as of the last batch.
- ``sparkeos_sink_transactions_total{sink,outcome}``: outcome ``committed``; ``skipped-replay`` (a replayed
  batch that had committed before wrote nothing); ``aborted`` (pre-committed transactions the driver aborted).
- ``sparkeos_sink_commit_seconds{sink}``: histogram of commit durations (a Kafka transaction's commit in its
  task; a two-phase-commit sink's decision and commit on the driver).
- ``sparkeos_sink_visible_latency_seconds{sink}``: histogram of produce-to-visible latencies, one observation per
  record written with a ``timestamp`` column: from that timestamp to the return of the commit that made the
  record visible (`sparkeos.spark.visible_latency`).
- ``sparkeos_restarts_total``: driver restarts by `sparkeos run`'s restart strategy.
- ``sparkeos_last_batch_timestamp_seconds``: when the last micro-batch started (Unix time).
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import threading
from datetime import datetime
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.registry import Collector

from .spark.kafka.source.offsets import BATCH_START_KEY, RESERVED_KEY_PREFIX
from .spark.metric_events import METRICS_DIR_ENV, QUERY_PROGRESS, SINK_BATCH, emit
from .spark.visible_latency import BUCKETS as VISIBLE_LATENCY_BUCKETS
from .spark.visible_latency import LatencyHistogram

log = logging.getLogger("sparkeos.metrics")

DURATION_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
COMMIT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
POLL_INTERVAL_S = 0.5


class Metrics:
    """The metrics, in a registry of their own."""

    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.input_records = Counter("sparkeos_input_records", "Records the query read from its sources", registry=r)
        self.output_records = Counter("sparkeos_output_records", "Records sinks made visible, dead letters apart",
                                      ["sink"], registry=r)
        self.dead_letter_records = Counter("sparkeos_dead_letter_records",
                                           "Records written to the dead-letter topic", registry=r)
        self.batch_duration = Histogram("sparkeos_batch_duration_seconds", "Micro-batch durations",
                                        buckets=DURATION_BUCKETS, registry=r)
        self.batches = Counter("sparkeos_batches", "Micro-batches that reported progress", registry=r)
        self.source_lag = Gauge("sparkeos_source_lag_records", "Records in Kafka not yet read, as of the last batch",
                                ["topic", "partition"], registry=r)
        self.sink_transactions = Counter("sparkeos_sink_transactions", "Sink transactions by outcome",
                                         ["sink", "outcome"], registry=r)
        self.sink_commit = Histogram("sparkeos_sink_commit_seconds", "Sink commit durations", ["sink"],
                                     buckets=COMMIT_BUCKETS, registry=r)
        self.restarts = Counter("sparkeos_restarts", "Driver restarts by the restart strategy", registry=r)
        self.last_batch = Gauge("sparkeos_last_batch_timestamp_seconds", "When the last micro-batch started",
                                registry=r)
        self.visible_latency = VisibleLatency()
        r.register(self.visible_latency)


class VisibleLatency(Collector):
    """``sparkeos_sink_visible_latency_seconds``: a histogram whose counts arrive already bucketed, a batch's
    records at a time, which prometheus_client's Histogram (one observation per call) cannot take."""

    NAME = "sparkeos_sink_visible_latency_seconds"

    def __init__(self) -> None:
        self._by_sink: dict[str, LatencyHistogram] = {}
        self._lock = threading.Lock()

    def add(self, sink: str, histogram: LatencyHistogram) -> None:
        with self._lock:
            self._by_sink.setdefault(sink, LatencyHistogram()).add(histogram)

    def total(self) -> LatencyHistogram:
        """Every sink's records together."""
        with self._lock:
            total = LatencyHistogram()
            for histogram in self._by_sink.values():
                total.add(histogram)
            return total

    def collect(self):
        family = HistogramMetricFamily(self.NAME, "Seconds from a record's timestamp to the commit that made it "
                                                  "visible", labels=["sink"])
        with self._lock:
            for sink, histogram in sorted(self._by_sink.items()):
                cumulative, buckets = 0, []
                for bound, count in zip((*VISIBLE_LATENCY_BUCKETS, float("inf")), histogram.counts, strict=True):
                    cumulative += count
                    buckets.append(("+Inf" if bound == float("inf") else _bound_label(bound), cumulative))
                family.add_metric([sink], buckets, histogram.sum_seconds)
        yield family


def _bound_label(bound: float) -> str:
    # Prometheus's client libraries print bucket bounds as floats ("1.0"), so queries across metrics agree.
    return repr(float(bound))


class MetricsExporter:
    """Reads the events of a metrics directory into `Metrics`, and serves them over HTTP."""

    def __init__(self, directory: Path, dead_letter_topic: str | None = None,
                 registry: CollectorRegistry | None = None):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.dead_letter_topic = dead_letter_topic
        self.metrics = Metrics(registry)
        self.port: int | None = None
        self._positions: dict[str, int] = {}
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._server = None
        self._thread: threading.Thread | None = None

    # --- serving ---

    def start(self, port: int | None, address: str = "0.0.0.0") -> MetricsExporter:
        """Read events in the background, and serve /metrics on `port` (0: a free one, then in `self.port`; None:
        not at all, for a caller that only shows the figures)."""
        if port is not None:
            self._server, _thread = start_http_server(port, address, registry=self.metrics.registry)
            self.port = self._server.server_port
        self._thread = threading.Thread(target=self._poll_forever, name="sparkeos-metrics", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(5)
        self.refresh()

    def _poll_forever(self) -> None:
        while not self._stopped.wait(POLL_INTERVAL_S):
            try:
                self.refresh()
            except Exception:  # noqa: BLE001 - the exporter keeps serving what it has
                log.exception("reading metrics events from %s failed", self.directory)

    def count_restart(self) -> None:
        self.metrics.restarts.inc()

    # --- events ---

    def refresh(self) -> int:
        """Read the events appended since the last call; returns how many."""
        with self._lock:
            read = 0
            for path in sorted(self.directory.glob("*.jsonl")):
                kind = path.name.split("-", 1)[0]
                for event in self._new_lines(path):
                    self._apply(kind, event)
                    read += 1
                self._forget_if_done(path)
            return read

    def _new_lines(self, path: Path) -> list[dict[str, Any]]:
        position = self._positions.get(path.name, 0)
        try:
            with open(path, "rb") as file:
                file.seek(position)
                data = file.read()
        except FileNotFoundError:
            return []
        complete = data.rfind(b"\n") + 1  # a line still being written waits for the next read
        self._positions[path.name] = position + complete
        events = []
        for line in data[:complete].splitlines():
            try:
                events.append(json.loads(line))
            except ValueError:
                log.warning("skipping a malformed metrics event in %s", path)
        return events

    def _forget_if_done(self, path: Path) -> None:
        """Delete a file whose writer has exited once it is read to its end, so the directory does not grow."""
        try:
            pid = int(path.stem.rsplit("-", 1)[1])
        except (IndexError, ValueError):
            return
        if _alive(pid) or self._positions.get(path.name, 0) < path.stat().st_size:
            return
        path.unlink(missing_ok=True)
        self._positions.pop(path.name, None)

    def _apply(self, kind: str, event: dict[str, Any]) -> None:
        if kind == SINK_BATCH:
            self._apply_sink_batch(event)
        elif kind == QUERY_PROGRESS:
            self._apply_progress(event)

    def _apply_sink_batch(self, event: dict[str, Any]) -> None:
        m, sink = self.metrics, event.get("sink") or "unknown"
        for outcome, key in (("committed", "committed"), ("skipped-replay", "skipped"), ("aborted", "aborted")):
            if event.get(key):
                m.sink_transactions.labels(sink, outcome).inc(event[key])
        by_topic = event.get("records_by_topic") or {}
        dead = by_topic.get(self.dead_letter_topic, 0) if self.dead_letter_topic else 0
        if dead:
            m.dead_letter_records.inc(dead)
        records = int(event.get("records") or 0) - dead
        if records > 0:
            m.output_records.labels(sink).inc(records)
        for seconds in event.get("commit_seconds") or []:
            m.sink_commit.labels(sink).observe(seconds)
        latency = LatencyHistogram.from_event(event.get("visible_latency"))
        if latency is not None:
            m.visible_latency.add(sink, latency)

    def _apply_progress(self, progress: dict[str, Any]) -> None:
        m = self.metrics
        m.batches.inc()
        m.input_records.inc(_records_read(progress))
        duration_ms = (progress.get("durationMs") or {}).get("triggerExecution")
        if duration_ms is not None:
            m.batch_duration.observe(duration_ms / 1000)
        started = progress.get("timestamp")
        if started:
            m.last_batch.set(datetime.fromisoformat(started.replace("Z", "+00:00")).timestamp())
        for source in progress.get("sources") or []:
            end, latest = _offsets(source.get("endOffset")), _offsets(source.get("latestOffset"))
            for (topic, partition), offset in latest.items():
                if (topic, partition) in end:
                    m.source_lag.labels(topic, str(partition)).set(max(offset - end[(topic, partition)], 0))


def _records_read(progress: dict[str, Any]) -> int:
    """The offsets a batch advanced through, over its Kafka sources; Spark's numInputRows for other sources.
    Not numInputRows for Kafka: Spark counts a source as often as the plan reads it (a job's dead-letter branch
    reads its source a second time)."""
    total = 0
    for source in progress.get("sources") or []:
        end = _offsets(source.get("endOffset"))
        if not end:
            total += max(int(source.get("numInputRows") or 0), 0)
            continue
        start = _offsets(source.get("startOffset")) or _offsets(_batch_start(source.get("endOffset")))
        total += sum(max(offset - start[p], 0) for p, offset in end.items() if p in start)
    return total


def _batch_start(end: Any) -> Any:
    """The start of a batch, which the source keeps inside the batch's end offsets."""
    if isinstance(end, str):
        try:
            end = json.loads(end)
        except ValueError:
            return None
    return end.get(BATCH_START_KEY) if isinstance(end, dict) else None


def _offsets(value: Any) -> dict[tuple[str, int], int]:
    """Kafka offsets as Spark's progress shows them ({"topic": {"0": 42}}, or that as a JSON string)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return {}
    if not isinstance(value, dict):
        return {}
    found = {}
    for topic, partitions in value.items():
        if topic.startswith(RESERVED_KEY_PREFIX) or not isinstance(partitions, dict):
            continue
        for partition, offset in partitions.items():
            if str(partition).lstrip("-").isdigit() and isinstance(offset, int):
                found[(topic, int(partition))] = offset
    return found


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def progress_listener():
    """A StreamingQueryListener that writes each batch's progress as an event of the metrics directory."""
    from pyspark.sql.streaming import StreamingQueryListener

    class ProgressEvents(StreamingQueryListener):
        def onQueryStarted(self, event) -> None:  # noqa: N802 - Spark's names
            pass

        def onQueryProgress(self, event) -> None:  # noqa: N802
            emit(QUERY_PROGRESS, json.loads(event.progress.json))

        def onQueryIdle(self, event) -> None:  # noqa: N802
            pass

        def onQueryTerminated(self, event) -> None:  # noqa: N802
            pass

    return ProgressEvents()


def metrics_directory() -> Path:
    """The metrics directory of this process (SPARKEOS_METRICS_DIR), made and set if missing. Spark's processes
    inherit it only from a driver that had it set before its session started."""
    value = os.environ.get(METRICS_DIR_ENV)
    if not value:
        value = tempfile.mkdtemp(prefix="sparkeos-metrics-")
        os.environ[METRICS_DIR_ENV] = value
    return Path(value)


def start_exporter(port: int, spark=None, *, address: str = "0.0.0.0",
                   dead_letter_topic: str | None = None) -> MetricsExporter:
    """Serve the metrics of this process's queries on http://<address>:<port>/metrics.

    Call it before the Spark session starts, so that Spark's processes inherit the metrics directory (sink
    metrics come from them); pass the session, or call `watch(spark)` once it exists, for the batches' progress
    (input, lag, durations)."""
    exporter = MetricsExporter(metrics_directory(), dead_letter_topic).start(port, address)
    if spark is not None:
        watch(spark)
    return exporter


def watch(spark) -> None:
    """Write the progress of every query of `spark` into the metrics directory."""
    metrics_directory()
    spark.streams.addListener(progress_listener())
