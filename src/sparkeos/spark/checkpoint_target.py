"""The target a query's checkpoint writes to, recorded in the checkpoint, so that a checkpoint that belongs to
another target is refused.

Spark's checkpoint says how far the query read, not where it wrote. A checkpoint copied for another query, or a
query pointed at another table, directory or topic, would write to that target only what comes after the
checkpoint's last batch: the new target would lack everything before, and its readers could not tell. So the
first stream writer of a checkpoint records its sink and target in ``<checkpointLocation>/sparkeos/target``, and
every later one compares: another target is refused with an error naming both. To write the output to another
target, start the query with a new checkpoint. Until Spark logged a batch committed (``<checkpoint>/commits``), the
record may be replaced: a first run that failed before it wrote anything binds nothing.

The record is created once (locally, a synced file linked to its name; elsewhere written and read back), so two
first writers with different targets cannot both pass. Spark builds a stream writer for every batch: a process
checks a (checkpoint, target) once.

Spark hands a sink the option ``checkpointLocation`` only when the query sets it; a query whose checkpoint comes from
``spark.sql.streaming.checkpointLocation`` is not checked. Nor is a checkpoint on a file system pyarrow cannot open
from its URI alone (say, ``s3a://`` with credentials in Hadoop's settings): that is reported, and the query goes on.
"""

from __future__ import annotations

import json
import logging
import posixpath
from collections.abc import Mapping

import pyarrow as pa
import pyarrow.fs as pafs

from ..locations import create_local_file_exclusively, open_location
from .reports import report

RECORD = "sparkeos/target"
_checked: set[tuple[str, str, str]] = set()  # (location, format, target) this process checked or cannot check


class CheckpointOfAnotherTarget(ValueError):
    """The query's checkpoint wrote to another target than the one it is now given."""


def claim_checkpoint(options: Mapping[str, str], format_name: str, target: str | None) -> None:
    """Record that the checkpoint named by ``options`` writes to ``target`` of ``format_name``, or refuse it if it
    wrote to another; nothing without a checkpointLocation option or a target."""
    location = next((value for key, value in options.items() if key.lower() == "checkpointlocation"), None)
    if not location or target is None or (location, format_name, target) in _checked:
        return
    claimed = {"format": format_name, "target": target}
    try:
        fs, root = open_location(location)
        recorded = _read(fs, f"{root}/{RECORD}")
        if recorded is None or (recorded != claimed and not _committed_any(fs, root)):
            recorded = _record(fs, f"{root}/{RECORD}", claimed, replace=recorded is not None)
    except (OSError, pa.ArrowException) as exc:  # what pyarrow raises for a file system it cannot reach or open
        report(logging.WARNING, f"cannot read or write {location}/{RECORD} ({exc}): whether the query's checkpoint "
                                "belongs to another target is not checked")
        _checked.add((location, format_name, target))
        return
    if recorded != claimed:
        raise CheckpointOfAnotherTarget(
            f"the checkpoint {location} belongs to the {recorded.get('format')} sink writing to "
            f"{recorded.get('target')}, and this query writes to {target} ({format_name}). Spark would go on from "
            "the checkpoint's last batch, so the new target would lack everything written before. Start the query "
            f"with a new checkpoint to write the output to {target}, or give it its own target back."
        )
    _checked.add((location, format_name, target))


def _read(fs: pafs.FileSystem, path: str) -> dict | None:
    try:
        with fs.open_input_stream(path) as stream:
            data = stream.read()
    except FileNotFoundError:
        return None
    if not data.strip():  # a writer that died before writing it, where creating and writing are two steps
        return None
    try:
        recorded = json.loads(data)
    except ValueError:
        recorded = None
    if not isinstance(recorded, dict):
        raise CheckpointOfAnotherTarget(f"{path} does not say which target the checkpoint belongs to ({data[:80]!r}); "
                                        "remove it, and the query's next start records its target anew")
    return recorded


def _committed_any(fs: pafs.FileSystem, root: str) -> bool:
    """Whether Spark logged a batch of the checkpoint committed."""
    infos = fs.get_file_info(pafs.FileSelector(f"{root}/commits", allow_not_found=True))
    return any(info.base_name.isdigit() for info in infos)


def _record(fs: pafs.FileSystem, path: str, claimed: dict, replace: bool) -> dict:
    """Create the record (or replace it, where nothing was committed); the record that holds."""
    data = json.dumps(claimed).encode()
    fs.create_dir(posixpath.dirname(path), recursive=True)
    if isinstance(fs, pafs.LocalFileSystem) and not replace:
        if not create_local_file_exclusively(path, data):
            return _read(fs, path) or claimed
        return claimed
    with fs.open_output_stream(path) as stream:
        stream.write(data)
    return _read(fs, path) or claimed
