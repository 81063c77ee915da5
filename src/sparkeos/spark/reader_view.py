"""What a reader of a sink's store sees now, as `sparkeos chaos` reads it again and again while a job runs: each
record as one comparable text, counted (a record written twice counts two). Each data source says how its store is
read (``visible_records``); a record a reader once saw must stay visible, so the view of a store whose rows change
(a table of upserts) is not watched, nor is one that can only grow (a Kafka topic read read_committed)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from typing import Any


class OutputUnavailable(Exception):
    """The store cannot be read now (a database restarting, a network fault): no view, and no fault of the sink's."""


def record_texts(rows: Iterable[dict[str, Any]]) -> Counter[str]:
    """Each row as a JSON object of its non-null columns by name, each value as text, counted: a row reads the same
    whatever types a reader inferred for it (a CSV file's `7`, a partition directory's `"7"`) and whether a null
    column was written out or left out (JSON lines)."""
    return Counter(json.dumps({name: str(value) for name, value in row.items() if value is not None}, sort_keys=True)
                   for row in rows)
