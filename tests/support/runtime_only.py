"""A virtualenv holding sparkeos and its runtime dependencies only: what the README's demo command
(`pip install -e .`, no extras) gives a new user, made without a network from the test environment's own files.

Its site-packages links to the installed files of sparkeos and of every distribution that sparkeos's runtime
requirements bring in, following their requirements (and the extras they name, as `psycopg[binary]`) down to the
last one, and to nothing else: the dev extras and whatever only they bring in (pandas and numpy among them) are not
there. Programs run with `runtime_environment()` use its interpreter, and so do the Python workers of the Spark
sessions they start.
"""

from __future__ import annotations

import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

PROJECT = "sparkeos"
# Variables that would point a program of the runtime environment, or its Spark's Python workers, at the test
# environment's interpreter or packages (the test process's own Spark sessions set PYSPARK_PYTHON).
DROPPED_VARIABLES = ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "PYTHONPATH", "PYTHONHOME")


def runtime_distributions(project: str = PROJECT) -> dict[str, metadata.Distribution]:
    """The installed distributions a plain install of `project` brings, by canonical name, `project` included."""
    found: dict[str, metadata.Distribution] = {}
    visited: set[tuple[str, str]] = set()
    todo: list[tuple[str, str]] = [(project, "")]  # (distribution, one extra of it asked for, or "")
    while todo:
        name, extra = todo.pop()
        if (canonicalize_name(name), extra) in visited:
            continue
        visited.add((canonicalize_name(name), extra))
        try:
            distribution = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            raise RuntimeError(f"{name}, a runtime requirement of {project}, is not installed") from None
        found[canonicalize_name(name)] = distribution
        for text in distribution.requires or ():
            requirement = Requirement(text)
            if requirement.marker is None or requirement.marker.evaluate({"extra": extra}):
                todo.append((requirement.name, ""))
                todo.extend((requirement.name, wanted) for wanted in requirement.extras)
    return found


def make_runtime_venv(root: Path) -> Path:
    """Make the virtualenv at `root`; returns its interpreter."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True, timeout=120)
    python = root / "bin" / "python"
    site = Path(subprocess.check_output(
        [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], text=True, timeout=60).strip())
    for name, distribution in sorted(runtime_distributions().items()):
        if distribution.files is None:
            raise RuntimeError(f"{name} has no record of its installed files: cannot link it")
        base = Path(str(distribution.locate_file("")))
        # A distribution's files below site-packages; ".." leads to its scripts, which `python -m` does not need.
        for top in sorted({file.parts[0] for file in distribution.files} - {"..", "__pycache__"}):
            link = site / top
            if not link.exists() and not link.is_symlink():
                link.symlink_to(base / top)
    return python


def runtime_environment(python: Path) -> dict[str, str]:
    """Environment variables for running `python` (of `make_runtime_venv`) as a new user's shell would, after
    activating it."""
    env = {key: value for key, value in os.environ.items() if key not in DROPPED_VARIABLES}
    env["VIRTUAL_ENV"] = str(python.parent.parent)
    env["PATH"] = f"{python.parent}{os.pathsep}{env.get('PATH', '')}"
    return env
