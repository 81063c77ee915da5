"""`sparkeos run` job files with a `sparkeos.postgres` sink, and `sparkeos audit` of its table."""

from __future__ import annotations

import json

import pytest

from sparkeos.jobs.audit import audit
from sparkeos.jobs.pipeline import build
from sparkeos.jobs.runner import start_query
from sparkeos.jobs.spec import JobError, parse_job
from support.spark import create_topic, produce, unique


def job(bootstrap: str, topic: str, checkpoint: str, sink: dict) -> dict:
    return {
        "name": "people-to-postgres",
        "source": {"kafka.bootstrap.servers": bootstrap, "subscribe": topic, "startingOffsets": "earliest"},
        "format": {"type": "json", "schema": "id INT, name STRING, identifyNumber STRING"},
        "transforms": [{"sql": "SELECT id, name, identifyNumber FROM input WHERE length(identifyNumber) = 18"}],
        "sink": sink,
        "checkpoint": checkpoint,
    }


def test_a_job_writing_to_postgres_is_audited_by_reading_its_table(spark, broker, postgres, tmp_path):
    bootstrap = broker.bootstrap_servers
    topic = create_topic(bootstrap, unique("in"), 2)
    produce(bootstrap, topic, [json.dumps({"id": i, "name": f"n{i}", "identifyNumber": f"{i:018d}" if i % 4
                                           else f"{i:017d}"}) for i in range(120)])
    table = unique("people").replace("-", "_")
    spec = parse_job(job(bootstrap, topic, str(tmp_path / "ck"), {
        "format": "sparkeos.postgres", "deliveryGuarantee": "exactly_once",
        "options": {"url": postgres.url(), "dbtable": table, "createTable": "true"}}))
    query = start_query(spark, spec, build(spark, spec).output, available_now=True)
    query.awaitTermination(180)
    assert query.exception() is None
    with postgres.connect() as connection:
        assert connection.execute(f"SELECT count(*), count(DISTINCT id) FROM {table}").fetchone() == (90, 90)
    report = audit(spark, spec, bootstrap, topic)
    assert report.exact and report.output.delivered == 90
    with postgres.connect() as connection:
        connection.execute(f"INSERT INTO {table} SELECT * FROM {table} WHERE id = 1")
        connection.execute(f"DELETE FROM {table} WHERE id = 2")
    report = audit(spark, spec, bootstrap, topic)
    assert (report.output.missing, report.output.duplicated, report.output.unexpected) == (1, 1, 0)


@pytest.mark.parametrize(
    ("sink", "named"),
    [
        ({"format": "sparkeos.postgres", "options": {"dbtable": "t"}}, "option 'url'"),
        ({"format": "sparkeos.postgres", "path": "/tmp/x", "options": {"url": "u", "dbtable": "t"}},
         "topic and path do not apply"),
        ({"format": "sparkeos.postgres", "deliveryGuarantee": "none", "options": {"url": "u", "dbtable": "t"}},
         "deliveryGuarantee"),
    ],
)
def test_bad_postgres_sink_fields_are_named(sink, named):
    with pytest.raises(JobError, match=named):
        parse_job(job("b:1", "in", "/tmp/ck", sink))
