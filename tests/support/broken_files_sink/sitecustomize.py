"""A deliberately broken sparkeos.files sink, for `sparkeos chaos` to catch: on PYTHONPATH, every Python process
(the driver and Spark's workers) imports it at start. Its commit copies each staged file under a new name instead
of moving it, so committing a handle twice (as the next driver does for a decision a killed driver left half
committed) publishes its rows twice. The job file still says sparkeos.files: an at-least-once sink posing as an
exactly-once one."""

import uuid

from pyarrow import fs as pafs

from sparkeos.spark.files.sink import FileSink


def _commit_by_copy(self, handle) -> None:
    for staged, final in handle.data["files"]:
        directory, _, name = final.rpartition("/")
        copy = f"{directory}/{uuid.uuid4().hex[:8]}-{name}" if directory else f"{uuid.uuid4().hex[:8]}-{name}"
        self.fs.create_dir(f"{self.root}/{directory}" if directory else self.root, recursive=True)
        if self.fs.get_file_info(f"{self.root}/{staged}").type == pafs.FileType.File:
            self.fs.copy_file(f"{self.root}/{staged}", f"{self.root}/{copy}")


FileSink.commit = _commit_by_copy
