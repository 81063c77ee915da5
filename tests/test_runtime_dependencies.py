"""sparkeos runs on its runtime dependencies alone, as the README's demo command installs it (`pip install -e .`,
no extras): every module it imports is installed by them, and its commands and sinks run in a virtualenv that holds
nothing else (support/runtime_only.py). `.ci/run` also runs the README's demo command verbatim in a fresh virtualenv;
these tests catch a missing dependency sooner, and in the parts the demo does not reach."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pyarrow.dataset
import pytest
import yaml

from support.runtime_only import runtime_environment
from support.spark import create_topic, produce

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "sparkeos"
EXAMPLES = ROOT / "examples"
COUNTRIES = ("fr", "de", "cn")


def run(python: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([str(python), *args], capture_output=True, text=True, timeout=timeout,
                          env=runtime_environment(python))


def imports_of_src() -> dict[str, list[str]]:
    """Every module imported anywhere under src/sparkeos (at the top, in functions, under try), by its top-level
    package: where each is imported."""
    found: dict[str, list[str]] = defaultdict(list)
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [node.module]
            else:
                continue
            for module in modules:
                found[module.split(".")[0]].append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_the_runtime_environment_has_the_runtime_dependencies_and_nothing_else(runtime_python):
    result = run(runtime_python, "-c", "import importlib.util as u, json; print(json.dumps("
                 "{m: u.find_spec(m) is not None for m in ['sparkeos', 'pyspark', 'psycopg', 'pytest', 'pandas']}))")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"sparkeos": True, "pyspark": True, "psycopg": True, "pytest": False,
                                         "pandas": False}
    # Spark's Python workers of a local session there run that interpreter too.
    result = run(runtime_python, "-c", "from sparkeos.spark.workers import worker_python; print(worker_python("
                 "'local[2]'))")
    assert result.returncode == 0, result.stderr
    worker = Path(result.stdout.strip())
    assert worker == runtime_python or f"exec {runtime_python} " in worker.read_text()


def test_every_import_in_src_is_installed_by_a_runtime_dependency(runtime_python):
    """Optional imports included: a module that a plain install lacks is a feature a new user silently lacks (the
    broker's compression codecs were)."""
    imported = imports_of_src()
    third_party = sorted(set(imported) - set(sys.stdlib_module_names) - {"sparkeos"})
    assert "pyspark" in third_party and "pyarrow" in third_party
    result = run(runtime_python, "-c", "import importlib.util, json, sys; print(json.dumps("
                 "[m for m in sys.argv[1:] if importlib.util.find_spec(m) is None]))", *third_party)
    assert result.returncode == 0, result.stderr
    missing = {module: imported[module] for module in json.loads(result.stdout)}
    assert not missing, f"imported under src/ but installed by no runtime dependency: {missing}"


def test_every_module_of_sparkeos_imports_with_runtime_dependencies_only(runtime_python):
    modules = sorted(".".join(("sparkeos", *path.relative_to(SRC).with_suffix("").parts)).removesuffix(".__init__")
                     for path in SRC.rglob("*.py") if path.name != "__main__.py")
    assert len(modules) > 100 and "sparkeos.spark.visible_latency" in modules
    script = ("import importlib, json, sys, traceback\nfailed = {}\nfor name in sys.argv[1:]:\n"
              "    try:\n        importlib.import_module(name)\n"
              "    except BaseException:\n        failed[name] = traceback.format_exc(limit=-2)\n"
              "print(json.dumps(failed))")
    result = run(runtime_python, "-c", script, *modules, timeout=300)
    assert result.returncode == 0, result.stderr
    failed = json.loads(result.stdout.strip().splitlines()[-1])
    assert not failed, "\n".join(f"{name}:\n{trace}" for name, trace in failed.items())


def test_every_command_starts_with_runtime_dependencies_only(runtime_python):
    commands = ["broker", "run", "audit", "demo", "lag"]
    for command in commands:
        result = run(runtime_python, "-m", "sparkeos", command, "--help")
        assert result.returncode == 0 and "usage: sparkeos" in result.stdout, f"sparkeos {command}: {result.stderr}"
    result = run(runtime_python, "-m", "sparkeos", "--help")
    assert all(command in result.stdout for command in commands), "a command of sparkeos is not checked here"


def json_people(count: int) -> list[str]:
    return [json.dumps({"id": i, "name": f"name-{i}", "age": 10 + i % 20, "country": COUNTRIES[i % 3]})
            for i in range(count)]


@pytest.mark.parametrize("example", ["people-files.yaml", "people-postgres.yaml"])
def test_a_sinks_job_runs_and_audits_with_runtime_dependencies_only(runtime_python, broker, postgres, tmp_path,
                                                                   example):
    """`sparkeos run`, `sparkeos audit` and `sparkeos lag` on the example job of the sink, as a user runs them after a
    plain install; the Kafka sink's job is the demo's (tests/test_demo.py). Counted by a reader that knows nothing of
    sparkeos."""
    bootstrap = broker.bootstrap_servers
    document = yaml.safe_load((EXAMPLES / example).read_text())
    document["source"]["kafka.bootstrap.servers"] = bootstrap
    document["checkpoint"] = str(tmp_path / "checkpoint")
    files = document["sink"]["format"] == "sparkeos.files"
    if files:
        document["sink"]["path"] = str(tmp_path / "output")
    else:
        table = f"public.adults_{tmp_path.name.replace('-', '_').lower()}"
        document["sink"]["options"].update(url=postgres.url(), dbtable=table)
    topic = document["source"]["subscribe"] = f"people-{tmp_path.name}"
    job = tmp_path / example
    job.write_text(yaml.safe_dump(document))
    create_topic(bootstrap, topic, 2)
    produce(bootstrap, topic, json_people(60))

    result = run(runtime_python, "-m", "sparkeos", "run", str(job), "--available-now", "--master", "local[2]",
                 timeout=280)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    if files:
        table_read = pyarrow.dataset.dataset(tmp_path / "output", format="parquet", partitioning="hive").to_table()
        written = sorted(table_read.column("id").to_pylist())
        expected = list(range(60))
    else:
        with postgres.connect() as connection:
            written = [row[0] for row in connection.execute(f"SELECT id FROM {table} ORDER BY id").fetchall()]
        expected = [i for i in range(60) if 10 + i % 20 >= 18]
    assert written == expected

    result = run(runtime_python, "-m", "sparkeos", "audit", str(job), "--bootstrap-servers", bootstrap,
                 "--input", topic, "--master", "local[2]", "--json", timeout=280)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["delivered"] == report["expected"] == len(expected)

    result = run(runtime_python, "-m", "sparkeos", "lag", "--checkpoint", document["checkpoint"],
                 "--bootstrap-servers", bootstrap, "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["total_lag"] == 0
