"""Directories named by a path or a URI, as the sinks, their control files and Spark's checkpoints are: the file
system pyarrow opens for one, and a file created whole and only once on the local one."""

from __future__ import annotations

import os
import posixpath
import re
import uuid

import pyarrow.fs as pafs

_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def open_location(location: str) -> tuple[pafs.FileSystem, str]:
    """pyarrow's file system for ``location`` and the path within it: a local path (made absolute), or a URI pyarrow
    opens (file:, s3:// or Hadoop's s3a://, hdfs://, gs://), its settings and credentials from the URI and the
    environment."""
    if not _URI.match(location):
        return pafs.LocalFileSystem(), posixpath.abspath(location)
    if location.startswith("s3a://"):
        location = "s3://" + location[len("s3a://"):]
    fs, path = pafs.FileSystem.from_uri(location)
    return fs, path.rstrip("/")


def create_local_file_exclusively(path: str, data: bytes) -> bool:
    """Write ``path`` whole unless it exists; whether this call created it. The bytes go to a temporary file that
    is synced and then linked to ``path`` (link, unlike rename, fails if the name exists), so the name never
    shows a partial file, and what it records survives a power cut once written."""
    directory = os.path.dirname(path)
    temporary = os.path.join(directory, f".{os.path.basename(path)}-{uuid.uuid4().hex[:8]}")
    with open(temporary, "wb") as stream:
        stream.write(data)
        stream.flush()
        os.fsync(stream.fileno())
    try:
        os.link(temporary, path)
    except FileExistsError:
        return False
    finally:
        os.unlink(temporary)
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
    return True
