"""sparkeos runs on its runtime dependencies alone, as the README's demo command installs it (`pip install -e .`,
no extras): every module it imports is installed by them, and its commands and sinks run in a virtualenv that holds
nothing else (support/runtime_only.py). `.ci/run` also runs the README's demo command verbatim in a fresh virtualenv;
these tests catch a missing dependency sooner, and in the parts the demo does not reach. The sinks' jobs run, are
audited and have their lag read there under `sparkeos chaos` (tests/test_chaos.py)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from support.runtime_only import runtime_environment

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
    commands = ["broker", "run", "audit", "demo", "chaos", "lag", "sinks"]
    for command in commands:
        result = run(runtime_python, "-m", "sparkeos", command, "--help")
        assert result.returncode == 0 and "usage: sparkeos" in result.stdout, f"sparkeos {command}: {result.stderr}"
    result = run(runtime_python, "-m", "sparkeos", "--help")
    assert all(command in result.stdout for command in commands), "a command of sparkeos is not checked here"


@pytest.mark.parametrize("entry", ["sparkeos.jobs.submit", "sparkeos.jobs.runner", "sparkeos.cli", "sparkeos.chaos",
                                   "sparkeos.spark", "sparkeos.demo"])
def test_each_entry_point_imports_first_in_a_fresh_interpreter(runtime_python, entry):
    """What spark-submit, `sparkeos run`'s driver, the CLI and Spark's workers import first: in one process with every
    module (above), an import cycle stays hidden whenever another module happens to be imported before."""
    result = run(runtime_python, "-c", f"import {entry}")
    assert result.returncode == 0, result.stderr[-3000:]
