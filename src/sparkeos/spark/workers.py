"""Which program Spark runs for its Python workers in a local session (PYSPARK_PYTHON).

Spark puts three archives first on every Python worker's PYTHONPATH: its zipped copy of pyspark
(`$SPARK_HOME/python/lib/pyspark.zip`), its zipped copy of py4j, and the spark-core jar (where distributions once
packed pyspark). Python caches no bytecode for modules imported from a zip, so each new worker compiles pyspark and
py4j again; and it reads an archive's whole directory in Python code when a worker first searches it, and again when
Spark's worker set-up calls `importlib.invalidate_caches`, which for the jar's thousands of entries is slow each
time. Spark starts such a process for every streaming query with a Python source (and for every Python data source
it plans), and gives each a fixed time to connect back, so on a loaded machine the compile can fail a query.
Imported from the installed package, Spark's streaming source runner starts several times faster than from the
pyspark zip, and without py4j's zip and the jar the whole process start costs markedly less CPU.

When pyspark is pip-installed, SPARK_HOME is the installed package's own directory: the pyspark zip holds the same
files as the package, the py4j of the zip's version is installed beside it, and the jar holds no Python module. For a
local master, `worker_python` then returns a small sh script that drops the archives the installed packages make
needless from PYTHONPATH and execs this interpreter, which imports pyspark and py4j from the packages instead.
Anywhere else (a cluster, whose executors need not have the script; a Spark distribution of its own in SPARK_HOME; no
POSIX sh; no writable cache directory) it returns this interpreter, as Spark would run it.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import os
import shlex
import sys
import zipfile
from pathlib import Path

SCRIPT_TEMPLATE = """#!/bin/sh
# Written by sparkeos.spark.workers: runs the interpreter below for Spark's Python workers without the
# archives on PYTHONPATH that the installed packages make needless (recompiled and rescanned at every start).
set -f
kept=
IFS=:
for entry in $PYTHONPATH; do
  case $entry in
    {needless}) ;;
    *) kept=${{kept:+$kept:}}$entry ;;
  esac
done
unset IFS
PYTHONPATH=$kept
export PYTHONPATH
exec {python} "$@"
"""


def worker_python(master: str | None) -> str:
    """The program for PYSPARK_PYTHON: the archive-skipping script for a local master where it can be used, else
    this interpreter."""
    if not (master or "").startswith("local"):
        return sys.executable
    needless = needless_python_path(spark_package(), installed_py4j_version())
    if not needless or not os.path.exists("/bin/sh"):
        return sys.executable
    text = SCRIPT_TEMPLATE.format(python=shlex.quote(sys.executable), needless="|".join(map(shlex.quote, needless)))
    try:
        return str(write_script(text))
    except OSError:
        return sys.executable


def spark_package() -> Path | None:
    """The installed pyspark package's directory when it is SPARK_HOME too (Spark installed with pip), else None."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        return None
    package = Path(spec.origin).resolve().parent
    spark_home = os.environ.get("SPARK_HOME")
    if spark_home and Path(spark_home).resolve() != package:
        return None
    return package


def installed_py4j_version() -> str | None:
    try:
        return importlib.metadata.version("py4j")
    except importlib.metadata.PackageNotFoundError:
        return None


def needless_python_path(package: Path | None, py4j_version: str | None) -> list[str]:
    """The entries Spark puts on its workers' PYTHONPATH that `package`, a pip-installed pyspark, and the installed
    py4j of `py4j_version` make needless; none unless Spark's pyspark zip is among them."""
    if package is None:
        return []
    lib = package / "python" / "lib"
    pyspark_zip = lib / "pyspark.zip"
    if not pyspark_zip.is_file():
        return []
    needless = [pyspark_zip]
    py4j_zip = lib / f"py4j-{py4j_version}-src.zip"
    if py4j_version is not None and py4j_zip.is_file():
        needless.append(py4j_zip)
    # Spark adds the jar it was loaded from, spark-core's.
    needless += [jar for jar in sorted((package / "jars").glob("spark-core_*.jar")) if not holds_python(jar)]
    return [str(path) for path in needless]


def holds_python(archive: Path) -> bool:
    """Whether `archive` may hold Python modules (an unreadable one may)."""
    try:
        with zipfile.ZipFile(archive) as opened:
            return any(name.endswith((".py", ".pyc")) for name in opened.namelist())
    except (OSError, zipfile.BadZipFile):
        return True


def write_script(text: str) -> Path:
    """Write `text` once as an executable in the user's cache directory, named by its content."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "sparkeos"
    cache.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = cache / f"python-worker-{hashlib.sha256(text.encode()).hexdigest()[:16]}"
    if path.is_file() and os.access(path, os.X_OK) and path.read_text() == text:
        return path
    partial = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    partial.write_text(text)
    partial.chmod(0o755)
    os.replace(partial, path)
    return path
