"""How a checkpoint is bound to its target (`sparkeos.spark.checkpoint_target`), on a real directory: the queries
that write through the three sinks are in test_sink_contract.py."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from sparkeos.spark.checkpoint_target import RECORD, CheckpointOfAnotherTarget, claim_checkpoint


def claim(checkpoint: Path, target: str) -> None:
    claim_checkpoint({"checkpointLocation": str(checkpoint)}, "sparkeos.files", target)


def test_a_first_run_that_committed_nothing_binds_nothing(tmp_path: Path) -> None:
    """A first run that failed before Spark logged a batch committed (a misspelled target) wrote nothing: the
    corrected query is bound to its own target, and from its first committed batch on the checkpoint is."""
    checkpoint = tmp_path / "ck"
    claim(checkpoint, "directory /typo")
    claim(checkpoint, "directory /out")
    assert json.loads((checkpoint / RECORD).read_text())["target"] == "directory /out"
    (checkpoint / "commits").mkdir()
    (checkpoint / "commits" / "0").write_text("v1\n{}")
    with pytest.raises(CheckpointOfAnotherTarget, match="belongs to the sparkeos.files sink writing to directory /out"):
        claim(checkpoint, "directory /elsewhere")


def test_first_writers_of_a_committed_checkpoint_agree_on_one_target(tmp_path: Path, monkeypatch) -> None:
    """Two drivers starting from one checkpoint (copied with Spark's logs, without the record) at the same moment,
    each with its own target: one target is recorded, and every other is refused. Every writer is held until all
    of them found no record, so that they create it at the same moment."""
    import threading

    from sparkeos.spark import checkpoint_target

    checkpoint = tmp_path / "ck"
    (checkpoint / "commits").mkdir(parents=True)
    (checkpoint / "commits" / "0").write_text("v1\n{}")
    targets = [f"directory /out-{n}" for n in range(6)]
    all_looked, looked, read = threading.Barrier(len(targets)), threading.local(), checkpoint_target._read

    def read_then_wait(fs, path):
        found = read(fs, path)
        if not getattr(looked, "once", False):
            looked.once = True
            all_looked.wait(30)
        return found

    monkeypatch.setattr(checkpoint_target, "_read", read_then_wait)

    def attempt(target: str) -> bool:
        try:
            claim(checkpoint, target)
        except CheckpointOfAnotherTarget:
            return False
        return True

    with ThreadPoolExecutor(len(targets)) as pool:
        passed = list(pool.map(attempt, targets))
    recorded = json.loads((checkpoint / RECORD).read_text())["target"]
    assert passed.count(True) == 1 and targets[passed.index(True)] == recorded


def test_a_record_that_cannot_be_read_is_named(tmp_path: Path) -> None:
    checkpoint = tmp_path / "ck"
    (checkpoint / RECORD).parent.mkdir(parents=True)
    (checkpoint / RECORD).write_text("[1, 2]")
    with pytest.raises(CheckpointOfAnotherTarget, match="does not say which target"):
        claim(checkpoint, "directory /out")


def test_a_location_given_as_a_uri_is_opened_as_one(tmp_path: Path) -> None:
    claim_checkpoint({"checkpointLocation": f"file://{tmp_path}/ck"}, "sparkeos.files", "directory /out")
    assert (tmp_path / "ck" / RECORD).exists()
