"""Jars from Maven Central with their runtime dependencies, in a per-user cache shared by every checkout.

Maven resolves them (`mvn dependency:copy-dependencies` on a generated POM), so version ranges, parents and
exclusions mean what they mean to Maven. Each set of coordinates gets one directory, which appears whole or not at
all, so a run interrupted mid-download or two test processes fetching at once never see half a classpath.

Only the standard library is used: `.ci/run` calls this module (through scripts/fetch_jars.py) with the system
Python, before any virtualenv exists. `mvn` is needed only to fill the cache.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from xml.sax.saxutils import escape

COMPLETE = ".complete"


def default_cache_dir() -> Path:
    explicit = os.environ.get("SPARKEOS_CACHE_DIR")
    if explicit:
        return Path(explicit)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "sparkeos"


class MavenUnavailable(RuntimeError):
    """The jars are not in the cache and Maven could not fetch them."""


def is_cached(name: str, coordinates: list[str], cache_dir: Path | None = None) -> bool:
    """Whether `cached_jars` would answer from the cache, without Maven."""
    return (_entry(name, coordinates, cache_dir)[1] / COMPLETE).is_file()


def cached_jars(name: str, coordinates: list[str], cache_dir: Path | None = None) -> list[Path]:
    """The jars of `coordinates` ("group:artifact:version") and of their runtime dependencies, fetched into
    `<cache>/maven/<name>-<digest>` on first use."""
    root, target = _entry(name, coordinates, cache_dir)
    if (target / COMPLETE).is_file():
        return _jars(target)
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one fetch per entry; the others wait and take its result
        if not (target / COMPLETE).is_file():
            _fetch(coordinates, root, target)
    return _jars(target)


def _entry(name: str, coordinates: list[str], cache_dir: Path | None) -> tuple[Path, Path]:
    """The cache's root and the directory of one entry."""
    for coordinate in coordinates:
        if len(coordinate.split(":")) != 3:
            raise ValueError(f"Maven coordinates must be group:artifact:version, got {coordinate!r}")
    digest = hashlib.sha256("\n".join(sorted(coordinates)).encode()).hexdigest()[:12]
    root = (cache_dir or default_cache_dir()) / "maven"
    return root, root / f"{name}-{digest}"


def _jars(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.jar"))


def _fetch(coordinates: list[str], root: Path, target: Path) -> None:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise MavenUnavailable(
            f"{', '.join(coordinates)} are not in {root} and `mvn` is not on PATH to fetch them: install Maven "
            "(Debian: apt-get install maven) or run scripts/fetch_jars.py where it is installed"
        )
    dependencies = "".join(
        "<dependency><groupId>{}</groupId><artifactId>{}</artifactId><version>{}</version></dependency>".format(
            *(escape(part) for part in coordinate.split(":"))
        )
        for coordinate in coordinates
    )
    pom = (
        '<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0</modelVersion>'
        "<groupId>sparkeos.cache</groupId><artifactId>fetch</artifactId><version>1</version>"
        f"<packaging>pom</packaging><dependencies>{dependencies}</dependencies></project>"
    )
    with tempfile.TemporaryDirectory(dir=root, prefix=".fetch-") as scratch:
        scratch_dir = Path(scratch)
        (scratch_dir / "pom.xml").write_text(pom)
        staging = scratch_dir / "jars"
        done = subprocess.run(
            [mvn, "--batch-mode", "--quiet", "--file", str(scratch_dir / "pom.xml"),
             "dependency:copy-dependencies", "-DincludeScope=runtime", f"-DoutputDirectory={staging}"],
            capture_output=True, text=True, timeout=1800,
        )
        if done.returncode != 0 or not staging.is_dir():
            raise MavenUnavailable(
                f"Maven could not fetch {', '.join(coordinates)}:\n{done.stdout[-4000:]}\n{done.stderr[-2000:]}"
            )
        (staging / COMPLETE).write_text("".join(f"{jar.name}\n" for jar in _jars(staging)))
        if target.exists():
            shutil.rmtree(target)  # an entry without its completion mark: left by a fetch that was killed
        staging.rename(target)
