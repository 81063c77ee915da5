"""Class-data-sharing archives for the JVMs sparkeos starts: a JVM that maps an archive of the classes an earlier run
of the same program loaded (JDK 13+, `-XX:SharedArchiveFile`) skips parsing and verifying them, which is most of the
start-up of Apache Kafka's nodes and of Spark's drivers.

An archive belongs to one JDK and one class path: its name holds a digest of the `java` binary, the JDK's module
image and each class-path entry (path, size, modification time), so a changed jar or JDK gets an archive of its own.
It is made in the cache (`<cache>/class-archives/<name>-<digest>.jsa`) by a run started with :func:`dump_options`
that exits normally (the JVM writes the archive as it exits), then :func:`publish`-ed whole under its name; a run
that is killed leaves nothing under it. An archive is never required: without one, or with one the JVM finds
unusable, the JVM loads its classes as usual, silently (its CDS logging is off, so nothing reaches the program's
output).

Only the standard library is imported: scripts/fetch_jars.py imports apache_kafka.py, which uses this module, with the
system Python.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import uuid
from collections.abc import Sequence
from pathlib import Path

from .maven import default_cache_dir

# The JVM's class-data-sharing messages (an archive made for another class path, a class it cannot archive) would
# reach the program's own output; falling back is the designed behaviour, not a warning.
QUIET = "-Xlog:cds*=off"


def archive_path(name: str, java: str, classpath: Sequence[str | Path], cache_dir: Path | None = None) -> Path:
    """Where the archive of program ``name`` run by ``java`` on ``classpath`` is, or will be."""
    digest = hashlib.sha256()
    binary = Path(os.path.realpath(shutil.which(java) or java))
    for entry in [binary, binary.parent.parent / "lib" / "modules", *map(Path, classpath)]:
        try:
            stat = entry.stat()
            digest.update(f"{entry}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
        except OSError:
            digest.update(f"{entry}\0missing\n".encode())
    return (cache_dir or default_cache_dir()) / "class-archives" / f"{name}-{digest.hexdigest()[:12]}.jsa"


def use_options(archive: Path) -> list[str]:
    """The JVM options that map ``archive``; none while it does not exist."""
    return [f"-XX:SharedArchiveFile={archive}", QUIET] if archive.is_file() else []


def dump_options(archive: Path) -> tuple[list[str], Path]:
    """The JVM options of a run that makes ``archive``, and the temporary file it writes as it exits, for
    :func:`publish`."""
    archive.parent.mkdir(parents=True, exist_ok=True)
    temporary = archive.with_name(f".{archive.name}.{uuid.uuid4().hex[:8]}")
    return [f"-XX:ArchiveClassesAtExit={temporary}", QUIET], temporary


def publish(temporary: Path, archive: Path) -> bool:
    """Put what a run made with :func:`dump_options` wrote under the archive's name (atomically, so a JVM never maps
    a partial archive); whether there was one to put. Call it once that run's JVM has exited."""
    if not temporary.is_file() or temporary.stat().st_size == 0:
        temporary.unlink(missing_ok=True)
        return False
    os.replace(temporary, archive)
    return True
