"""The Java kafka-clients jars, for checking the broker against Kafka's reference client.

They come from the PyPI wheel `shigawire-apache-flink-libraries`, which bundles kafka-clients 3.9.1 with the
slf4j, lz4, snappy and zstd jars it needs. The wheel is ~92 MB of mostly Flink jars we do not use, so it is not a
dev dependency (that would put ~100 MB and a `pyflink` package into every venv): the first call downloads it
once, pinned by hash, and keeps only the five jars (~19 MB) in a per-user cache shared by every checkout.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

KAFKA_CLIENTS_VERSION = "3.9.1"
WHEEL_REQUIREMENT = (
    "shigawire-apache-flink-libraries==2.0.0.post1"
    " --hash=sha256:aaa65537d3f0c0ff279185d8243024f0efd95788ba044bf249ba0f40b69289cd"
)
WHEEL_JAR_DIR = "pyflink/lib"
JARS = ("kafka-clients.jar", "slf4j-api.jar", "lz4-java.jar", "snappy-java.jar", "zstd-jni.jar")


def default_cache_dir() -> Path:
    explicit = os.environ.get("SPARKEOS_CACHE_DIR")
    if explicit:
        return Path(explicit)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "sparkeos"


def kafka_client_jars(cache_dir: Path | None = None) -> list[Path]:
    """Paths of kafka-clients and its runtime jars, downloading them on first use."""
    root = cache_dir or default_cache_dir()
    target = root / f"kafka-clients-{KAFKA_CLIENTS_VERSION}"
    jars = [target / name for name in JARS]
    if all(jar.is_file() for jar in jars):
        return jars
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root, prefix=".download-") as scratch:
        scratch_dir = Path(scratch)
        requirements = scratch_dir / "requirements.txt"
        requirements.write_text(WHEEL_REQUIREMENT + "\n")
        download = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
             "--dest", str(scratch_dir), "--requirement", str(requirements)],
            capture_output=True, text=True, timeout=900,
        )
        if download.returncode != 0:
            raise RuntimeError(f"pip download of the kafka-clients wheel failed:\n{download.stdout}\n{download.stderr}")
        (wheel,) = scratch_dir.glob("*.whl")
        staging = scratch_dir / "jars"
        staging.mkdir()
        with zipfile.ZipFile(wheel) as archive:
            for name in JARS:
                with archive.open(f"{WHEEL_JAR_DIR}/{name}") as source, open(staging / name, "wb") as sink:
                    shutil.copyfileobj(source, sink)
        version = _jar_kafka_version(staging / "kafka-clients.jar")
        if version != KAFKA_CLIENTS_VERSION:
            raise RuntimeError(f"the wheel carries kafka-clients {version}, expected {KAFKA_CLIENTS_VERSION}")
        if target.exists() and not all(jar.is_file() for jar in jars):
            shutil.rmtree(target)  # a partial entry left by hand; replace it whole
        # A rename makes the cache entry appear whole; a concurrent run that got there first wins.
        try:
            staging.rename(target)
        except OSError:
            if not all(jar.is_file() for jar in jars):
                raise
    return jars


def _jar_kafka_version(jar: Path) -> str | None:
    with zipfile.ZipFile(jar) as archive:
        for line in archive.read("kafka/kafka-version.properties").decode().splitlines():
            key, _, value = line.partition("=")
            if key.strip() == "version":
                return value.strip()
    return None
