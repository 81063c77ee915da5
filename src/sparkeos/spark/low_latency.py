"""The low-latency switch: Spark settings that shorten every micro-batch, the delivery guarantee unchanged.

A record waits for the micro-batch after the one running when it arrived, so its latency is one to two batch
cycles, and a cycle's fixed costs (planning, the offset and commit logs, task launch, the sink's set-up and
commit) count twice. The switch takes off what Spark's defaults add for no benefit to a streaming query:

- `spark.sql.streaming.checkpointFileManagerClass`: Spark's default manager writes the offset and commit logs
  through Hadoop's FileContext, which, without Hadoop's native library (pip's pyspark has none), starts `chmod`
  and `readlink` processes for every file. The FileSystem-based manager writes the same files with the same
  atomic rename, starting fewer. Renames are atomic on local disks and HDFS; on object stores neither manager
  makes a checkpoint safe, and the switch changes nothing there.
- `spark.sql.execution.arrow.maxRecordsPerBatch`: Spark hands a sink task its input in Arrow batches of this
  many rows (default 10,000). A sink task starts writing (the Kafka sink begins its transaction) once its first
  batch arrived, while it reads the rest; with smaller batches the first arrives sooner.

Exactly-once rests on what the switch leaves alone: the offset log is written before a batch's tasks run and the
commit log after, both by atomic rename, and the sinks' protocols are the same. Settings given explicitly win
over the switch's.
"""

from __future__ import annotations

FILE_SYSTEM_CHECKPOINT_MANAGER = (
    "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"
)
SETTINGS: dict[str, str] = {
    "spark.sql.streaming.checkpointFileManagerClass": FILE_SYSTEM_CHECKPOINT_MANAGER,
    "spark.sql.execution.arrow.maxRecordsPerBatch": "2048",
}


def with_low_latency(config: dict[str, str] | None) -> dict[str, str]:
    """`config` with the switch's settings added where it does not set them itself."""
    return {**SETTINGS, **(config or {})}
