"""The produce-to-visible latency the sinks see (`sparkeos.spark.visible_latency`): records' timestamps tallied in a
task, turned into histogram counts at the commit that made them visible, and served as
``sparkeos_sink_visible_latency_seconds``. The Kafka sink's figures under a running job are checked against
records stamped in the past in tests/jobs/test_run_metrics.py."""

from __future__ import annotations

import math
import time
import urllib.request
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from prometheus_client.parser import text_string_to_metric_families

from sparkeos.metrics import MetricsExporter
from sparkeos.spark.files.options import parse_file_sink_options
from sparkeos.spark.files.sink import FileSink
from sparkeos.spark.metric_events import METRICS_DIR_ENV
from sparkeos.spark.two_phase_commit import TaskAttempt, TwoPhaseCommitStreamWriter, write_task
from sparkeos.spark.visible_latency import BUCKETS, MAX_KEYS, LatencyHistogram, TimestampTally

NAME = "sparkeos_sink_visible_latency_seconds"


def stamped(ages_s: list[float | None], now: float, unit: str = "us", tz: str | None = "UTC",
            name: str = "timestamp") -> pa.RecordBatch:
    scale = {"s": 1, "ms": 1e3, "us": 1e6, "ns": 1e9}[unit]
    values = [None if age is None else int((now - age) * scale) for age in ages_s]
    return pa.RecordBatch.from_arrays([pa.array(values, pa.timestamp(unit, tz)),
                                       pa.array([f"v{i}" for i in range(len(ages_s))])], names=[name, "value"])


def bucket_of(seconds: float) -> int:
    """The index of the bucket a latency falls in: the first bound at or above it (Prometheus's `le`)."""
    return next((i for i, bound in enumerate(BUCKETS) if seconds <= bound), len(BUCKETS))


@pytest.mark.parametrize("unit", ["s", "ms", "us", "ns"])
@pytest.mark.parametrize("tz", ["UTC", "Europe/Paris", None])
def test_each_record_lands_in_the_bucket_of_its_age_whatever_the_timestamps_unit(unit: str, tz: str | None) -> None:
    now = float(int(time.time()))  # whole seconds: exact in every unit
    ages = [0.004, 0.06, 0.3, 0.3, 1.2, 20.0, 4000.0, -5.0, None]
    tally = TimestampTally()
    tally.add(stamped(ages, now, unit, tz))
    histogram = tally.latencies(now)
    assert histogram is not None
    expected = [0] * (len(BUCKETS) + 1)
    for age in ages:
        if age is not None:
            # Whole seconds stamp a record up to a second early; a timestamp after the commit counts as 0.
            age = max(age if unit != "s" else float(math.ceil(age)), 0.0)
            expected[bucket_of(age)] += 1
    assert histogram.counts == expected
    assert histogram.records == 8
    assert histogram.sum_seconds == pytest.approx(sum(max(a, 0) for a in ages if a is not None),
                                                  abs=8.0 if unit == "s" else 0.01)


def test_batches_without_a_timestamp_column_add_nothing() -> None:
    now = time.time()
    tally = TimestampTally()
    tally.add(stamped([1.0, 2.0], now, name="event_time"))
    strings = pa.RecordBatch.from_arrays([pa.array(["2026-11-27 00:00:00"])], names=["timestamp"])
    tally.add(strings)
    tally.add(stamped([None, None], now))
    assert tally.records == 0
    assert tally.latencies(now) is None
    tally.add(stamped([1.0], now, name="Timestamp"))  # Spark's column names ignore case
    assert tally.records == 1


def test_a_tally_of_many_distinct_timestamps_coarsens_and_keeps_every_record() -> None:
    now = float(int(time.time()))
    ages = [i / 1000 for i in range(3 * MAX_KEYS)]  # one record per millisecond, 12 s of them
    tally = TimestampTally()
    for start in range(0, len(ages), 1000):
        tally.add(stamped(ages[start:start + 1000], now, "ms"))
    assert len(tally.counts) <= MAX_KEYS and tally.resolution_ms == 10
    histogram = tally.latencies(now)
    assert histogram.records == len(ages)
    exact = [0] * (len(BUCKETS) + 1)
    for age in ages:
        exact[bucket_of(age)] += 1
    # Coarser slots move a record by at most the resolution: only records that near a bound may change bucket.
    near_a_bound = sum(1 for age in ages if any(abs(age - bound) <= 0.01 for bound in BUCKETS))
    assert sum(abs(a - b) for a, b in zip(histogram.counts, exact, strict=True)) <= 2 * near_a_bound
    assert histogram.sum_seconds == pytest.approx(sum(ages), rel=0.01)


def test_histograms_travel_in_events_and_refuse_other_buckets() -> None:
    histogram = LatencyHistogram([1] * (len(BUCKETS) + 1), 2.5)
    assert LatencyHistogram.from_event(histogram.to_event()) == histogram
    assert LatencyHistogram.from_event({"counts": [1, 2], "sum": 1.0}) is None
    assert LatencyHistogram.from_event(None) is None


def counts_at(**by_bound: int) -> list[int]:
    """Histogram counts with `by_bound` records in the bucket of each named upper bound ("inf" for +Inf)."""
    counts = [0] * (len(BUCKETS) + 1)
    for name, count in by_bound.items():
        counts[len(BUCKETS) if name == "inf" else BUCKETS.index(float(name.lstrip("b").replace("_", ".")))] = count
    return counts


def test_quantiles_are_estimated_as_prometheus_histogram_quantile_does() -> None:
    # 100 records: 50 in (0.2, 0.3], 40 in (0.3, 0.4], 10 in (1, 1.5].
    histogram = LatencyHistogram(counts_at(b0_3=50, b0_4=40, b1_5=10), 40.0)
    assert histogram.quantile(0.5) == pytest.approx(0.3)
    assert histogram.quantile(0.7) == pytest.approx(0.35)
    assert histogram.quantile(0.99) == pytest.approx(1.45)
    assert histogram.quantile(0) == pytest.approx(0.2)
    # Ranks in +Inf are reported at the highest finite bound, as Prometheus does.
    assert LatencyHistogram(counts_at(b0_01=1, inf=99), 1e6).quantile(0.99) == BUCKETS[-1]
    assert LatencyHistogram().quantile(0.99) is None
    with pytest.raises(ValueError, match="between 0 and 1"):
        histogram.quantile(99)


def test_since_keeps_only_the_records_added_after_a_copy() -> None:
    before = LatencyHistogram(counts_at(b5=10), 45.0)
    now = LatencyHistogram(list(before.counts), before.sum_seconds).add(LatencyHistogram(counts_at(b0_1=3), 0.25))
    recent = now.since(before)
    assert recent.counts == counts_at(b0_1=3) and recent.sum_seconds == pytest.approx(0.25)
    assert recent.quantile(0.99) <= 0.1 < now.quantile(0.99)


def scrape(port: int) -> dict[tuple[str, tuple], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def test_a_two_phase_commit_sink_reports_its_records_latency_at_the_decisions_commit(tmp_path: Path,
                                                                                     monkeypatch) -> None:
    """The real file sink: two tasks pre-commit rows stamped 2 s and 40 s ago; the driver's commit publishes them
    and reports each record once, measured at the commit; a replay of the batch reports none."""
    monkeypatch.setenv(METRICS_DIR_ENV, str(tmp_path / "metrics"))
    exporter = MetricsExporter(tmp_path / "metrics").start(0, "127.0.0.1")
    try:
        sink = FileSink(parse_file_sink_options({"path": str(tmp_path / "out")}))
        sink.prepare()
        writer = TwoPhaseCommitStreamWriter(sink)
        query = "latency-query"

        def run_tasks(attempt: str) -> list:
            now = time.time()
            return [write_task(sink, TaskAttempt(query, 0, 0, f"{attempt}0"), iter([stamped([2.0] * 30, now)])),
                    write_task(sink, TaskAttempt(query, 0, 1, f"{attempt}1"), iter([stamped([40.0] * 20, now)]))]

        writer.commit(run_tasks("a"), 0)
        writer.commit(run_tasks("b"), 0)  # Spark replays the batch: it was decided before, so nothing new shows
        exporter.refresh()
        samples = scrape(exporter.port)
    finally:
        exporter.stop()
    label = (("sink", "sparkeos.files"),)
    assert pq.read_table(tmp_path / "out").num_rows == 50
    assert samples[(f"{NAME}_count", label)] == 50
    assert samples[(f"{NAME}_bucket", (("le", "1.5"), *label))] == 0
    assert samples[(f"{NAME}_bucket", (("le", "3.0"), *label))] == 30
    assert samples[(f"{NAME}_bucket", (("le", "30.0"), *label))] == 30
    assert samples[(f"{NAME}_bucket", (("le", "60.0"), *label))] == 50
    assert 30 * 2.0 + 20 * 40.0 <= samples[(f"{NAME}_sum", label)] <= 30 * 3.0 + 20 * 41.0
