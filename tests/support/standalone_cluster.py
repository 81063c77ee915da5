"""A real Spark standalone cluster on this machine (sparkeos.chaos.cluster), for the tests that run on one: every
process carries the tag of `support.crash`, so that `stop` can prove nothing survived."""

from __future__ import annotations

from pathlib import Path

from sparkeos.chaos import cluster
from support.crash import TAG_VARIABLE, wait_until_no_tagged_processes


class StandaloneCluster(cluster.StandaloneCluster):
    """Spark's standalone master and workers, tagged."""

    def __init__(self, directory: Path, tag: str):
        super().__init__(directory, env={TAG_VARIABLE: tag})
        self.tag = tag

    def stop(self) -> None:
        super().stop()
        wait_until_no_tagged_processes(self.tag)
