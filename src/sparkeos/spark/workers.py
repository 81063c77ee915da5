"""Which program Spark runs for its Python workers in a local session (PYSPARK_PYTHON).

Spark puts its own zipped copy of pyspark, `$SPARK_HOME/python/lib/pyspark.zip`, first on every Python
worker's PYTHONPATH. Python caches no bytecode for modules imported from a zip, so each new worker compiles
pyspark again: importing Spark's streaming source runner took 0.99 s that way, and 0.21 s from the installed
package. Spark starts such a process for every streaming query with a Python source (and for every Python data
source it plans), and gives each a fixed 10 s to connect back, so on a loaded machine the compile can fail a
query.

When pyspark is pip-installed, SPARK_HOME is the installed package's own directory and the zip holds the same
files as the package. For a local master, `worker_python` then returns a small sh script that drops the zip
from PYTHONPATH and execs this interpreter, which imports pyspark from the package instead. Anywhere else (a
cluster, whose executors need not have the script; a Spark distribution of its own in SPARK_HOME; no POSIX sh;
no writable cache directory) it returns this interpreter, as Spark would run it.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shlex
import sys
from pathlib import Path

SCRIPT_TEMPLATE = """#!/bin/sh
# Written by sparkeos.spark.workers: runs the interpreter below for Spark's Python workers
# without Spark's zipped copy of pyspark, which is recompiled at every start, on PYTHONPATH.
set -f
kept=
IFS=:
for entry in $PYTHONPATH; do
  [ "$entry" = {zip} ] || kept=${{kept:+$kept:}}$entry
done
unset IFS
PYTHONPATH=$kept
export PYTHONPATH
exec {python} "$@"
"""


def worker_python(master: str | None) -> str:
    """The program for PYSPARK_PYTHON: the zip-skipping script for a local master where it can be used, else
    this interpreter."""
    if not (master or "").startswith("local"):
        return sys.executable
    zipped = spark_pyspark_zip()
    if zipped is None or not os.path.exists("/bin/sh"):
        return sys.executable
    try:
        return str(write_script(SCRIPT_TEMPLATE.format(python=shlex.quote(sys.executable), zip=shlex.quote(zipped))))
    except OSError:
        return sys.executable


def spark_pyspark_zip() -> str | None:
    """The path of Spark's pyspark.zip when it is a copy of the installed pyspark package, else None."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        return None
    package = Path(spec.origin).resolve().parent
    spark_home = os.environ.get("SPARK_HOME")
    if spark_home and Path(spark_home).resolve() != package:
        return None
    zipped = package / "python" / "lib" / "pyspark.zip"
    return str(zipped) if zipped.is_file() else None


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
