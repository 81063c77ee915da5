"""A sink of five methods, as docs/two-phase-commit.md shows one (support/jsonl_sink.py), run by real Spark: the
framework's attempt journal and file decision log under ``controlLocation`` keep its output exact across a failed
commit and Spark's replay, and leave nothing behind."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from pyspark.errors import StreamingQueryException

from support.jsonl_sink import FORMAT, published_rows, register, staged_files
from support.sink_drill import DRILL_TIMEOUT_S, AimedKill, DrillTarget, Snapshot, run_drill
from support.spark import arm_failpoint, clear_failpoints, create_topic, fired, produce, unique


@pytest.fixture
def jsonl(spark):
    register(spark)
    return spark


def control_files(control: Path) -> dict[str, list[str]]:
    """What the framework keeps under ``controlLocation``, by kind: attempts (entered, neither committed nor
    aborted), attempts marked aborted (kept while a straggler of them might run), decisions, finished marks."""
    sizes = {}
    for entry in control.glob("*/attempts/*"):
        try:
            sizes[entry.name] = entry.stat().st_size
        except FileNotFoundError:  # ended while listed: the drill polls a running query
            pass
    return {"attempts": sorted(name for name, size in sizes.items() if size == 0),
            "marked aborted": sorted(name for name, size in sizes.items() if size > 0),
            "decisions": sorted(p.name for p in control.glob("*/decisions/*.decision")),
            "finished": sorted(p.name for p in control.glob("*/decisions/*.finished"))}


def stream(spark, bootstrap: str, topic: str, path: Path, control: Path, checkpoint: Path):
    from pyspark.sql import functions as F

    return (spark.readStream.format("sparkeos.kafka").option("kafka.bootstrap.servers", bootstrap)
            .option("subscribe", topic).option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", "100")
            .load().select(F.col("value").cast("string").cast("long").alias("n"))
            .writeStream.format(FORMAT).option("path", str(path)).option("controlLocation", str(control))
            .option("checkpointLocation", str(checkpoint)))


@pytest.mark.parametrize("failpoint", ["2pc.task_pre_committed", "2pc.deciding", "2pc.between_commits",
                                       "2pc.committed"])
def test_a_query_failing_at_a_protocol_step_and_restarted_writes_every_row_once(jsonl, broker, tmp_path, failpoint):
    bootstrap = broker.bootstrap_servers
    topic = create_topic(bootstrap, unique("in"), partitions=2)
    produce(bootstrap, topic, [str(n) for n in range(400)], spread_over=2)
    path, control, checkpoint = tmp_path / "out", tmp_path / "control", tmp_path / "ck"
    clear_failpoints()
    query = stream(jsonl, bootstrap, topic, path, control, checkpoint).start()
    try:
        query.processAllAvailable()  # a first batch, so that the failure is in a later one
        produce(bootstrap, topic, [str(n) for n in range(400, 700)], spread_over=2)
        arm_failpoint(failpoint)
        with pytest.raises(StreamingQueryException, match="failpoint"):
            query.processAllAvailable()
        assert fired(failpoint)
    finally:
        query.stop()
        clear_failpoints()
    left = control_files(control)
    query = stream(jsonl, bootstrap, topic, path, control, checkpoint).start()
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    rows = Counter(row["n"] for row in published_rows(path))
    assert rows == Counter(range(700)), f"lost {sorted(set(range(700)) - set(rows))[:5]}, doubled " \
                                        f"{[n for n, c in rows.items() if c > 1][:5]}; after the failure: {left}"
    assert staged_files(path) == []
    kept = control_files(control)
    assert kept["attempts"] == [], "attempts left in the journal"
    assert kept["decisions"] and [f"{d.split('.')[0]}.finished" for d in kept["decisions"]] == kept["finished"]


def test_a_batch_write_run_again_under_its_write_id_adds_nothing(jsonl, tmp_path):
    frame = jsonl.range(0, 100, numPartitions=3).selectExpr("id AS n")
    for _ in range(2):
        (frame.write.format(FORMAT).mode("append").option("writeId", "load-7")
         .option("controlLocation", str(tmp_path / "control")).save(str(tmp_path / "out")))
    assert sorted(row["n"] for row in published_rows(tmp_path / "out")) == list(range(100))
    assert control_files(tmp_path / "control")["attempts"] == []


@pytest.mark.parametrize("store", ["local", "s3"])
def test_drivers_recording_one_batch_at_once_all_keep_the_first_decision(tmp_path, request, store):
    """The framework's decision log under ``controlLocation``, locally and on S3: two drivers of one query deciding
    one batch at the same moment must agree on one decision. On S3 a check-then-move let a later decision replace
    one whose transactions were already committed; a conditional PUT creates the decision only once."""
    from support.decision_race import assert_drivers_agree
    from support.jsonl_sink import JsonLinesSink

    if store == "local":
        control = str(tmp_path / "control")
    else:
        endpoint = request.getfixturevalue("s3_server")["fs.s3a.endpoint"].split("://")[1]
        control = f"s3://test:test@sink-bucket/control?endpoint_override={endpoint}&scheme=http&region=us-east-1"
    drivers = [JsonLinesSink(str(tmp_path / "out")) for _ in range(6)]
    for driver in drivers:
        driver.control_location = control
    assert_drivers_agree([lambda driver=driver: driver.decision_log("q") for driver in drivers])


def test_a_query_without_a_control_location_is_refused_naming_the_option(jsonl, tmp_path):
    frame = jsonl.range(0, 10).selectExpr("id AS n")
    with pytest.raises(Exception, match="needs the option controlLocation"):
        frame.write.format(FORMAT).mode("append").save(str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()


class FiveMethodTarget(DrillTarget):
    """The drill for the five-method sink: its pending work is the framework's journal, its decisions the framework's
    file log. Two kills aim just after a task entered its attempt (its staged file being written, no decision yet)
    and just after a batch was decided."""

    name = FORMAT
    must_hit = frozenset({"decided", "pending"})

    def __init__(self, tmp_path: Path):
        self.path, self.control = tmp_path / "out", tmp_path / "control"
        self.aimed = {1: AimedKill("attempt entered", lambda: set(control_files(self.control)["attempts"])),
                      3: AimedKill("decided", hold_at="2pc.decided")}

    def job_args(self, bootstrap: str, source: str, checkpoint: Path) -> list[str]:
        return ["--jsonl-path", str(self.path), "--control-location", str(self.control)]

    def snapshot(self, in_flight: int | None) -> Snapshot:
        kept = control_files(self.control)
        batches = {int(name.split(".")[0]) for name in kept["decisions"]}
        finished = {int(name.split(".")[0]) for name in kept["finished"]}
        return Snapshot(in_flight in batches, len(batches - finished), len(kept["attempts"]),
                        len(published_rows(self.path)))

    def output_values(self) -> dict[str, list[bytes]]:
        import duckdb

        relation = duckdb.sql(f"SELECT text FROM read_json_auto('{self.path}/*.jsonl')")
        return {"json lines": [row["text"].encode() for row in published_rows(self.path)],
                "duckdb": [text.encode() for (text,) in relation.fetchall()]}

    def leftovers(self) -> list[str]:
        kept = control_files(self.control)
        problems = [f"left staged: {file}" for file in staged_files(self.path)][:5]
        problems += [f"attempt left in the journal: {name}" for name in kept["attempts"]][:5]
        finished = {name.split(".")[0] for name in kept["finished"]}
        problems += [f"decision {name} unfinished" for name in kept["decisions"] if name.split(".")[0] not in finished]
        problems += [f"row {row}" for row in published_rows(self.path)
                     if row["k"] != row["n"] % 3 or row["text"] != f"{row['n']}!"][:5]
        return problems


@pytest.mark.soak("the file sink's drill (tests/spark/files/test_driver_crash.py) kills the same framework, its "
                  "attempt journal and file decision log; this module fails a query at each step of the protocol")
@pytest.mark.timeout(DRILL_TIMEOUT_S)
def test_driver_killed_at_random_moments_a_five_method_sinks_output_stays_exact(broker_process, tmp_path):
    run_drill(FiveMethodTarget(tmp_path), broker_process.bootstrap_servers, tmp_path)
