"""Where a sink's task belongs, from the context Spark gives every task of a streaming query."""

from __future__ import annotations

from pyspark import TaskContext

QUERY_ID_PROPERTY = "sql.streaming.queryId"
BATCH_ID_PROPERTY = "streaming.sql.batchId"


def spark_task() -> TaskContext:
    context = TaskContext.get()
    if context is None:
        raise RuntimeError("a sparkeos sink's writer runs inside a Spark task")
    return context


def streaming_task() -> tuple[str, int, int]:
    """(query id, batch id, Spark partition) of this task of a streaming query.

    Both ids decide what a task does with its markers or decisions: a guessed batch 0 or an unknown query would
    decide against another batch's or another query's, so a task without them fails."""
    context = spark_task()
    query = context.getLocalProperty(QUERY_ID_PROPERTY)
    if not query:
        raise RuntimeError(f"no streaming query id in the task's context (Spark's local property {QUERY_ID_PROPERTY}): "
                           "a sink's stream writer runs only in a task of a streaming query")
    batch = context.getLocalProperty(BATCH_ID_PROPERTY)
    if batch is None or not batch.lstrip("-").isdigit():
        raise RuntimeError(f"no streaming batch id in the task's context (Spark's local property {BATCH_ID_PROPERTY} "
                           f"is {batch!r}): a sink's stream writer runs only in a task of a streaming query")
    return query, int(batch), context.partitionId()
