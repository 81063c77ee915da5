"""Run the Jepsen-style transactional workload of the tests (tests/support/jepsen.py) for longer, and print what
the checker found.

    python scripts/jepsen_soak.py --seconds 300 --producers 4 --consumers 4 --faults kill,proxy --seed 7

`--faults` takes kinds separated by commas: kill, proxy (every proxy fault), or single proxy faults
(drop_produce, drop_end_txn, drop_add_partitions, refuse, delay, split); `none` runs without faults.
The exit status is 1 when the checker found an anomaly or a worker failed.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from support import jepsen  # noqa: E402


def fault_kinds(text: str) -> tuple[str, ...]:
    kinds: list[str] = []
    for name in filter(None, (part.strip() for part in text.split(","))):
        if name == "none":
            continue
        expanded = jepsen.PROXY_FAULTS if name == "proxy" else (name,)
        for kind in expanded:
            if kind not in jepsen.FAULT_KINDS:
                raise argparse.ArgumentTypeError(f"unknown fault {kind!r}; known: kill, proxy, {jepsen.PROXY_FAULTS}")
            if kind not in kinds:
                kinds.append(kind)
    return tuple(kinds)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=120.0, help="how long the workload runs")
    parser.add_argument("--producers", type=int, default=3, help="transactional producers")
    parser.add_argument("--consumers", type=int, default=3,
                        help="read_committed consumers; the first half assign partitions, the rest subscribe")
    parser.add_argument("--topics", type=int, default=2)
    parser.add_argument("--partitions", type=int, default=3, help="partitions per topic")
    parser.add_argument("--faults", type=fault_kinds, default=jepsen.FAULT_KINDS, help="e.g. kill,proxy")
    parser.add_argument("--seed", type=int, default=None, help="random seed (default: a random one)")
    parser.add_argument("--data-dir", type=Path, default=None, help="broker data (default: a temporary directory)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    args = parser.parse_args(argv)

    seed = random.randrange(2**32) if args.seed is None else args.seed
    config = jepsen.WorkloadConfig(seconds=args.seconds, producers=args.producers, consumers=args.consumers,
                                   topics=args.topics, partitions=args.partitions, faults=args.faults, seed=seed)
    with tempfile.TemporaryDirectory(prefix="jepsen-soak-") as scratch:
        data_dir = args.data_dir or Path(scratch) / "broker"
        workload = jepsen.Workload(data_dir, config)
        started = time.monotonic()
        history = workload.run()
        ran_s = time.monotonic() - started
        analysis = jepsen.check(history)
    assert workload.injector is not None
    result = {
        "seed": seed,
        "seconds": round(ran_s, 1),
        "transactions": {name: analysis.stats[name] for name in ("ok", "info", "info_visible", "fail", "fenced")},
        "faults_injected": dict(workload.injector.injected),
        "faults_acted": workload.injector.acted(),
        "proxy": workload.proxy.counters(),
        "reads": {name: analysis.stats[name] for name in ("records_polled", "records_final_committed",
                                                          "records_final_uncommitted", "aborted_values_in_log",
                                                          "consumer_sessions", "resets")},
        "anomalies": analysis.counts,
        "examples": {name: [repr(case) for case in cases] for name, cases in analysis.examples.items()},
        "errors": workload.errors,
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for name, value in result.items():
            if value or name in ("anomalies", "errors"):
                print(f"{name}: {value}")
    return 1 if analysis.anomalies or workload.errors else 0


if __name__ == "__main__":
    sys.exit(main())
