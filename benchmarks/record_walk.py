#!/usr/bin/env python3
"""The embedded broker's record checks: the compiled walk against the same walk as plain Python, in one run.

Before a produced batch is appended, the broker reads every record in it (src/sparkeos/broker/record_walk.py).
The install compiles that file with Cython where a C compiler is there (setup.py); elsewhere the broker runs it as
plain Python. This times both on the same batches, as kafka-python's builder writes them (as producers do), and
prints nanoseconds per record and their ratio:

    python benchmarks/record_walk.py
    python benchmarks/record_walk.py --records 1000,20000 --value-bytes 100,1000

Batches of more than 8,192 records take three-byte offset deltas. Each figure is the fastest of --repeat passes
(the least disturbed by the rest of the machine). It needs an install that compiled the walk, and says so if not.
"""

from __future__ import annotations

import argparse
import sys
import time

from kafka.record.default_records import DefaultRecordBatchBuilder

from sparkeos.broker import record_validation, record_walk
from sparkeos.broker.records import HEADER_SIZE, split_batches


def build(records: int, value_bytes: int) -> memoryview:
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=True, producer_id=7,
                                        producer_epoch=0, base_sequence=0, batch_size=1 << 30)
    started = 1_700_000_000_000
    for offset in range(records):
        builder.append(offset, timestamp=started + offset // 50, key=None, value=b"v" * value_bytes, headers=[])
    return memoryview(bytes(builder.build()))


def ns_per_record(walk, batch: memoryview, repeat: int) -> float:
    ((header, view),) = split_batches(batch)
    count = header.records_count
    passes = max(1, 200_000 // count)
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        for _ in range(passes):
            walk(view, HEADER_SIZE, len(view), count, False)
        best = min(best, (time.perf_counter() - started) / passes / count)
    return best * 1e9


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", default="1000,5000,20000", help="records per batch, comma-separated")
    parser.add_argument("--value-bytes", default="100,1000", help="value sizes, comma-separated")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    if not record_validation.COMPILED:
        print("the install did not compile the record walk (no C compiler or Python headers then, or "
              "record_walk.py changed since): pip install -e . again", file=sys.stderr)
        return 2
    compiled = record_validation._COMPILED
    print(f"{'records':>8}  {'value B':>7}  {'plain ns/rec':>12}  {'compiled ns/rec':>15}  {'plain/compiled':>14}")
    for records in (int(n) for n in args.records.split(",")):
        for value_bytes in (int(n) for n in args.value_bytes.split(",")):
            batch = build(records, value_bytes)
            plain = ns_per_record(record_walk.walk, batch, args.repeat)
            fast = ns_per_record(compiled, batch, args.repeat)
            print(f"{records:>8,}  {value_bytes:>7,}  {plain:>12.1f}  {fast:>15.1f}  {plain / fast:>13.0f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
