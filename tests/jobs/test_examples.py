"""The job files of examples/ run as written: each one validates as it is, and runs to the end of its input on the
embedded broker (its addresses, paths and database URL replaced with the test's own, nothing else), and its
output is what the job should write. The README's and docs/jobs.md's job files are checked too."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest
import yaml

from sparkeos.jobs.audit import audit
from sparkeos.jobs.pipeline import build
from sparkeos.jobs.runner import start_query
from sparkeos.jobs.spec import JobSpec, load_job, parse_job
from sparkeos.verify import read_records
from support.spark import create_topic, produce

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
RUN_TESTS = {  # every example job file, and the test that runs it
    "people-etl.yaml": "test_people_etl_the_demo_job",
    "people-json.yaml": "test_people_json",
    "people-files.yaml": "test_people_files",
    "people-postgres.yaml": "test_people_postgres",
}
COUNTRIES = ("fr", "de", "cn")


def example(name: str, **replace) -> JobSpec:
    """The example job, with the given fields replaced (dotted paths into the YAML document) and parsed where it
    lies, so that the files it names are its own."""
    path = EXAMPLES / name
    document = yaml.safe_load(path.read_text())
    for dotted, value in replace.items():
        *parents, last = dotted.split("/")
        target = document
        for key in parents:
            target = target[key]
        assert last in target, f"{name} has no {dotted} to replace"
        target[last] = value
    return parse_job(document, str(path), base=EXAMPLES)


def run_available_now(spark, spec: JobSpec) -> None:
    query = start_query(spark, spec, build(spark, spec).output, available_now=True)
    query.awaitTermination(240)
    if query.exception() is not None:
        raise query.exception()


def json_people(count: int) -> list[str]:
    return [json.dumps({"id": i, "name": f"name-{i}", "age": 10 + i % 20, "country": COUNTRIES[i % 3]})
            for i in range(count)] + ["not json", '{"id": "broken']


def adults(count: int) -> list[dict]:
    return [{"id": i, "name": f"name-{i}", "age": 10 + i % 20, "country": COUNTRIES[i % 3]}
            for i in range(count) if 10 + i % 20 >= 18]


def test_every_example_validates_as_written_and_has_a_run_test():
    names = sorted(path.name for path in EXAMPLES.glob("*.yaml"))
    assert names == sorted(RUN_TESTS)
    for name in names:
        spec = load_job(EXAMPLES / name)
        assert spec.name == Path(name).stem
        assert RUN_TESTS[name] in globals()


def yaml_blocks(markdown: Path) -> list[str]:
    return re.findall(r"^```yaml\n(.*?)^```", markdown.read_text(), re.MULTILINE | re.DOTALL)


def test_the_readme_job_file_is_the_example_verbatim():
    assert (EXAMPLES / "people-etl.yaml").read_text() in yaml_blocks(ROOT / "README.md")


def test_the_job_file_of_docs_jobs_md_validates():
    """The annotated job file of docs/jobs.md names every field; its schema file is the examples' people.avsc."""
    first = yaml_blocks(ROOT / "docs" / "jobs.md")[0]
    spec = parse_job(yaml.safe_load(first), "docs/jobs.md", base=EXAMPLES)
    assert spec.window is not None and spec.restart.strategy == "exponential-delay" and spec.spark


def test_people_etl_the_demo_job(spark, tmp_path):
    """The demo's own job (sparkeos.demo.job_document) is this example, addresses aside; run on the demo's input."""
    from sparkeos.demo import DEFAULT_TOPICS, job_document, produce_people
    from sparkeos.stack import LocalStack

    with LocalStack(tmp_path / "broker", schema_registry=True) as stack:
        bootstrap, registry = stack.bootstrap_servers, stack.schema_registry_url
        spec = example("people-etl.yaml", **{"source/kafka.bootstrap.servers": bootstrap, "format/registry": registry,
                                             "checkpoint": str(tmp_path / "ck")})
        demo = parse_job(job_document(bootstrap, registry, tmp_path / "ck", event_time=False), "people-etl.yaml")
        assert json.loads(demo.format.schema) == json.loads(spec.format.schema)
        assert {**demo.__dict__, "format": None, "path": None} == {**spec.__dict__, "format": None, "path": None}
        names = DEFAULT_TOPICS
        assert (names.input, names.output, names.dead_letter, names.group) == (
            spec.source["subscribe"], spec.sink.options["topic"], spec.bad_records.topic, spec.source["kafka.group.id"])
        for topic, partitions in ((names.input, 2), (names.output, 2), (names.dead_letter, 1)):
            create_topic(bootstrap, topic, partitions)
        generated = produce_people(bootstrap, registry, 400, seed=3, late_sentinel=False)
        run_available_now(spark, spec)
        report = audit(spark, spec, bootstrap, names.input, names.output)
        assert report.exact, report.summary()
        assert report.output.delivered == generated.valid
        assert report.dead_letter is not None and report.dead_letter.delivered == generated.corrupt == 5


@pytest.mark.apache_kafka
def test_people_json(spark, broker, tmp_path):
    bootstrap = broker.bootstrap_servers
    spec = example("people-json.yaml", **{"source/kafka.bootstrap.servers": bootstrap,
                                          "checkpoint": str(tmp_path / "ck")})
    create_topic(bootstrap, spec.source["subscribe"], 2)
    create_topic(bootstrap, spec.sink.options["topic"], 2)
    produce(bootstrap, spec.source["subscribe"], json_people(90))
    run_available_now(spark, spec)
    written = Counter((key, json.loads(value)["name"], json.loads(value)["country"])
                      for _, _, key, value, _ in read_records(bootstrap, spec.sink.options["topic"]))
    expected = Counter((str(p["id"]).encode(), p["name"].upper(), p["country"]) for p in adults(90))
    assert written == expected and len(expected) == 50


def test_people_files(spark, broker, tmp_path):
    bootstrap = broker.bootstrap_servers
    output = tmp_path / "people"
    spec = example("people-files.yaml", **{"source/kafka.bootstrap.servers": bootstrap, "sink/path": str(output),
                                           "checkpoint": str(tmp_path / "ck")})
    create_topic(bootstrap, spec.source["subscribe"], 2)
    produce(bootstrap, spec.source["subscribe"], json_people(60))
    run_available_now(spark, spec)
    assert sorted(p.name for p in output.iterdir() if not p.name.startswith("_")) == [f"country={c}"
                                                                                      for c in sorted(COUNTRIES)]
    import pyarrow.dataset

    table = pyarrow.dataset.dataset(output, format="parquet", partitioning="hive").to_table()
    assert sorted(table.column("id").to_pylist()) == list(range(60))
    report = audit(spark, spec, bootstrap, spec.source["subscribe"])
    assert report.exact and report.output.delivered == 60, report.summary()


def test_people_postgres(spark, broker, postgres, tmp_path):
    """The example's url names a database of its own; here it is the test server's (the table name stays)."""
    bootstrap = broker.bootstrap_servers
    spec = example("people-postgres.yaml", **{"source/kafka.bootstrap.servers": bootstrap,
                                              "checkpoint": str(tmp_path / "ck"),
                                              "sink/options/url": postgres.url()})
    table = spec.sink.options["dbtable"]
    with postgres.connect() as connection:
        connection.execute(f"DROP TABLE IF EXISTS {table}")
    create_topic(bootstrap, spec.source["subscribe"], 2)
    produce(bootstrap, spec.source["subscribe"], json_people(75))
    run_available_now(spark, spec)
    with postgres.connect() as connection:
        rows = connection.execute(f"SELECT id, name, age, country FROM {table} ORDER BY id").fetchall()
    assert [dict(zip(("id", "name", "age", "country"), row, strict=True)) for row in rows] == adults(75)
    report = audit(spark, spec, bootstrap, spec.source["subscribe"])
    assert report.exact and report.output.delivered == len(adults(75)), report.summary()
