"""`sparkeos chaos`: every example job of examples/ run under the faults that test its sink, every kind of fault
striking some example, as a user runs the command after a plain install (the runtime-only virtualenv), reports exact;
a deliberately broken sink is reported inexact, with samples; bad input is refused before anything starts."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import uuid
from collections import Counter
from dataclasses import replace
from pathlib import Path

import psycopg
import pytest
import yaml
from confluent_kafka.admin import AclOperation, AdminClient, ResourceType

from sparkeos.broker import EmbeddedBroker
from sparkeos.chaos import KINDS, ChaosRunFailed, FaultError, parse_faults, run
from sparkeos.chaos.engine import (
    FEED_CHUNKS_PER_S,
    UNTIL_EACH_KIND_S,
    Feeder,
    committed_input,
    input_may_end,
    left_pending,
)
from sparkeos.chaos.faults import HELD_TASK_FAULTS, NETWORK_FAULTS, Schedule, applicable
from sparkeos.chaos.input import CORRUPT_VALUE, InputGenerator, ddl_fields
from sparkeos.chaos.report import ChaosReport, report_from_json
from sparkeos.chaos.sandbox import kafka_section_for_run, load_for_run
from sparkeos.jobs.spec import JobError, load_job, parse_job
from sparkeos.processes import command_line, process_table
from sparkeos.spark import sink_data_source
from sparkeos.spark.postgres.sink import describe_url
from sparkeos.verify import READ_UNCOMMITTED, end_offsets, iter_records, read_values
from support.apache_kafka import VERSIONS
from support.browser import rendered_dom
from support.runtime_only import runtime_environment
from support.secured import allow, secured_broker
from support.spark import create_topic, produce, unique, wait_for

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
BROKEN_SINK = Path(__file__).parent / "support" / "broken_files_sink"
DIRTY_READ_SINK = Path(__file__).parent / "support" / "dirty_read_files_sink"
CHAOS_TIMEOUT_S = 600
# Short intervals, so that each kind strikes within the short fault period of a test.
# A PostgreSQL crash fails the query's batch, and so the driver: each one counts against the job's restart strategy
# as a kill does.
# relayout is due at once, so that it changes the layout at the first restart, and back at the next.
TEST_INTERVALS = {"driver-kill": 15, "driver-kill-mid-commit": 8, "python-worker-kill": 6, "executor-kill": 10,
                  "relayout": 1, "broker-kill": 10, "postgres-crash": 20, "network-kafka": 4, "network-postgres": 4,
                  "long-downtime": 15}


def chaos(python: Path, job: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(python), "-m", "sparkeos", "chaos", str(job), *args], capture_output=True, text=True,
                          timeout=CHAOS_TIMEOUT_S, env={**runtime_environment(python), **(env or {})})


def last_json(result: subprocess.CompletedProcess) -> dict:
    lines = result.stdout.strip().splitlines()
    assert lines, f"no output (exit {result.returncode}):\n{result.stderr[-4000:]}"
    return json.loads(lines[-1])


def check_html_report(page: Path, report: dict) -> None:
    """The page as Chromium renders it shows the verdict, the timeline with a mark for each fault and the audit's
    numbers (plotly draws the timeline from the page's inlined script: nothing shows unless it ran)."""
    dom = rendered_dom(page)
    verdict = re.search(r'<p class="verdict" id="verdict">([^<]*)</p>', dom)
    assert verdict and verdict.group(1) == ("exact" if report["exact"] else "NOT exact")
    assert dom.count('class="main-svg"') >= 1, "the timeline was not drawn"
    legend = re.findall(r'class="legendtext"[^>]*>([^<]*)<', dom)
    assert {"input fed", "input processed", f"output visible ({report['output_unit']})"} <= set(legend), legend
    marks = re.findall(r'class="annotation-text"[^>]*>([^<]*)<', dom)
    for kind, count in report["injected"].items():
        assert marks.count(kind) == count, (kind, count, marks)
    audit = re.search(r'<div id="audit">.*?<td>output</td>((?:<td>\d+</td>){5})', dom)
    assert audit, "no audit table"
    assert [int(n) for n in re.findall(r"\d+", audit.group(1))] == [
        report[k] for k in ("expected", "delivered", "missing", "duplicated", "unexpected")]


# The example run on Apache Kafka (a node the run starts, --kafka-version) rather than on the embedded broker: the
# broker's faults and a downtime past the transaction timeout, on Kafka's own transaction coordinator.
ON_APACHE_KAFKA = {"people-json.yaml": VERSIONS[0]}


@pytest.fixture
def production(tmp_path):
    """A broker standing for the cluster a job file names."""
    with EmbeddedBroker(tmp_path / "production") as running:
        yield running


# What each example leaves out of the faults that apply to it. A driver restart takes most of a run's time, the more
# on the standalone cluster that executor kills need: the kill of the driver at a random moment and the executor kill,
# whose effects do not depend on the sink, strike people-etl only; the Kafka-sink examples between them run every
# kind. Each sink still meets the kill at its own commit step and the task kill in the middle of its transaction.
LEFT_OUT = {"people-json.yaml": {"driver-kill", "executor-kill"},
            "people-files.yaml": {"driver-kill", "executor-kill"},
            "people-postgres.yaml": {"driver-kill", "executor-kill"}}


# The examples whose run is a soak (tests/conftest.py), and what checks the same in the default run.
SOAK_EXAMPLES = {
    "people-json.yaml": "people-etl's run strikes a Kafka sink with the same faults on the embedded broker; on "
                        "Apache Kafka, a job built in code runs under chaos below, the 3-node test kills brokers",
    "people-files.yaml": "the file sink's crash drill and network faults (tests/spark/files), and the broken file "
                         "sinks below, run under chaos on people-files' job",
}


def faults_argument(job: Path) -> str:
    kinds = [kind for kind in applicable(load_job(job)) if kind not in LEFT_OUT.get(job.name, set())]
    return ",".join(f"{kind}={TEST_INTERVALS[kind]}" for kind in kinds)


def test_every_fault_kind_strikes_an_example_and_each_sink_meets_its_commit_step_kills():
    examples = sorted(EXAMPLES.glob("*.yaml"))
    assert set(LEFT_OUT) <= {job.name for job in examples}
    run_kinds = [set(faults_argument(job).replace("=", ",").split(",")[::2]) for job in examples]
    assert set().union(*run_kinds) == set(KINDS)
    for job, kinds in zip(examples, run_kinds, strict=True):
        assert {"driver-kill-mid-commit", "python-worker-kill"} <= kinds, job.name


@pytest.mark.timeout(CHAOS_TIMEOUT_S + 60)
@pytest.mark.parametrize("example", [
    pytest.param(name, marks=[pytest.mark.soak(SOAK_EXAMPLES[name])] if name in SOAK_EXAMPLES else [])
    for name in sorted(p.name for p in EXAMPLES.glob("*.yaml"))])
def test_each_example_job_is_exact_under_its_faults(runtime_python, tmp_path, example):
    job = EXAMPLES / example
    faults = faults_argument(job)
    page = tmp_path / "chaos.html"
    version = ON_APACHE_KAFKA.get(example)
    result = chaos(runtime_python, job, "--faults", faults, "--duration", "15", "--rate", "60", "--seed", "7",
                   "--json", "--workdir", str(tmp_path / "work"), "--report", str(page),
                   *(["--kafka-version", version] if version else []))
    report = last_json(result)
    log = (tmp_path / "work" / "driver.log").read_text(errors="replace")[-3000:]
    assert result.returncode == 0, f"{report}\n{result.stderr[-3000:]}\n{log}"
    assert report["exact"] and not report["problems"], report
    assert report["expected"] == report["delivered"] > 0
    assert report["missing"] == report["duplicated"] == report["unexpected"] == 0
    assert report["input_records"] >= 15 * 60
    # Input the job must never see: records of transactions the feeder aborted.
    assert report["aborted_input_records"] > 0
    # Every chosen kind struck at least once, and the job recovered from each blow.
    assert set(report["injected"]) == {item.split("=")[0] for item in faults.split(",")}, report
    assert report["restarts"] >= sum(report["injected"].get(kind, 0) for kind in (
        "driver-kill", "driver-kill-mid-commit", "long-downtime"))
    assert all(report["recovery_s"].get(kind) for kind in report["injected"]), report["recovery_s"]
    assert "the run's proxy, in front of the broker" in report["sandbox"]["Kafka"]
    if version:
        assert f"Apache Kafka {version}, a node the run started" in report["sandbox"]["Kafka"], report["sandbox"]
        # Apache Kafka's own log: the node was started again after each kill, on the same data.
        log = (tmp_path / "work" / "kafka" / "node-1" / "server.log").read_text(errors="replace")
        assert log.count("Kafka Server started") == 1 + report["injected"]["broker-kill"], log[-2000:]
    if "executor-kill" in report["injected"]:
        assert "the run's standalone cluster: 2 workers" in report["sandbox"]["Spark"], report["sandbox"]
    else:
        assert report["sandbox"]["Spark"].startswith("local["), report["sandbox"]
    # The task kills struck a task in the middle of its transaction, at the sink's own step.
    step = sink_data_source(load_job(job).sink.format).task_transaction_step
    task_kills = [e for e in report["events"] if e["kind"] in HELD_TASK_FAULTS]
    assert task_kills and all(f"at {step}" in e["detail"] for e in task_kills), task_kills
    # Down past the sink's transaction timeout, until the broker aborted what the killed task had left open.
    if "long-downtime" in report["injected"]:
        over = [e for e in report["events"] if e["kind"] == "downtime-over"]
        assert len(over) == report["injected"]["long-downtime"], report["events"]
        assert all(float(e["detail"].split()[1]) >= 60 for e in over), over
    # The first relayout doubled the source's partitions at a restart; the next put the job's own layout back.
    relayouts = [(n, e) for n, e in enumerate(report["events"]) if e["kind"] == "relayout"]
    assert relayouts[0][1]["detail"] == "minPartitions 4 (was unset)", relayouts
    # (The network faults' own threads may log one in between.)
    assert all(next(e["kind"] for e in report["events"][n + 1:] if e["kind"] not in NETWORK_FAULTS) == "restart"
               for n, _ in relayouts), report["events"]
    if len(relayouts) > 1:
        assert relayouts[1][1]["detail"] == "minPartitions unset (was 4)", relayouts
    if load_job(job).bad_records.policy == "dead-letter":
        assert report["dead_lettered"] == report["corrupt_records"] > 0
    # A reader read the output all along (a Kafka topic's read_committed view only grows: the audit sees it all).
    if not load_job(job).sink.is_kafka:
        assert report["watched"]["reads"] >= 20 and report["watched"]["vanished"] == 0, report["watched"]
    check_html_report(page, report)


@pytest.mark.timeout(CHAOS_TIMEOUT_S + 60)
def test_a_sink_that_publishes_a_recommitted_batch_twice_is_reported_inexact_with_samples(runtime_python, tmp_path):
    """The broken sink (support/broken_files_sink) publishes by copying: when the next driver finishes a decision that
    a killed driver left half committed, the part committed before the kill is published twice. And the job reads its
    input read_uncommitted: the records of the input's aborted transactions reach the output."""
    document = yaml.safe_load((EXAMPLES / "people-files.yaml").read_text())
    document["source"]["kafka.isolation.level"] = "read_uncommitted"
    job = tmp_path / "people-files-uncommitted.yaml"
    job.write_text(yaml.safe_dump(document))
    environment = {"PYTHONPATH": str(BROKEN_SINK)}
    page = tmp_path / "chaos.html"
    # The shortest fault period: the one kind goes on until it struck once, and one such kill is all it takes.
    result = chaos(runtime_python, job, "--faults", "driver-kill-mid-commit=5", "--duration", "1", "--rate",
                   "60", "--json", "--workdir", str(tmp_path / "work"), "--report", str(page), env=environment)
    report = last_json(result)
    assert result.returncode == 1, report
    assert not report["exact"] and report["injected"]["driver-kill-mid-commit"] >= 1, report
    assert report["duplicated"] > 0 and report["missing"] == 0, report
    assert report["samples"]["duplicated"], report
    # The audit counts every copy it reads: an aborted record the killed driver had published is published again
    # by each later driver that finishes that decision, once per kill at most.
    copies = 1 + report["injected"]["driver-kill-mid-commit"]
    assert 0 < report["unexpected"] <= copies * report["aborted_input_records"], report
    assert report["samples"]["unexpected"], report
    assert "NOT exact" in result.stderr and "output duplicated" in result.stderr
    # Its stderr is a log, not a terminal: progress lines, then the report's tables, each on lines of its own.
    assert re.search(r"^chaos: \d+ s, input \d+, processed", result.stderr, re.M), result.stderr[:2000]
    assert not re.search(r"[┘┛][ \t]*\S", result.stderr), result.stderr
    check_html_report(page, report)
    assert "<b>output duplicated</b>" in rendered_dom(page)


@pytest.mark.timeout(CHAOS_TIMEOUT_S + 60)
def test_a_sink_whose_readers_see_uncommitted_rows_is_reported_inexact_though_its_end_state_is_exact(
        runtime_python, tmp_path):
    """The broken sink (support/dirty_read_files_sink) stages files where readers see them and publishes them a while
    later: what it leaves is exact, and only the reader watching the output while the job runs sees rows come and
    go. No fault is needed for that."""
    job = EXAMPLES / "people-files.yaml"
    environment = {"PYTHONPATH": str(DIRTY_READ_SINK)}
    result = chaos(runtime_python, job, "--faults", "none", "--duration", "10", "--rate", "60", "--json",
                   "--workdir", str(tmp_path / "work"), env=environment)
    report = last_json(result)
    assert result.returncode == 1, report
    assert report["expected"] == report["delivered"] > 0, report
    assert report["missing"] == report["duplicated"] == report["unexpected"] == 0, report
    assert not report["exact"] and not report["injected"], report
    watched = report["watched"]
    assert watched["reads"] >= 10 and watched["vanished"] > 0 and watched["samples"], watched
    assert any("a reader watching the output saw" in problem for problem in report["problems"]), report["problems"]
    assert "a reader watching the output saw" in result.stderr


@pytest.mark.apache_kafka(newest_only=True, embedded=False)
@pytest.mark.timeout(CHAOS_TIMEOUT_S + 60)
def test_the_python_api_runs_a_job_built_in_code_on_a_kafka_the_caller_names_fed_its_own_sampled_records(
        broker, production, tmp_path):
    """A test of the user's own pipeline: the job as a dict, its transformation a function of theirs
    (support/chaos_pipeline.py, found through this process's sys.path), run on Apache Kafka that the caller names in
    place of the embedded broker; the report comes back as an object. On that shared cluster the run makes topics of
    its own and keeps off the job's own names: its topics, its consumer group. `sample_input`: about the last N
    records of the job's own input topic, on the cluster its file names (an embedded broker standing for
    production), are read once and fed again and again; nothing is written where they came from."""
    bootstrap = broker.bootstrap_servers
    own = {"input": unique("job-input"), "output": unique("job-output"), "group": unique("job-group")}
    for cluster in (bootstrap, production.bootstrap_servers):
        create_topic(cluster, own["input"], partitions=2)  # on the named cluster too: the run must not use it
    rows = [{"id": 1000 + n, "name": f"n{n}", "age": 20 + n % 50, "country": "UK"} for n in range(400)]
    produce(production.bootstrap_servers, own["input"], [json.dumps(row) for row in rows], spread_over=2)
    document = yaml.safe_load((EXAMPLES / "people-json.yaml").read_text())
    document["transforms"] = [{"python": "support.chaos_pipeline:adults_in_capitals"}]
    document["source"].update({"kafka.bootstrap.servers": production.bootstrap_servers, "subscribe": own["input"],
                               "kafka.group.id": own["group"]})
    document["sink"]["topic"] = own["output"]
    before = end_offsets(production.bootstrap_servers, own["input"], isolation_level=READ_UNCOMMITTED)
    # One kind that needs no driver restart keeps the run short: what the engine does under each kind is the
    # examples' test above; this one is about the API, a named cluster and sampled input.
    report = run(document, faults={"python-worker-kill": 5}, duration_s=1, rate=60, seed=3, sample_input=100,
                 workdir=tmp_path / "work", bootstrap_server=bootstrap)
    assert report.exact, (report.problems, report.audit and report.audit.summary())
    assert report.audit.output.delivered == report.audit.output.expected > 0
    assert set(report.injected) == {"python-worker-kill"}
    assert report.sandbox["Kafka"].startswith(f"{bootstrap} (named on the command line")
    assert report.sandbox["input"] == (f"100 records sampled from {own['input']} on {production.bootstrap_servers} "
                                       "(read only), fed over and over")
    assert report_from_json(report.to_json()).to_json() == report.to_json()
    admin = AdminClient({"bootstrap.servers": bootstrap})
    topics = set(admin.list_topics(timeout=30).topics)
    groups = {g.group_id for g in admin.list_consumer_groups().result(30).valid}
    assert own["output"] not in topics and own["group"] not in groups
    assert end_offsets(production.bootstrap_servers, own["input"], isolation_level=READ_UNCOMMITTED) == before
    assert end_offsets(bootstrap, own["input"]) == {0: 0, 1: 0}
    prefix = report.sandbox["Kafka"].split("begin with ")[1].rstrip(")")
    assert {prefix + own["input"], prefix + own["output"]} <= topics and prefix + own["group"] in groups
    # The output: the last 100 people, each fed more than once.
    ids = Counter(json.loads(value)["id"] for value in read_values(bootstrap, prefix + own["output"]))
    assert set(ids) == set(range(1300, 1400)), sorted(ids)
    assert report.input_records > 100 and min(ids.values()) > 1
    with pytest.raises(ChaosRunFailed, match="unknown fault 'meteor-strike'"):
        run(document, faults="meteor-strike")
    # A topic with nothing to sample is refused before anything starts.
    document["source"]["subscribe"] = create_topic(production.bootstrap_servers, unique("empty"), partitions=1)
    with pytest.raises(ChaosRunFailed, match="has no records to sample"):
        run(document, faults="none", sample_input=100, bootstrap_server=bootstrap)


@pytest.mark.timeout(CHAOS_TIMEOUT_S + 60)
def test_told_to_use_the_jobs_own_endpoints_the_run_uses_names_of_its_own_there(runtime_python, broker, postgres,
                                                                                 tmp_path):
    """`--use-job-endpoints`: the Kafka and the PostgreSQL server the job file names (here a broker and a server
    standing for production) in place of the sandbox's. The run uses names of its own on them, so the job's own
    topics, consumer group and table are neither read nor written, and it faults only what it started itself: here
    its proxy, in front of the job's server."""
    bootstrap = broker.bootstrap_servers
    topic = create_topic(bootstrap, unique("people"), partitions=2)
    produce(bootstrap, topic, [json.dumps({"id": 1, "name": "prod", "age": 40, "country": "UK"})])
    table = f"adults_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(postgres.url(), autocommit=True) as connection:
        connection.execute(f"CREATE TABLE public.{table} (id int, name text, age int, country text)")
        connection.execute(f"INSERT INTO public.{table} VALUES (1, 'prod', 40, 'UK')")
    document = yaml.safe_load((EXAMPLES / "people-postgres.yaml").read_text())
    document["source"].update({"kafka.bootstrap.servers": bootstrap, "subscribe": topic})
    document["sink"]["options"].update(url=postgres.url(), dbtable=f"public.{table}")
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(document))
    refused = chaos(runtime_python, job, "--use-job-endpoints", "--faults", "postgres-crash")
    assert refused.returncode == 2 and ("fault postgres-crash does not apply to this run: it needs a PostgreSQL "
                                        "server the run starts itself") in refused.stderr, refused.stderr
    before = end_offsets(bootstrap, topic, isolation_level=READ_UNCOMMITTED)

    result = chaos(runtime_python, job, "--use-job-endpoints", "--faults", "network-postgres=3", "--duration", "3",
                   "--rate", "60", "--json", "--workdir", str(tmp_path / "work"))
    report = last_json(result)
    assert result.returncode == 0, f"{report}\n{result.stderr[-3000:]}"
    assert report["exact"] and report["expected"] == report["delivered"] > 0, report
    assert set(report["injected"]) == {"network-postgres"}, report["injected"]
    kafka, database = report["sandbox"]["Kafka"], report["sandbox"]["PostgreSQL"]
    assert kafka.startswith(f"{bootstrap} (the job's own, named in its file; ") and "begin with " in kafka, kafka
    prefix = kafka.split("begin with ")[1].rstrip(")")
    run_table = prefix.replace("-", "_") + table
    assert f"the run's proxy, in front of the job's own server {describe_url(postgres.url())}" in database, database
    assert f'the run\'s table "public"."{run_table}"' in database, database
    # Nothing of the job's own was touched; what the run wrote is under its own names.
    assert end_offsets(bootstrap, topic, isolation_level=READ_UNCOMMITTED) == before
    with psycopg.connect(postgres.url()) as connection:
        assert connection.execute(f"SELECT id, name FROM public.{table}").fetchall() == [(1, "prod")]
        assert connection.execute(f"SELECT count(*) FROM public.{run_table}").fetchone()[0] == report["delivered"]
    assert prefix + topic in AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=30).topics


@pytest.mark.timeout(CHAOS_TIMEOUT_S + 60)
def test_on_a_secured_cluster_the_runs_own_clients_take_the_jobs_kafka_settings(runtime_python, tmp_path):
    """A run on a cluster named on the command line that asks for SASL_SSL and whose authorizer is on: the run's own
    clients (creating its topics, the feeder, the watcher of the output, the lag reader, the audit) connect with the
    job file's `kafka:` section, as the job does, as a principal allowed only names that begin with `sparkeos` (the
    run's topics and groups, the job's transactional ids)."""
    with secured_broker(tmp_path / "secured") as cluster:
        principal = "User:etl"
        cluster.create_acls([*allow(principal, ResourceType.TOPIC, "sparkeos", [AclOperation.ALL], prefixed=True),
                             *allow(principal, ResourceType.GROUP, "sparkeos", [AclOperation.READ], prefixed=True),
                             *allow(principal, ResourceType.TRANSACTIONAL_ID, "sparkeos", [AclOperation.WRITE],
                                    prefixed=True)])
        document = yaml.safe_load((EXAMPLES / "people-json.yaml").read_text())
        document["kafka"] = {key: value for key, value in cluster.client_config("etl").items()
                             if key != "sasl.password"} | {"sasl.password": "${SPARKEOS_TEST_KAFKA_PASSWORD}"}
        job = tmp_path / "people-json-secured.yaml"
        job.write_text(yaml.safe_dump(document))
        result = chaos(runtime_python, job, "--bootstrap-server", cluster.bootstrap_servers, "--faults",
                       "python-worker-kill=4", "--duration", "8", "--rate", "40", "--json", "--workdir",
                       str(tmp_path / "work"), env={"SPARKEOS_TEST_KAFKA_PASSWORD": cluster.passwords["etl"]})
        report = last_json(result)
        assert result.returncode == 0, f"{report}\n{result.stderr[-3000:]}"
        assert report["exact"] and report["expected"] == report["delivered"] > 0, report
        assert report["input_records"] > 0 and report["injected"]["python-worker-kill"] >= 1, report
        # The lag was read from the job's first planned batch on, through the same settings, until it was 0 (how
        # long the job takes to plan its first batch depends on the machine's load); the output too.
        lags = [sample["lag"] for sample in report["timeline"]]
        first = next((n for n, lag in enumerate(lags) if lag is not None), None)
        assert first is not None and None not in lags[first:] and lags[-1] == 0, report["timeline"]
        assert report["timeline"][-1]["output"], report["timeline"][-1]


def test_a_jobs_kafka_section_is_left_out_against_the_runs_own_broker_and_pointed_at_a_named_one(tmp_path,
                                                                                                 monkeypatch):
    """The section holds the job's own cluster's security, its secrets from the environment: a run on its own open
    broker needs neither; on a Kafka named for the run, the sink must not take the section's servers."""
    monkeypatch.delenv("SPARKEOS_TEST_UNSET_PASSWORD", raising=False)
    document = yaml.safe_load((EXAMPLES / "people-json.yaml").read_text())
    document["kafka"] = {"bootstrap.servers": "kafka-1:9093", "security.protocol": "SASL_SSL",
                         "sasl.password": "${SPARKEOS_TEST_UNSET_PASSWORD}"}
    job = tmp_path / "secured.yaml"
    job.write_text(yaml.safe_dump(document))
    spec = load_for_run(job, own_kafka=True)
    assert not any(key.startswith(("kafka.security", "kafka.sasl")) for key in (*spec.source, *spec.sink.options))
    with pytest.raises(JobError, match="SPARKEOS_TEST_UNSET_PASSWORD, which is not set"):
        load_for_run(job, own_kafka=False)
    for own_kafka, section in [(True, None), (False, {**document["kafka"], "bootstrap.servers": "127.0.0.1:9999"})]:
        copy = yaml.safe_load(job.read_text())
        kafka_section_for_run(copy, "127.0.0.1:9999", own_kafka)
        assert copy.get("kafka") == section


def test_an_avro_jobs_registry_secrets_are_needed_only_where_the_run_uses_its_registry(tmp_path, monkeypatch):
    """The run registers the input's schemas with a registry of its own unless it uses the job's endpoints: the
    variables the job's own registry settings name need not be set then."""
    monkeypatch.delenv("SPARKEOS_TEST_UNSET_PASSWORD", raising=False)
    document = yaml.safe_load((EXAMPLES / "people-etl.yaml").read_text())
    document["format"]["schema"] = (EXAMPLES / document["format"]["schema"]).read_text()
    document["format"]["registry"] = {"url": "https://registry:8081",
                                      "basic.auth.user.info": "etl:${SPARKEOS_TEST_UNSET_PASSWORD}"}
    job = tmp_path / "avro.yaml"
    job.write_text(yaml.safe_dump(document))
    assert load_for_run(job, own_kafka=True).format.registry is not None
    assert load_for_run(job, own_kafka=False).format.registry is not None
    with pytest.raises(JobError, match="SPARKEOS_TEST_UNSET_PASSWORD, which is not set"):
        load_for_run(job, own_kafka=False, job_endpoints=True)


def test_the_demos_job_file_holds_no_secret_of_the_settings_it_was_given(monkeypatch):
    from sparkeos.demo import kafka_section

    given = {"security.protocol": "SASL_SSL", "sasl.username": "etl", "sasl.password": "pw-1",
             "ssl.key.pem": "-----BEGIN PRIVATE KEY-----", "sasl.oauthbearer.config": "token=t0k3n"}
    for key in given:
        monkeypatch.delenv("SPARKEOS_DEMO_" + key.upper().replace(".", "_"), raising=False)
    section = kafka_section(given)
    assert section["security.protocol"] == "SASL_SSL" and section["sasl.username"] == "etl"
    hidden = {key: value for key, value in section.items() if key not in ("security.protocol", "sasl.username")}
    assert hidden == {key: "${SPARKEOS_DEMO_" + key.upper().replace(".", "_") + "}" for key in hidden}
    assert {key: os.environ[value[2:-1]] for key, value in hidden.items()} == {key: given[key] for key in hidden}


def test_a_target_of_the_runs_own_is_beside_the_jobs():
    """Each sink's data source says where: a table in the same schema (quoted, the job's case kept), a directory in
    the same parent, bucket or file system; nowhere when the job's names no place."""
    prefix = "sparkeos-chaos-1a2b3c4d-"
    postgres, files = sink_data_source("sparkeos.postgres"), sink_data_source("sparkeos.files")
    for table, beside in [('billing."Adults"', '"billing"."sparkeos_chaos_1a2b3c4d_Adults"'),
                          ("Adults", '"sparkeos_chaos_1a2b3c4d_adults"'),
                          ('public."My.Table"', '"public"."sparkeos_chaos_1a2b3c4d_My.Table"')]:
        changed, words = postgres.target_beside({"URL": "postgresql://u:secret@db:5432/x", "DBTable": table}, prefix)
        assert changed == {"dbtable": beside}
        assert words == f"the job's own server u@db:5432/x, the run's table {beside}" and "secret" not in words
    with pytest.raises(ValueError, match="longer than PostgreSQL's 63 bytes"):
        postgres.target_beside({"url": "postgresql://db/x", "dbtable": "a" * 40}, prefix)
    for path, beside in [("/data/out/adults/", "/data/out/sparkeos-chaos-1a2b3c4d-adults"),
                         ("s3a://bucket/out/adults", "s3a://bucket/out/sparkeos-chaos-1a2b3c4d-adults"),
                         ("file:///data/adults", "file:///data/sparkeos-chaos-1a2b3c4d-adults"),
                         ("adults", "sparkeos-chaos-1a2b3c4d-adults")]:
        assert files.target_beside({"path": path}, prefix)[0] == {"path": beside}
    for path in ("/", "s3a://bucket/", "hdfs://namenode:8020"):
        with pytest.raises(ValueError, match="names no directory to put one beside"):
            files.target_beside({"path": path}, prefix)


@pytest.mark.parametrize(("arguments", "message"), [
    (["--faults", "meteor-strike"], "unknown fault 'meteor-strike'"),
    (["--faults", "postgres-crash"], "fault postgres-crash does not apply to this run: it needs a sparkeos.postgres "
                                     "sink"),
    (["--faults", "executor-kill", "--master", "spark://127.0.0.1:7077"],
     "fault executor-kill does not apply to this run: it needs Spark processes the run starts itself: a local master"),
    (["--faults", "broker-kill,broker-kill=3"], "fault broker-kill is given twice"),
    (["--faults", "broker-kill,relayout"], "fault relayout does not apply to this run: it needs a fault that restarts "
                                           "the driver"),
    (["--faults", "broker-kill", "--bootstrap-server", "127.0.0.1:9"],
     "fault broker-kill does not apply to this run: it needs a Kafka the run starts itself"),
    (["--faults", "driver-kill=0"], "must be more than 0 s"),
    (["--kafka-version", "2.8.2"], "--kafka-version: Apache Kafka 3.x and 4.x only (got '2.8.2')"),
    (["--kafka-version", "latest"], "--kafka-version: Apache Kafka 3.x and 4.x only (got 'latest')"),
    (["--kafka-version", "4.4.0", "--bootstrap-server", "127.0.0.1:9"],
     "--kafka-version starts a Kafka of the run's own; --bootstrap-server names one: give one of them"),
    (["--use-job-endpoints", "--bootstrap-server", "127.0.0.1:9"],
     "--use-job-endpoints runs on the job's own Kafka; --bootstrap-server names another: give one of them"),
    (["--use-job-endpoints", "--kafka-version", "4.4.0"],
     "--use-job-endpoints runs on the job's own Kafka; --kafka-version starts another: give one of them"),
    (["--use-job-endpoints", "--faults", "network-kafka"],
     "fault network-kafka does not apply to this run: it needs a Kafka the run starts itself"),
    (["--duration", "0"], "--duration must be more than 0 seconds"),
])
def test_bad_arguments_are_refused_before_anything_starts(runtime_python, arguments, message):
    result = chaos(runtime_python, EXAMPLES / "people-json.yaml", *arguments)
    assert result.returncode == 2 and message in result.stderr, result.stderr


def test_an_apache_kafka_version_not_in_the_cache_is_fetched_saying_so_or_refused_naming_what_is_missing(
        runtime_python, tmp_path):
    """The jars come from Maven Central at a user's run time only with a word first; without Maven the run ends
    before the job starts, saying what to install."""
    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "java").symlink_to(shutil.which("java"))
    result = chaos(runtime_python, EXAMPLES / "people-json.yaml", "--kafka-version", VERSIONS[0], "--faults",
                   "driver-kill", env={"PATH": f"{runtime_python.parent}:{tools}",
                                       "SPARKEOS_CACHE_DIR": str(tmp_path / "empty-cache")})
    assert result.returncode == 2, result.stderr[-3000:]
    assert f"fetching Apache Kafka {VERSIONS[0]}'s jars from Maven Central" in result.stdout
    assert "`mvn` is not on PATH" in result.stderr and "install Maven" in result.stderr, result.stderr[-3000:]


def test_a_broker_that_cannot_start_again_ends_the_run_with_a_report_that_says_so(runtime_python, tmp_path):
    """A killed broker that cannot start again (here another process took its port while it was down) ends the run:
    the report says so, and that the output could not be audited; exit 1, no traceback. Seed 1 keeps the broker
    down 4.2 s, time enough to take its port."""
    workdir = tmp_path / "run"
    taken: list[socket.socket] = []

    def take_the_port() -> None:
        job = workdir / "job.yaml"
        wait_for(job.exists, timeout_s=300, interval_s=0.05, what="the sandbox's job file")
        host, port = yaml.safe_load(job.read_text())["source"]["kafka.bootstrap.servers"].rsplit(":", 1)

        def broker_down() -> bool:
            with socket.socket() as probe:
                return probe.connect_ex((host, int(port))) != 0

        wait_for(broker_down, timeout_s=300, interval_s=0.02, what="the broker-kill")
        squatter = socket.socket()
        # As a restarting server does: the killed broker's connections leave the port in TIME_WAIT.
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        squatter.bind((host, int(port)))
        squatter.listen()
        taken.append(squatter)

    thief = threading.Thread(target=take_the_port, daemon=True)
    thief.start()
    result = chaos(runtime_python, EXAMPLES / "people-json.yaml", "--faults", "broker-kill=5", "--duration", "60",
                   "--seed", "1", "--json", "--workdir", str(workdir))
    thief.join(10)
    for squatter in taken:
        squatter.close()
    assert taken, "the broker's port was not taken while it was down"
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    report = last_json(result)
    assert result.returncode == 1 and not report["exact"]
    assert report["gave_up"].startswith("the Kafka broker did not start again after a broker-kill"), report["gave_up"]
    assert "the output was not audited" in report["problems"], report["problems"]
    assert report["injected"] == {"broker-kill": 1}


def test_a_job_whose_driver_fails_before_its_first_batch_is_reported_given_up(runtime_python, tmp_path):
    """A driver that fails as it starts (its SQL names a column the input lacks) is restarted as the job's restart
    strategy says, before any fault was scheduled, and the run ends when the strategy gives up: a report, exit 1."""
    document = yaml.safe_load((EXAMPLES / "people-json.yaml").read_text())
    document["transforms"] = [{"sql": "SELECT no_such_column FROM input"}]
    document["restart"] = {"strategy": "fixed-delay", "attempts": 1, "delay": "1 second"}
    job = tmp_path / "failing.yaml"
    job.write_text(yaml.safe_dump(document))
    result = chaos(runtime_python, job, "--faults", "driver-kill=5", "--duration", "10", "--json")
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    report = last_json(result)
    assert result.returncode == 1 and not report["exact"]
    assert report["restarts"] == 1 and report["injected"] == {}, report
    assert report["gave_up"].startswith("the job's restart strategy (fixed-delay"), report["gave_up"]
    assert [e["kind"] for e in report["events"]].count("driver-exit") == 2, report["events"]


def test_a_run_interrupted_with_ctrl_c_leaves_no_driver_and_no_kafka_node_running(runtime_python, tmp_path):
    """The job's driver, and the Apache Kafka node the run started (`--kafka-version`), run in sessions of their own,
    out of the terminal's reach: a run ended by Ctrl-C (or by an error) kills them as it ends."""
    workdir = tmp_path / "work"
    job_path, kafka_dir = str(workdir / "job.yaml"), str(workdir / "kafka")

    def processes_naming(text: str) -> list[int]:
        return [pid for pid in process_table() if any(text in argument for argument in command_line(pid))]

    run = subprocess.Popen([str(runtime_python), "-m", "sparkeos", "chaos", str(EXAMPLES / "people-json.yaml"),
                            "--faults", "driver-kill=30", "--workdir", str(workdir), "--kafka-version", VERSIONS[0]],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                           env=runtime_environment(runtime_python))
    try:
        wait_for(lambda: (workdir / "checkpoint" / "commits" / "0").exists(), timeout_s=300,
                 what="the job's first committed batch")
        assert processes_naming(job_path), "no driver found by its job file"
        assert processes_naming(kafka_dir), "no Apache Kafka node found by its directory"
        run.send_signal(signal.SIGINT)
        run.wait(120)
    finally:
        if run.poll() is None:
            run.kill()
    left = {"driver": processes_naming(job_path), "Kafka node": processes_naming(kafka_dir)}
    for pid in left["driver"] + left["Kafka node"]:
        os.kill(pid, signal.SIGKILL)
    assert not left["driver"] and not left["Kafka node"], f"outlived the run: {left}"
    stderr = run.stderr.read()
    assert run.returncode == 130 and stderr.rstrip().endswith("sparkeos chaos: interrupted"), stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]


def test_jobs_the_sandbox_cannot_run_are_refused_with_the_reason(runtime_python, tmp_path):
    document = yaml.safe_load((EXAMPLES / "people-files.yaml").read_text())
    document["sink"] = {"format": "parquet", "path": str(tmp_path / "out")}
    spark_sink = tmp_path / "spark-sink.yaml"
    spark_sink.write_text(yaml.safe_dump(document))
    result = chaos(runtime_python, spark_sink)
    assert result.returncode == 2 and "exact only for readers of its _spark_metadata" in result.stderr

    document = yaml.safe_load((EXAMPLES / "people-json.yaml").read_text())
    document["source"]["subscribe"] = "people-a,people-b"
    two_topics = tmp_path / "two-topics.yaml"
    two_topics.write_text(yaml.safe_dump(document))
    result = chaos(runtime_python, two_topics)
    assert result.returncode == 2 and "feeds one input topic" in result.stderr and "people-a,people-b" in result.stderr


def test_the_default_faults_are_every_kind_that_applies_to_the_job():
    kafka, postgres = load_job(EXAMPLES / "people-json.yaml"), load_job(EXAMPLES / "people-postgres.yaml")
    assert set(parse_faults(None, kafka)) == set(KINDS) - {"postgres-crash", "network-postgres"}
    assert set(parse_faults(None, postgres)) == set(KINDS) - {"long-downtime"}
    # On a cluster the run did not start, it kills no executor and no Python worker.
    assert set(parse_faults(None, postgres, "spark://127.0.0.1:7077")) == set(KINDS) - {
        "python-worker-kill", "executor-kill", "long-downtime"}
    # people-etl's transactions time out after 10 minutes: too long a wait for a default run.
    etl = load_job(EXAMPLES / "people-etl.yaml")
    assert "long-downtime" not in parse_faults(None, etl)
    with pytest.raises(FaultError, match="a kafka.transaction.timeout.ms of at most 300000"):
        parse_faults("long-downtime", etl)
    assert parse_faults("driver-kill=7.5s,broker-kill", kafka) == {"driver-kill": 7.5, "broker-kill": 40.0}
    assert parse_faults("none", kafka) == {}  # a run without faults: what the readers see, the audit
    with pytest.raises(FaultError, match="none stands alone"):
        parse_faults("none,driver-kill", kafka)
    with pytest.raises(FaultError, match="KIND one of driver-kill, driver-kill-mid-commit"):
        parse_faults("driver-kill:5", kafka)


def test_one_seed_gives_one_schedule_and_another_seed_another():
    faults = {"driver-kill": 10.0, "broker-kill": 20.0}

    def draws(seed: int) -> list:
        schedule = Schedule(faults, seed, start=0.0)
        moments = []
        for now in range(0, 200):
            for kind in schedule.due_now(float(now)):
                moments.append((now, kind, round(schedule.outage_s(), 3)))
                schedule.done(kind, float(now))
        return moments

    assert draws(5) == draws(5)
    assert draws(5) != draws(6)
    assert {kind for _now, kind, _outage in draws(5)} == set(faults)


def test_input_goes_on_until_the_job_committed_a_batch_after_every_fault():
    """A fault's recovery is the time to the job's next committed batch, and a batch needs input: had the input ended
    right after a kill, the restarted driver would have nothing to commit and the kill no recovery."""
    chosen = {"driver-kill": 15.0, "broker-kill": 10.0}
    struck = {"driver-kill": 2, "broker-kill": 1}
    assert not input_may_end(now=99.0, faults_end=100.0, chosen=chosen, injected=struck, unrecovered=0)
    assert not input_may_end(now=101.0, faults_end=100.0, chosen=chosen, injected={"driver-kill": 2},
                             unrecovered=0)
    assert not input_may_end(now=101.0, faults_end=100.0, chosen=chosen, injected=struck, unrecovered=1)
    assert input_may_end(now=101.0, faults_end=100.0, chosen=chosen, injected=struck, unrecovered=0)
    # A kind that never strikes, or a job that never recovers, does not hold the run forever.
    late = 100.0 + UNTIL_EACH_KIND_S + 1
    assert input_may_end(now=late, faults_end=100.0, chosen=chosen, injected={"driver-kill": 2}, unrecovered=1)


def test_generated_input_follows_the_jobs_format(tmp_path):
    assert ddl_fields("id INT, `full name` STRING, tags ARRAY<STRING>, price DECIMAL(10, 2)") == [
        ("id", "int"), ("full name", "string"), ("tags", "array<string>"), ("price", "decimal(10,")]
    spec = parse_job({"name": "j", "source": {"kafka.bootstrap.servers": "x:1", "subscribe": "in"},
                      "format": {"type": "json", "schema": "id INT, name STRING, age INT"},
                      "sink": {"topic": "out"}, "checkpoint": str(tmp_path), "bad_records": {"policy": "skip"}})
    generator = InputGenerator(spec, seed=3, registry=None, topic="in")
    values = generator.batch(1000)
    decoded = [json.loads(v) for v in values if not v.startswith(b"\x00")]
    assert len(decoded) == 998 and generator.corrupt == 2
    assert [row["id"] for row in decoded[:3]] == [1, 2, 3]
    assert 0 < sum(row["age"] >= 18 for row in decoded) < len(decoded)
    assert {len(row["name"]) for row in decoded} >= {1, 18, 20}
    assert InputGenerator(spec, seed=3, registry=None, topic="in").batch(1000) == values
    assert InputGenerator(spec, seed=4, registry=None, topic="in").batch(1000) != values


def feeder_job(tmp_path: Path, bad_records: str = "fail"):
    return parse_job({"name": "j", "source": {"kafka.bootstrap.servers": "x:1", "subscribe": "in"},
                      "format": {"type": "json", "schema": "id INT, name STRING, age INT"},
                      "sink": {"topic": "out"}, "checkpoint": str(tmp_path), "bad_records": {"policy": bad_records}})


def test_the_feeder_spreads_each_chunk_over_the_partitions(broker, tmp_path):
    """A batch of one partition has one transaction, which is never half committed: were a chunk's records to go
    to one partition, a job that keeps up with the feeder would give a mid-commit kill no moment to strike."""
    topic = create_topic(broker.bootstrap_servers, unique("chaos-input"), partitions=2)
    generator = InputGenerator(feeder_job(tmp_path), seed=3, registry=None, topic=topic)
    feeder = Feeder({"bootstrap.servers": broker.bootstrap_servers}, topic, generator, rate=60, seed=3)
    feeder.start()
    wait_for(lambda: feeder.acknowledged + feeder.aborted >= 30 or feeder.failed, timeout_s=30,
             what="the first chunk")
    feeder.stop()
    assert not feeder.failed
    chunk = 60 // FEED_CHUNKS_PER_S
    # Read uncommitted: the first chunk may be one of those aborted.
    first_chunk = Counter(record.partition for record in iter_records(broker.bootstrap_servers, topic,
                                                                      isolation_level=READ_UNCOMMITTED)
                          if json.loads(record.value)["id"] <= chunk)
    assert sum(first_chunk.values()) == chunk and len(first_chunk) == 2, first_chunk


def test_the_feeder_aborts_some_chunks_and_loses_nothing_when_the_broker_is_killed(broker_process, tmp_path):
    """Aborted input is what a job reading read_committed must never let through: the feeder aborts about one chunk
    in ABORT_ONE_IN, and a broker killed under it neither loses nor doubles a record (the audit's expected output is
    whatever the input topic holds, so a feeder that lost records would go unnoticed there)."""
    bootstrap = broker_process.bootstrap_servers
    topic = create_topic(bootstrap, unique("chaos-input"), partitions=2)
    generator = InputGenerator(feeder_job(tmp_path, "skip"), seed=5, registry=None, topic=topic)
    feeder = Feeder({"bootstrap.servers": bootstrap}, topic, generator, rate=1000, seed=5)
    feeder.start()
    try:
        wait_for(lambda: feeder.acknowledged >= 2000 or feeder.failed, timeout_s=60, what="records before the kill")
        before = feeder.acknowledged
        broker_process.kill()
        broker_process.start()
        wait_for(lambda: feeder.acknowledged >= before + 2000 or feeder.failed, timeout_s=120,
                 what="records after the restart")
    finally:
        feeder.stop()
    assert not feeder.failed, feeder.failed
    assert feeder.aborted > 0 and feeder.acknowledged + feeder.aborted + feeder.uncertain == generator.produced
    committed, corrupt = committed_input({"bootstrap.servers": bootstrap}, topic)
    assert feeder.acknowledged <= committed <= feeder.acknowledged + feeder.uncertain, (committed, feeder.uncertain)
    assert 0 < corrupt < committed // 400, corrupt
    ids = [json.loads(value)["id"] for value in read_values(bootstrap, topic, isolation_level=READ_UNCOMMITTED)
           if value != CORRUPT_VALUE]
    assert len(ids) == len(set(ids)), "a record was written twice"
    committed_ids = {json.loads(value)["id"] for value in read_values(bootstrap, topic) if value != CORRUPT_VALUE}
    assert len(committed_ids) == committed - corrupt and len(set(ids) - committed_ids) > 0


def test_work_a_sink_left_pending_after_the_clean_stop_makes_the_run_inexact(tmp_path):
    """A clean stop leaves nothing pending: a pre-committed transaction, or a decision not yet carried out, left in the
    store afterwards holds resources for good, whatever the audit of the output says."""
    import pyarrow as pa

    from sparkeos.spark.files.datasource import FilesDataSource
    from sparkeos.spark.two_phase_commit import TaskAttempt

    spec = load_job(EXAMPLES / "people-files.yaml")
    options = {**spec.sink.options, "path": str(tmp_path / "out")}
    spec = replace(spec, sink=replace(spec.sink, options=options))
    assert left_pending(spec) == []
    sink = FilesDataSource.operator_sink(options)
    sink.prepare()
    task = TaskAttempt("q-left", 4, 0, "attempt-1")
    transaction = sink.begin_transaction(task)
    sink.invoke(transaction, pa.record_batch({"id": pa.array([1], pa.int32()), "name": ["Ada"], "age": pa.array(
        [36], pa.int32()), "country": ["UK"]}))
    sink.pre_commit(transaction, task)
    left = left_pending(spec)
    assert len(left) == 1 and "q-left" in left[0] and "batch 4" in left[0], left
    report = ChaosReport(job="j", seed=1, faults_chosen={}, workdir=str(tmp_path), leftovers=left)
    assert any("left pending after the clean stop" in problem and "q-left" in problem for problem in report.problems)
    assert report_from_json(report.to_json()).leftovers == left


def test_a_transaction_left_open_on_a_kafka_sinks_topic_is_left_pending(broker):
    """The Kafka sink's tasks commit their own transactions: what one can leave is a transaction open on the topic,
    which holds read_committed readers at its first offset until the broker times it out. Nothing later need show it
    to an audit of the output."""
    from confluent_kafka import Producer

    topic = create_topic(broker.bootstrap_servers, unique("chaos-out"), partitions=2)
    spec = load_job(EXAMPLES / "people-json.yaml")
    options = {**spec.sink.options, "kafka.bootstrap.servers": broker.bootstrap_servers, "topic": topic}
    spec = replace(spec, sink=replace(spec.sink, options=options))
    producer = Producer({"bootstrap.servers": broker.bootstrap_servers, "transactional.id": unique("left-open")})
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(topic, b"committed", partition=0)
    producer.commit_transaction(30)
    assert left_pending(spec) == []
    producer.begin_transaction()
    producer.produce(topic, b"left open", partition=1)
    producer.flush(30)
    left = left_pending(spec)
    assert len(left) == 1 and f"{topic} partition 1" in left[0], left
    producer.abort_transaction(30)
    assert left_pending(spec) == []


def test_a_row_the_watcher_saw_reads_the_same_as_files_of_other_shapes_come(tmp_path):
    """The reader watching a sparkeos.files directory must not see a row vanish that is still there: a partition
    value read as a number until a non-numeric one appears, a JSON column left out of the first file because it was
    null there, a CSV column whose type another file contradicts."""
    from sparkeos.spark.files.datasource import FilesDataSource

    for file_format, first, second in [
            ("json", '{"id": 1}\n{"id": 2, "name": null}\n', '{"id": 3, "name": "x"}\n'),
            ("csv", "id,name\n1,7\n", "id,name\n3,x\n")]:
        out = tmp_path / file_format
        (out / "country=7").mkdir(parents=True)
        (out / "country=7" / f"a.{file_format}").write_text(first)
        options = {"path": str(out), "format": file_format, "partitionBy": "country",
                   **({"header": "true"} if file_format == "csv" else {})}
        before = FilesDataSource.visible_records(options)
        assert sum(before.values()) == first.count("\n") - (file_format == "csv"), before
        (out / "country=ab").mkdir()
        (out / "country=ab" / f"b.{file_format}").write_text(second)
        after = FilesDataSource.visible_records(options)
        assert not before - after and sum(after.values()) == sum(before.values()) + 1, (before, after)


def test_the_html_report_marks_every_kind_of_fault():
    from sparkeos.chaos.html import FAULT_COLOURS

    assert set(FAULT_COLOURS) == set(KINDS)
