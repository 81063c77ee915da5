"""The metrics exporter: events as Spark's processes write them, read from the directory and served on /metrics,
scraped over HTTP and parsed with prometheus_client's own parser."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.request
from datetime import UTC, datetime
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from sparkeos.metrics import MetricsExporter
from sparkeos.spark import metric_events
from sparkeos.spark.metric_events import METRICS_DIR_ENV, QUERY_PROGRESS
from sparkeos.spark.visible_latency import LatencyHistogram


def scrape(port: int) -> dict[tuple[str, tuple], float]:
    """Every sample served on /metrics: (name, sorted labels) -> value."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def progress(batch: int, rows: int, end: dict, latest: dict, duration_ms: int = 1500, start=None) -> dict:
    """A batch's progress as Spark's StreamingQueryProgress.json has it (the fields the exporter reads)."""
    return {"id": "q", "runId": "r", "batchId": batch, "timestamp": "2026-11-26T10:00:00.000Z",
            "numInputRows": rows, "durationMs": {"triggerExecution": duration_ms},
            "sources": [{"description": "sparkeos.kafka", "startOffset": start, "endOffset": json.dumps(end),
                         "latestOffset": latest, "numInputRows": rows * 2}],
            "sink": {"description": "sparkeos.kafka", "numOutputRows": -1}}


@pytest.fixture
def exporter(tmp_path, monkeypatch):
    monkeypatch.setenv(METRICS_DIR_ENV, str(tmp_path / "metrics"))
    running = MetricsExporter(tmp_path / "metrics", dead_letter_topic="dead").start(0, "127.0.0.1")
    yield running
    running.stop()


def test_sink_and_progress_events_become_metrics(exporter):
    metric_events.sink_batch("sparkeos.kafka", "q", 0, "committed", committed=2, records=30,
                             records_by_topic={"out": 25, "dead": 5}, commit_seconds=[0.004, 0.2])
    metric_events.sink_batch("sparkeos.kafka", "q", 1, "committed", skipped=2)
    metric_events.sink_batch("sparkeos.postgres", "q2", 0, "aborted", aborted=3)
    # Batch 0's start rides in its end offsets; Spark's numInputRows (here twice the records) is not used.
    metric_events.emit(QUERY_PROGRESS, progress(0, 30, {"in": {"0": 10, "1": 20},
                                                        "sparkeos:batchStart": {"in": {"0": 0, "1": 0}}},
                                                {"in": {"0": 15, "1": 20}}))
    metric_events.emit(QUERY_PROGRESS, progress(1, 5, {"in": {"0": 15, "1": 20}}, {"in": {"0": 17, "1": 25}},
                                                start={"in": {"0": 10, "1": 20}}))
    assert exporter.refresh() == 5
    samples = scrape(exporter.port)
    assert samples[("sparkeos_output_records_total", (("sink", "sparkeos.kafka"),))] == 25
    assert samples[("sparkeos_dead_letter_records_total", ())] == 5
    assert samples[("sparkeos_sink_transactions_total", (("outcome", "committed"), ("sink", "sparkeos.kafka")))] == 2
    assert samples[("sparkeos_sink_transactions_total",
                    (("outcome", "skipped-replay"), ("sink", "sparkeos.kafka")))] == 2
    assert samples[("sparkeos_sink_transactions_total", (("outcome", "aborted"), ("sink", "sparkeos.postgres")))] == 3
    assert samples[("sparkeos_sink_commit_seconds_count", (("sink", "sparkeos.kafka"),))] == 2
    assert samples[("sparkeos_sink_commit_seconds_bucket", (("le", "0.005"), ("sink", "sparkeos.kafka")))] == 1
    assert samples[("sparkeos_input_records_total", ())] == 35
    assert samples[("sparkeos_batches_total", ())] == 2
    assert samples[("sparkeos_batch_duration_seconds_sum", ())] == 3.0
    # The lag as of the last batch: its latest offsets less its end offsets.
    assert samples[("sparkeos_source_lag_records", (("partition", "0"), ("topic", "in")))] == 2
    assert samples[("sparkeos_source_lag_records", (("partition", "1"), ("topic", "in")))] == 5
    assert samples[("sparkeos_last_batch_timestamp_seconds", ())] == datetime(2026, 11, 26, 10, tzinfo=UTC).timestamp()
    assert exporter.refresh() == 0, "events were read twice"


def test_events_of_other_processes_are_read_once_and_their_files_removed(exporter, tmp_path):
    directory = tmp_path / "metrics"
    writer = ("from sparkeos.spark import metric_events\n"
              "for batch in range(100):\n"
              "    metric_events.sink_batch('sparkeos.files', 'q', batch, 'committed', committed=1, records=7)\n")
    for _ in range(3):
        subprocess.run([sys.executable, "-c", writer], check=True, env={**os.environ, METRICS_DIR_ENV: str(directory)})
    # A line still being written waits: only whole lines are events.
    partial = directory / f"sink-{os.getpid()}.jsonl"
    partial.write_text('{"sink": "sparkeos.files", "records": 1000')
    assert exporter.refresh() == 300
    assert scrape(exporter.port)[("sparkeos_output_records_total", (("sink", "sparkeos.files"),))] == 2100
    # The writers have exited and were read to the end; this process's file is still being written.
    assert sorted(p.name for p in directory.iterdir()) == [partial.name]
    with open(partial, "a") as file:
        file.write(', "committed": 1}\n')
    assert exporter.refresh() == 1
    assert scrape(exporter.port)[("sparkeos_output_records_total", (("sink", "sparkeos.files"),))] == 3100


def test_without_the_directory_variable_nothing_is_written(tmp_path, monkeypatch):
    monkeypatch.delenv(METRICS_DIR_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    metric_events.sink_batch("sparkeos.kafka", "q", 0, "committed", committed=1, records=1)
    assert list(tmp_path.iterdir()) == []


def test_the_grafana_dashboard_uses_only_metrics_the_exporter_serves(exporter):
    # Labelled families serve samples once a label set exists.
    exporter.metrics.output_records.labels("sparkeos.kafka")
    exporter.metrics.source_lag.labels("t", "0")
    exporter.metrics.sink_transactions.labels("sparkeos.kafka", "committed")
    exporter.metrics.sink_commit.labels("sparkeos.kafka")
    exporter.metrics.visible_latency.add("sparkeos.kafka", LatencyHistogram())
    served = {name for name, _labels in scrape(exporter.port)}
    dashboard = json.loads((Path(__file__).parents[1] / "docs" / "grafana-dashboard.json").read_text())
    expressions = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    used = {name for expression in expressions for name in re.findall(r"\bsparkeos_[a-z_]+", expression)}
    assert used and used <= served, f"the dashboard names metrics that are not served: {sorted(used - served)}"
