"""The target a query's checkpoint writes to, recorded in the checkpoint, so that a checkpoint that belongs to
another target is refused.

Spark's checkpoint says how far the query read, not where it wrote. A checkpoint copied for another query, or a
query pointed at another table, directory or topic, would write to that target only what comes after the
checkpoint's last batch: the new target would lack everything before, and its readers could not tell. So the
first stream writer of a checkpoint records its sink and target in ``<checkpointLocation>/sparkeos/target``, and
every later one compares: another target is refused with an error naming both. To write the output to another
target, start the query with a new checkpoint.

Spark hands a sink the option ``checkpointLocation`` only when the query sets it; a query whose checkpoint comes from
``spark.sql.streaming.checkpointLocation`` is not checked. Nor is a checkpoint on a file system pyarrow cannot open
from its URI alone (say, ``s3a://`` with credentials in Hadoop's settings): that is reported, and the query goes on.
"""

from __future__ import annotations

import json
import logging
import posixpath
from collections.abc import Mapping

import pyarrow.fs as pafs

from .reports import report

RECORD = "sparkeos/target"


class CheckpointOfAnotherTarget(ValueError):
    """The query's checkpoint wrote to another target than the one it is now given."""


def _open(location: str) -> tuple[pafs.FileSystem, str]:
    if "://" not in location:
        return pafs.LocalFileSystem(), posixpath.abspath(location)
    if location.startswith("s3a://"):
        location = "s3://" + location[len("s3a://"):]
    fs, path = pafs.FileSystem.from_uri(location)
    return fs, path.rstrip("/")


def claim_checkpoint(options: Mapping[str, str], format_name: str, target: str | None) -> None:
    """Record that the checkpoint named by ``options`` writes to ``target`` of ``format_name``, or refuse it if it
    wrote to another; nothing without a checkpointLocation option or a target."""
    location = next((value for key, value in options.items() if key.lower() == "checkpointlocation"), None)
    if not location or target is None:
        return
    claimed = {"format": format_name, "target": target}
    try:
        fs, root = _open(location)
        path = f"{root}/{RECORD}"
        try:
            with fs.open_input_stream(path) as stream:
                recorded = json.loads(stream.read())
        except FileNotFoundError:
            fs.create_dir(posixpath.dirname(path), recursive=True)
            with fs.open_output_stream(path) as stream:
                stream.write(json.dumps(claimed).encode())
            return
    except (OSError, ValueError) as exc:  # pyarrow's errors are OSError (and ArrowInvalid a ValueError)
        report(logging.WARNING, f"cannot read or write {location}/{RECORD} ({exc}): whether the query's checkpoint "
                                "belongs to another target is not checked")
        return
    if recorded != claimed:
        raise CheckpointOfAnotherTarget(
            f"the checkpoint {location} belongs to the {recorded.get('format')} sink writing to "
            f"{recorded.get('target')}, and this query writes to {target} ({format_name}). Spark would go on from "
            "the checkpoint's last batch, so the new target would lack everything written before. Start the query "
            f"with a new checkpoint to write the output to {target}, or give it its own target back."
        )
