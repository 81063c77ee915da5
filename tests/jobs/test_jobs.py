"""Job files (`sparkeos run`), bad-record policies, and `sparkeos audit` — which must be able to fail."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import yaml

from sparkeos.jobs.audit import audit
from sparkeos.jobs.pipeline import build
from sparkeos.jobs.runner import start_query
from sparkeos.jobs.spec import JobError, load_job, parse_job
from sparkeos.verify import assert_exactly_once, read_records, read_values
from support.spark import create_topic, produce, unique

SCHEMA = "id INT, name STRING, identifyNumber STRING"


def job(bootstrap: str, input_topic: str, output_topic: str, checkpoint_dir: str, **changes) -> dict:
    document = {
        "name": "people",
        "source": {"kafka.bootstrap.servers": bootstrap, "subscribe": input_topic, "startingOffsets": "earliest"},
        "format": {"type": "json", "schema": SCHEMA},
        "transforms": [{"sql": "SELECT * FROM input WHERE length(identifyNumber) = 18"}],
        "output": {"value": "identifyNumber"},
        "sink": {"topic": output_topic},
        "checkpoint": checkpoint_dir,
    }
    document.update(changes)
    return document


def people(count: int) -> list[str]:
    return [json.dumps({"id": i, "name": f"n{i}", "identifyNumber": f"{i:018d}" if i % 4 else f"{i:017d}"})
            for i in range(count)]


def expected_numbers(count: int) -> Counter:
    return Counter(f"{i:018d}".encode() for i in range(count) if i % 4)


BAD = ["{broken json", b"\xff\xfe\xfd"]


# --- validation ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"sourc": {}}, "sourc: unknown field"),
        ({"source": None}, "source: is required"),
        ({"source": {"kafka.bootstrap.servers": "b"}}, "source: exactly one of 'subscribe'"),
        ({"source": {"kafka.bootstrap.servers": "b", "subscribe": "t", "startingOfsets": "x"}},
         "did you mean 'startingOffsets'"),
        ({"format": {"type": "xml"}}, "format.type: must be one of string, json, avro"),
        ({"format": {"type": "json"}}, "format.schema: is required for type json"),
        ({"format": {"type": "avro", "schema": "missing.avsc", "registry": "http://r"}}, "format.schema: cannot read"),
        ({"format": {"type": "avro", "schema": '{"type": "record"}', "registry": "http://r"}},
         "format.schema: is not a valid Avro schema"),
        ({"format": {"type": "avro", "schema": '{"type": "string"}'}}, "format.registry: is required"),
        ({"format": {"type": "avro", "schema": '{"type": "string"}', "registry": "r:8081"}},
         "format.registry: must be an http(s) URL"),
        ({"format": {"type": "avro", "schema": '{"type": "string"}', "registry": {"url": "http://r", "user": "u"}}},
         "format.registry: unknown schema registry setting 'user'"),
        ({"format": {"type": "avro", "schema": '{"type": "string"}', "registry": {"url": "https://r",
                                                                                 "basic.auth.user.info": "u"}}},
         "format.registry: setting 'basic.auth.user.info' must be user:password"),
        ({"format": {"type": "avro", "schema": '{"type": "string"}',
                     "registry": {"url": "https://r", "basic.auth.user.info": "u:${SPARKEOS_TEST_UNSET_VARIABLE}"}}},
         "format.registry.basic.auth.user.info: names environment variable SPARKEOS_TEST_UNSET_VARIABLE, which is not"),
        ({"format": {"type": "avro", "schema": '{"type": "string"}', "registry": ["http://r"]}},
         "format.registry: must be a URL or a mapping of schema registry client settings"),
        ({"transforms": {"sql": "x"}}, "transforms: must be a list"),
        ({"transforms": [{"sql": "x", "python": "m:f"}]}, "transforms[0]: needs exactly one of sql or python"),
        ({"transforms": [{"python": "not a function"}]}, "transforms[0].python: must be module:function"),
        ({"transforms": [{"lua": "x"}]}, "transforms[0].lua: unknown field"),
        ({"window": {"time": "event"}}, "window.duration: is required"),
        ({"window": {"duration": "soon"}}, "window.duration: must be a duration"),
        ({"window": {"duration": "20 s", "time": "event"}}, "window.watermark: is required for event-time"),
        ({"window": {"duration": "20 s", "watermark": "5 s"}}, "window: watermark and column apply to event-time"),
        ({"window": {"duration": "20 s"}, "trigger": "5 s"}, "trigger: a processing-time window is one micro-batch"),
        ({"sink": {"format": "delta"}},
         "sink.format: must be sparkeos.kafka, sparkeos.files, sparkeos.postgres or one of"),
        ({"sink": {"deliveryGuarantee": "twice", "topic": "t"}}, "sink: option 'deliveryGuarantee' must be one of"),
        ({"sink": {"format": "parquet"}}, "sink.path: is required"),
        ({"sink": {"format": "parquet", "path": "/x", "topic": "t"}}, "topic and deliveryGuarantee apply to Kafka"),
        ({"sink": {}}, "sink: is required"),
        ({"checkpoint": None}, "checkpoint: is required"),
        ({"restart": {"strategy": "exponential"}},
         "restart.strategy: must be one of fixed-delay, failure-rate, exponential-delay, none"),
        ({"restart": {"attempts": -1}}, "restart.attempts: must be at least 0"),
        ({"restart": {"delays": 1}}, "restart.delays: unknown field"),
        ({"restart": {"delay": -1}}, "restart.delay: must not be negative"),
        ({"restart": {"reset-attempts-threshold": "0 s"}}, "restart.reset-attempts-threshold: must be positive"),
        ({"restart": {"initial-backoff": "1 s"}},
         "restart.initial-backoff: applies to the exponential-delay strategy, not fixed-delay"),
        ({"restart": {"strategy": "none", "attempts": 3}}, "restart.attempts: applies to the fixed-delay strategy"),
        ({"restart": {"strategy": "failure-rate", "attempts": 3}}, "restart.attempts: applies to the fixed-delay"),
        ({"restart": {"strategy": "failure-rate", "max-failures-per-interval": 0}},
         "restart.max-failures-per-interval: must be at least 1"),
        ({"restart": {"strategy": "failure-rate", "failure-rate-interval": "often"}},
         "restart.failure-rate-interval: must be a duration"),
        ({"restart": {"strategy": "exponential-delay", "backoff-multiplier": 1}},
         "restart.backoff-multiplier: must be greater than 1"),
        ({"restart": {"strategy": "exponential-delay", "backoff-multiplier": "double"}},
         "restart.backoff-multiplier: must be a number"),
        ({"restart": {"strategy": "exponential-delay", "jitter-factor": 1.5}},
         "restart.jitter-factor: must be between 0 and 1"),
        ({"restart": {"strategy": "exponential-delay", "initial-backoff": "2 min", "max-backoff": "1 min"}},
         "restart.max-backoff: restart.initial-backoff (120 seconds) must not exceed restart.max-backoff"),
        ({"restart": {"strategy": "exponential-delay", "initial-backoff": "2 min"}},
         "restart.initial-backoff: restart.initial-backoff (120 seconds) must not exceed restart.max-backoff (60"),
        ({"restart": {"strategy": "exponential-delay", "attempts-before-reset-backoff": 0}},
         "restart.attempts-before-reset-backoff: must be at least 1"),
        ({"restart": {"strategy": "exponential-delay", "reset-backoff-threshold": "soon"}},
         "restart.reset-backoff-threshold: must be a duration"),
        ({"spark": ["spark.a=1"]}, "spark: must be a mapping of Spark settings"),
        ({"spark": {"sql.shuffle.partitions": 4}}, "spark: 'sql.shuffle.partitions' is not a Spark setting"),
        ({"spark": {"spark.executor.memory": None}}, "spark: spark.executor.memory: must be a single value"),
        ({"spark": {"spark.jars": ["a.jar"]}}, "spark: spark.jars: must be a single value"),
        ({"bad_records": {"policy": "ignore"}}, "bad_records.policy: must be one of fail, skip, dead-letter"),
        ({"bad_records": {"policy": "dead-letter"}}, "bad_records.topic: is required for the dead-letter policy"),
        ({"bad_records": {"policy": "skip", "topic": "dlq"}}, "bad_records.topic: only applies to the dead-letter"),
        ({"bad_records": {"policy": "dead-letter", "topic": "d"}, "sink": {"format": "json", "path": "/x"}},
         "dead-letter needs a sparkeos.kafka sink"),
        ({"kafka": ["security.protocol=SSL"]}, "kafka: must be a mapping of librdkafka settings"),
        ({"kafka": {"kafka.security.protocol": "SSL"}},
         "kafka.kafka.security.protocol: takes librdkafka's names, without 'kafka.': security.protocol"),
        ({"kafka": {"sasl.password": "${SPARKEOS_TEST_UNSET_VARIABLE}"}},
         "kafka.sasl.password: names environment variable SPARKEOS_TEST_UNSET_VARIABLE, which is not set"),
    ],
)
def test_job_file_errors_name_the_field(tmp_path, change, named):
    document = {k: v for k, v in job("127.0.0.1:9092", "in", "out", "/tmp/ck", **change).items() if v is not None}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(document))
    with pytest.raises(JobError) as raised:
        load_job(path)
    assert named in str(raised.value)
    assert str(path) in str(raised.value)


def test_the_kafka_section_reaches_the_source_and_the_sink_under_their_own_settings(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARKEOS_TEST_PASSWORD", "p4ss:w0rd")
    document = job("127.0.0.1:9092", "in", "out", "/tmp/ck", kafka={
        "security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "etl",
        "sasl.password": "${SPARKEOS_TEST_PASSWORD}", "ssl.ca.location": "/etc/ca.pem"})
    document["source"]["kafka.sasl.username"] = "reader"
    document["sink"]["options"] = {"kafka.ssl.ca.location": "/etc/other-ca.pem"}
    spec = parse_job(document)
    security = ("kafka.sasl", "kafka.ssl", "kafka.security")
    assert {k: v for k, v in spec.source.items() if k.startswith(security)} == {
        "kafka.security.protocol": "SASL_SSL", "kafka.sasl.mechanism": "SCRAM-SHA-512",
        "kafka.sasl.username": "reader", "kafka.sasl.password": "p4ss:w0rd", "kafka.ssl.ca.location": "/etc/ca.pem"}
    assert {k: v for k, v in spec.sink.options.items() if k.startswith(security)} == {
        "kafka.security.protocol": "SASL_SSL", "kafka.sasl.mechanism": "SCRAM-SHA-512",
        "kafka.sasl.username": "etl", "kafka.sasl.password": "p4ss:w0rd", "kafka.ssl.ca.location": "/etc/other-ca.pem"}
    # bootstrap.servers there is the source's, and so the sink's, unless they name their own.
    del document["source"]["kafka.bootstrap.servers"]
    document["kafka"]["bootstrap.servers"] = "kafka-1:9093"
    spec = parse_job(document)
    assert spec.bootstrap_servers == spec.sink.options["kafka.bootstrap.servers"] == "kafka-1:9093"


def test_the_registry_takes_confluents_client_settings_with_variables(monkeypatch, tmp_path):
    monkeypatch.setenv("SPARKEOS_TEST_PASSWORD", "p4ss:w0rd")
    schema = '{"type": "string"}'
    ca = tmp_path / "registry-ca.pem"
    ca.write_text("a CA's certificate")
    document = job("127.0.0.1:9092", "in", "out", "/tmp/ck", format={"type": "avro", "schema": schema, "registry": {
        "url": "https://registry:8081/", "basic.auth.user.info": "etl:${SPARKEOS_TEST_PASSWORD}",
        "ssl.ca.location": str(ca)}})
    spec = parse_job(document)
    registry = spec.format.registry
    assert registry is not None and registry.confluent_config() == {
        "url": "https://registry:8081", "basic.auth.user.info": "etl:p4ss:w0rd", "ssl.ca.location": str(ca)}
    assert str(registry) == "https://registry:8081 (as etl)"
    assert "p4ss" not in repr(spec)
    document["format"]["registry"] = "http://registry:8081"
    registry = parse_job(document).format.registry
    assert registry is not None and registry.confluent_config() == {"url": "http://registry:8081"}


def test_job_file_that_is_not_yaml_or_missing(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text("source: [unclosed")
    with pytest.raises(JobError, match="not valid YAML"):
        load_job(path)
    with pytest.raises(JobError, match="no such job file"):
        load_job(tmp_path / "missing.yaml")


def test_avro_schema_file_is_read_relative_to_the_job(tmp_path):
    (tmp_path / "people.avsc").write_text(json.dumps({"type": "record", "name": "P",
                                                      "fields": [{"name": "id", "type": "int"}]}))
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job("b:1", "in", "out", "/ck",
                                       format={"type": "avro", "schema": "people.avsc", "registry": "http://r:1"})))
    assert json.loads(load_job(path).format.schema)["name"] == "P"


# --- running ------------------------------------------------------------------------------------


def run_available_now(spark, spec) -> None:
    query = start_query(spark, spec, build(spark, spec).output, available_now=True)
    query.awaitTermination(180)
    error = query.exception()
    if error is not None:
        raise error


def test_dead_letter_policy_writes_original_bytes_with_headers(spark, broker, tmp_path):
    bootstrap = broker.bootstrap_servers
    source = create_topic(bootstrap, unique("in"), 2)
    sink, dead = create_topic(bootstrap, unique("out")), create_topic(bootstrap, unique("dlq"))
    produce(bootstrap, source, people(200) + BAD)
    spec = parse_job(job(bootstrap, source, sink, str(tmp_path / "ck"), window={"duration": "2 seconds"},
                         bad_records={"policy": "dead-letter", "topic": dead}))
    run_available_now(spark, spec)
    assert_exactly_once(expected_numbers(200), read_values(bootstrap, sink))
    letters = read_records(bootstrap, dead)
    assert sorted(value for _, _, _, value, _ in letters) == sorted(v if isinstance(v, bytes) else v.encode()
                                                                    for v in BAD)
    for _partition, _offset, _key, _value, headers in letters:
        named = dict(headers)
        assert named["sparkeos.source.topic"] == source.encode()
        assert named["sparkeos.error"] in (b"value is not valid JSON", b"value is not valid UTF-8")
        assert int(named["sparkeos.source.offset"]) >= 0
    report = audit(spark, spec, bootstrap, source, sink)
    assert report.exact and report.dead_letter is not None and report.dead_letter.delivered == 2


def test_skip_policy_drops_bad_records_and_fail_policy_stops_the_job(spark, broker, tmp_path):
    bootstrap = broker.bootstrap_servers
    source = create_topic(bootstrap, unique("in"))
    sink = create_topic(bootstrap, unique("out"))
    produce(bootstrap, source, people(100) + BAD)
    skip = parse_job(job(bootstrap, source, sink, str(tmp_path / "skip"), bad_records={"policy": "skip"}))
    run_available_now(spark, skip)
    assert_exactly_once(expected_numbers(100), read_values(bootstrap, sink))
    failing_sink = create_topic(bootstrap, unique("out"))
    fail = parse_job(job(bootstrap, source, failing_sink, str(tmp_path / "fail"), bad_records={"policy": "fail"}))
    with pytest.raises(Exception, match=f"bad record at {source}-0 offset 10[01]: value is not valid"):
        run_available_now(spark, fail)


def test_python_transform_and_string_format(spark, broker, tmp_path):
    bootstrap = broker.bootstrap_servers
    source = create_topic(bootstrap, unique("in"))
    sink = create_topic(bootstrap, unique("out"))
    produce(bootstrap, source, ["alpha", "beta", "gamma"])
    module = tmp_path / "my_transforms.py"
    module.write_text("from pyspark.sql import functions as F\n\n"
                      "def shout(frame):\n    return frame.select(F.upper('value').alias('value'))\n")
    sys.path.insert(0, str(tmp_path))
    try:
        spec = parse_job(job(bootstrap, source, sink, str(tmp_path / "ck"), format={"type": "string"},
                             transforms=[{"python": "my_transforms:shout"}], output={"value": "value || '!'"}))
        run_available_now(spark, spec)
    finally:
        sys.path.remove(str(tmp_path))
    assert sorted(read_values(bootstrap, sink)) == [b"ALPHA!", b"BETA!", b"GAMMA!"]


def input_and_outputs(bootstrap: str) -> tuple[str, str, str]:
    """An input of 40 people, its exact output, and an output with one record missing, one duplicated and one
    unexpected."""
    source = create_topic(bootstrap, unique("in"))
    sink = create_topic(bootstrap, unique("out"))
    produce(bootstrap, source, people(40))
    right = sorted(expected_numbers(40).elements())
    produce(bootstrap, sink, right)
    wrong_sink = create_topic(bootstrap, unique("wrong"))
    produce(bootstrap, wrong_sink, right[1:] + [right[2], b"not-an-id-number"])
    return source, sink, wrong_sink


@pytest.mark.apache_kafka(newest_only=True)
def test_audit_detects_a_duplicate_a_missing_and_an_unexpected_record(spark, broker, tmp_path):
    bootstrap = broker.bootstrap_servers
    source, sink, wrong_sink = input_and_outputs(bootstrap)
    spec = parse_job(job(bootstrap, source, sink, str(tmp_path / "ck")))
    assert audit(spark, spec, bootstrap, source, sink).exact
    report = audit(spark, spec, bootstrap, source, wrong_sink)
    assert (report.output.missing, report.output.duplicated, report.output.unexpected) == (1, 1, 1)
    assert not report.exact
    assert set(report.output.samples) == {"missing", "duplicated", "unexpected"}


def test_the_audit_command_prints_the_counts_exits_1_on_a_mismatch_and_checks_its_master(broker, tmp_path):
    """The command line's audit, in a driver of its own (on one broker: what it reads is the audit's above)."""
    bootstrap = broker.bootstrap_servers
    source, sink, wrong_sink = input_and_outputs(bootstrap)
    job_path = tmp_path / "job.yaml"
    job_path.write_text(yaml.safe_dump(job(bootstrap, source, sink, str(tmp_path / "ck"))))
    command = [sys.executable, "-m", "sparkeos", "audit", str(job_path), "--bootstrap-servers", bootstrap,
               "--input", source, "--output", wrong_sink, "--json", "--master", "local[2]"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=240)
    assert result.returncode == 1, result.stderr[-2000:]
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert (summary["missing"], summary["duplicated"], summary["unexpected"]) == (1, 1, 1)
    refused = subprocess.run([*command[:-1], "local[x]"], capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "is not one of local, local[N]" in refused.stderr, refused.stderr


FAILING_TRANSFORM = """
import pathlib
import time

with open(pathlib.Path(__file__).with_name("imports"), "a") as imports:
    imports.write(f"{time.monotonic()}\\n")
raise ImportError("this transform never loads")
"""


@pytest.mark.parametrize(
    ("restart", "delays"),
    [
        ({"strategy": "fixed-delay", "attempts": 1, "delay": "100 ms"}, [0.1]),
        ({"strategy": "failure-rate", "max-failures-per-interval": 2, "failure-rate-interval": "10 minutes",
          "delay": "100 ms"}, [0.1, 0.1]),
        ({"strategy": "exponential-delay", "initial-backoff": "500 ms", "backoff-multiplier": 3, "jitter-factor": 0,
          "attempts-before-reset-backoff": 2}, [0.5, 1.5]),
    ],
)
def test_run_restarts_a_failing_driver_until_the_strategy_gives_up(tmp_path, restart, delays):
    """A driver that always fails (its Python transform does not import, which it finds before starting Spark) is
    restarted as the strategy says, each restart the strategy's delay after the failure, and then `sparkeos run`
    fails."""
    (tmp_path / "failing_transform.py").write_text(FAILING_TRANSFORM)
    job_path = tmp_path / "job.yaml"
    job_path.write_text(yaml.safe_dump(job("127.0.0.1:9", "in", "out", str(tmp_path / "ck"),
                                           transforms=[{"python": "failing_transform:f"}], restart=restart)))
    status = tmp_path / "status.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run([sys.executable, "-m", "sparkeos", "run", str(job_path), "--master", "local[1]",
                             "--status-file", str(status)], capture_output=True, text=True, timeout=240, env=env)
    assert result.returncode == 1, result.stderr[-3000:]
    restarts = len(delays)
    assert f"allows no more restarts ({restarts} so far)" in result.stderr
    assert json.loads(Path(status).read_text()) | {"driver_pid": None} == {"state": "failed", "restarts": restarts,
                                                                            "driver_pid": None}
    # Every driver said why it failed, through the supervisor's copy of its stderr.
    assert result.stderr.count("transforms[0].python: cannot load failing_transform:f") == restarts + 1
    assert [float(line.split(" in ")[1].split(" s ")[0]) for line in result.stderr.splitlines()
            if "driver exited with 1; restart" in line] == delays
    imports = [float(line) for line in (tmp_path / "imports").read_text().split()]
    assert len(imports) == restarts + 1
    for earlier, later, delay in zip(imports[:-1], imports[1:], delays, strict=True):
        assert later - earlier >= delay, f"driver started again {later - earlier:.2f} s after, not {delay} s"


def test_avro_job_skip_and_fail_policies_on_corrupt_body_unknown_id_and_bad_utf8(spark, tmp_path):
    """The demo's record kinds through a job file: Confluent Avro read via the embedded registry."""
    from sparkeos.demo import PEOPLE_SCHEMA, corrupt_records, produce_people
    from sparkeos.stack import LocalStack

    with LocalStack(tmp_path / "broker", schema_registry=True) as stack:
        bootstrap, registry = stack.bootstrap_servers, stack.schema_registry_url
        create_topic(bootstrap, "people", 2)
        generated = produce_people(bootstrap, registry, 300, seed=7, late_sentinel=False)
        assert generated.corrupt == len(corrupt_records(1)) == 5
        avro = {"type": "avro", "schema": json.dumps(PEOPLE_SCHEMA), "registry": registry}
        sink = create_topic(bootstrap, unique("out"))
        skip = parse_job(job(bootstrap, "people", sink, str(tmp_path / "skip"), format=avro,
                             bad_records={"policy": "skip"}))
        run_available_now(spark, skip)
        delivered = read_values(bootstrap, sink)
        assert len(delivered) == generated.valid and all(len(v) == 18 for v in delivered)
        assert audit(spark, skip, bootstrap, "people", sink).exact
        fail = parse_job(job(bootstrap, "people", create_topic(bootstrap, unique("out")), str(tmp_path / "fail"),
                             format=avro, bad_records={"policy": "fail"}))
        with pytest.raises(Exception, match=r"bad record at people-\d offset \d+: (bad magic byte|unknown schema id"
                                            r"|corrupt Avro body|invalid UTF-8|value of)"):
            run_available_now(spark, fail)


def test_file_sink_job_writes_the_transformed_rows(spark, broker, tmp_path):
    bootstrap = broker.bootstrap_servers
    source = create_topic(bootstrap, unique("in"))
    produce(bootstrap, source, people(60))
    spec = parse_job(job(bootstrap, source, "unused", str(tmp_path / "ck"),
                         sink={"format": "json", "path": str(tmp_path / "out")}, output=None))
    run_available_now(spark, spec)
    written = spark.read.json(str(tmp_path / "out"))
    assert sorted(r["identifyNumber"] for r in written.collect()) == sorted(
        v.decode() for v in expected_numbers(60).elements())


# --- the sparkeos.files sink --------------------------------------------------------------------


@pytest.mark.apache_kafka
def test_a_job_writing_to_sparkeos_files_is_audited_by_reading_its_directory(spark, broker, tmp_path):
    bootstrap = broker.bootstrap_servers
    source = create_topic(bootstrap, unique("in"), 2)
    produce(bootstrap, source, people(120))
    path = tmp_path / "people"
    spec = parse_job(job(bootstrap, source, "unused", str(tmp_path / "ck"), output={},
                         sink={"format": "sparkeos.files", "path": str(path), "partitionBy": ["name_length"],
                               "options": {"format": "json"}},
                         transforms=[{"sql": "SELECT id, identifyNumber, length(name) AS name_length FROM input "
                                             "WHERE length(identifyNumber) = 18"}]))
    assert spec.sink.options["partitionBy"] == '["name_length"]'
    run_available_now(spark, spec)
    assert {p.name for p in path.iterdir() if not p.name.startswith("_")} == {"name_length=2", "name_length=3",
                                                                             "name_length=4"}
    report = audit(spark, spec, bootstrap, source)
    assert report.exact and report.output.delivered == 90
    extra = path / "name_length=2" / "part-extra.json"
    extra.write_text('{"id": 1, "identifyNumber": "000000000000000001"}\n')
    report = audit(spark, spec, bootstrap, source)
    assert not report.exact and report.output.duplicated == 1


@pytest.mark.parametrize(
    ("sink", "named"),
    [
        ({"format": "sparkeos.files"}, "sink.path: is required"),
        ({"format": "sparkeos.files", "path": "/tmp/x", "options": {"format": "avro"}}, "option 'format' must be"),
        ({"format": "sparkeos.files", "path": "/tmp/x", "partitionBy": [1]}, "sink.partitionBy: must be a list"),
        ({"format": "parquet", "path": "/tmp/x", "partitionBy": ["a"]}, "sink.partitionBy: applies to"),
        ({"format": "sparkeos.files", "path": "/tmp/x", "options": {"compresion": "gzip"}}, "did you mean"),
    ],
)
def test_bad_file_sink_fields_are_named(sink, named):
    document = job("b:1", "in", "out", "/tmp/ck", sink=sink)
    with pytest.raises(JobError, match=named.replace("(", r"\(")):
        parse_job(document)
