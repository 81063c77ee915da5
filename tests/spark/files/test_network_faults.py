"""Exactly-once files through a faulty network: a Kafka -> Spark -> sparkeos.files query whose every Kafka
connection (the driver's, the source's readers') runs through a fault proxy that withholds Fetch, ListOffsets
and Metadata answers, refuses connections, adds latency and splits frames. Spark retries failed tasks
(local[2,8]); the driver must not die. pyarrow then reads every expected row once from the directory, and
nothing is left staged.
"""

from __future__ import annotations

import pytest

from sparkeos.chaos.network import SOURCE_AND_DRIVER_FAULTS
from sparkeos.verify import assert_exactly_once
from support.file_sink import output_rows, output_values, row_problems, staged_files
from support.network_faults import faulty_pipeline


@pytest.mark.timeout(600)
def test_query_under_network_faults_directory_stays_exact(tmp_path):
    output = tmp_path / "output"
    with faulty_pipeline(tmp_path, records=3_000) as pipeline:
        injected = pipeline.run(pipeline.job_args("--sink-path", str(output)), SOURCE_AND_DRIVER_FAULTS)
    rows = output_rows(output, "pyarrow")
    assert not row_problems(rows)
    assert not staged_files(output), "attempts left staged files behind after the query caught up"
    assert_exactly_once(pipeline.expected(), output_values(rows), aborted=pipeline.aborted(),
                        context=f"seed {pipeline.seed}, faults {dict(injected)}")
