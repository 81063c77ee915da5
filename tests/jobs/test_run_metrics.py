"""`sparkeos run --metrics-port`: a running job's /metrics, scraped over HTTP and parsed with prometheus_client's
parser, against what independent read_committed readers count; and its console's plain lines."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.request
from collections import Counter

import pytest
import yaml
from confluent_kafka import Producer
from prometheus_client.parser import text_string_to_metric_families

from sparkeos.ports import free_port
from sparkeos.spark.kafka.options import DEFAULT_MARKER_TOPIC
from sparkeos.verify import count_records, read_records
from support.spark import create_topic, produce, unique, wait_for

BAD = ["{broken json", "{also broken"]
STAMPED_AGO_S = 1200


def scrape(port: int) -> Counter:
    """name -> the sum of its samples over all labels but a histogram's `le` (empty when nothing answers yet);
    a histogram's buckets as name:le."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
            text = answer.read().decode()
    except OSError:
        return Counter()
    totals: Counter = Counter()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = f"{sample.name}:{sample.labels['le']}" if "le" in sample.labels else sample.name
            totals[name] += sample.value
    return totals


def produce_stamped(bootstrap: str, topic: str, values: list[str], timestamp_ms: int) -> None:
    """Records whose Kafka timestamp (CreateTime) is `timestamp_ms`, as a producer that stamped them then would."""
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for value in values:
        producer.produce(topic, value=value.encode(), timestamp=timestamp_ms)
    assert producer.flush(30) == 0


def people(first: int, count: int) -> list[str]:
    return [json.dumps({"id": i, "name": f"n{i}"}) for i in range(first, first + count)]


@pytest.mark.apache_kafka(newest_only=True)
@pytest.mark.timeout(400)
def test_a_running_job_serves_metrics_that_match_what_readers_count(broker, tmp_path):
    bootstrap = broker.bootstrap_servers
    source = create_topic(bootstrap, unique("in"), 3)
    sink, dead = create_topic(bootstrap, unique("out")), create_topic(bootstrap, unique("dlq"))
    # Stamped 20 minutes ago: the sink's produce-to-visible latency must count from the records' timestamps.
    produce_stamped(bootstrap, source, people(0, 300) + BAD, int((time.time() - STAMPED_AGO_S) * 1000))
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump({
        "name": "metrics-probe",
        "source": {"kafka.bootstrap.servers": bootstrap, "subscribe": source, "startingOffsets": "earliest",
                   "maxOffsetsPerTrigger": 150},
        "format": {"type": "json", "schema": "id INT, name STRING"},
        "output": {"value": "name"},
        "sink": {"topic": sink},
        "checkpoint": str(tmp_path / "checkpoint"),
        "trigger": "1 second",
        "bad_records": {"policy": "dead-letter", "topic": dead},
    }))
    port = free_port()
    log = open(tmp_path / "run.log", "w")  # noqa: SIM115 - the child writes it
    run = subprocess.Popen([sys.executable, "-m", "sparkeos", "run", str(job), "--master", "local[2]",
                            "--metrics-port", str(port)], stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: scrape(port)["sparkeos_batches_total"] >= 1 or run.poll() is not None, timeout_s=120,
                 what="the job's first batch")
        assert run.poll() is None, (tmp_path / "run.log").read_text()[-3000:]
        # Input arrives faster than 150 records a second: the lag rises, then falls to 0 once the job caught up.
        produce(bootstrap, source, people(300, 3000))
        lags = []
        wait_for(lambda: lags.append(scrape(port)["sparkeos_source_lag_records"]) or lags[-1] > 0, timeout_s=60,
                 interval_s=0.3, what="a lag above 0 while input arrives faster than the trigger admits")
        seen = []
        wait_for(lambda: seen.append(scrape(port)) or (seen[-1]["sparkeos_input_records_total"] == 3302
                                                       and seen[-1]["sparkeos_source_lag_records"] == 0),
                 timeout_s=180, interval_s=0.5, what=f"the job to read all of its input: {seen[-1:]}")
        metrics = wait_for(lambda: (m := scrape(port))["sparkeos_output_records_total"] == 3300 and m,
                           timeout_s=30, what="the output count to reach the input's")
    finally:
        run.terminate()
        run.wait(60)
        log.close()
    output = (tmp_path / "run.log").read_text()
    assert count_records(bootstrap, sink) == metrics["sparkeos_output_records_total"] == 3300
    assert count_records(bootstrap, dead) == metrics["sparkeos_dead_letter_records_total"] == 2
    # Every committed transaction of the query left one marker record, read back under read_committed; the
    # marker topic is the cluster's, so only those keyed "<transactional id>/<query id>/<sink topic>" are ours.
    markers = [json.loads(value) for _p, _o, key, value, _h in read_records(bootstrap, DEFAULT_MARKER_TOPIC)
               if key.decode().endswith(f"/{sink}")]
    ours = [m for m in markers if str(m.get("transactional_id", "")).startswith("sparkeos-")
            and m.get("records")]
    assert ours and metrics["sparkeos_sink_transactions_total"] == len(ours)
    assert metrics["sparkeos_batch_duration_seconds_count"] == metrics["sparkeos_batches_total"] > 1
    assert max(lags) > 0
    assert metrics["sparkeos_restarts_total"] == 0
    # One latency per record delivered, dead letters too: those stamped 20 minutes ago between 900 s and an hour,
    # those produced while the job ran under 900 s.
    latency = "sparkeos_sink_visible_latency_seconds"
    assert metrics[f"{latency}_count"] == 3302
    assert metrics[f"{latency}_bucket:900.0"] == 3000
    assert metrics[f"{latency}_bucket:3600.0"] == 3302
    assert 302 * STAMPED_AGO_S <= metrics[f"{latency}_sum"] <= 302 * (STAMPED_AGO_S + 400) + 3000 * 400
    # Not on a terminal: plain lines with the same figures, the last one once the job stopped.
    assert "3,302 records in" in output and "3,300 delivered" in output and "2 dead-lettered" in output, output[-3000:]
    assert re.search(r"visible p99 [\d,.]+ s \(last 60 s\)", output), output[-3000:]
    assert time.time() - metrics["sparkeos_last_batch_timestamp_seconds"] < 120
    assert re.search(r"Spark UI at http://\S+:\d+", output), output[-3000:]
