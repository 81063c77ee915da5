"""A deliberately broken sparkeos.files sink, for `sparkeos chaos` to catch while the job runs: on PYTHONPATH, every
Python process (the driver and Spark's workers) imports it at start. It stages each task's files in the output
directory itself, where readers see them, and its commit takes a while before it moves them under their final names:
readers see the rows of a batch not yet committed (without their partition column), which then vanish. Once every
batch committed, what it leaves is exact: only a reader watching the output while the job runs can tell."""

import time

from sparkeos.spark.files.sink import FileSink

_commit = FileSink.commit


def _visible_staging_dir(self, query: str) -> str:
    return f"{self.root}/in-progress-{query}"


def _slow_commit(self, handle) -> None:
    time.sleep(2)
    _commit(self, handle)


FileSink._staging_dir = _visible_staging_dir
FileSink.commit = _slow_commit
