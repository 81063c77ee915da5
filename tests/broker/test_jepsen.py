"""A Jepsen-style workload against the broker: transactional writers and read_committed readers under faults,
judged by a checker of the recorded history (tests/support/jepsen.py has the workload, the anomalies it looks for,
and how outcomes are recorded). `scripts/jepsen_soak.py` runs the same workload for longer."""

from __future__ import annotations

import logging
import os
import random
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import Producer

from sparkeos.broker import EmbeddedBroker
from sparkeos.chaos.proxy import TcpProxy
from sparkeos.verify import READ_COMMITTED, READ_UNCOMMITTED, read_records
from support import jepsen
from support.jepsen import FAIL, INFO, OK, History, Poll, Reset, Txn, check, describe

log = logging.getLogger(__name__)

PRODUCE = 0

# -- the checker on hand-made histories ------------------------------------------------------------


def _clean() -> History:
    """Two keys. x: a@0 (T1), c@2 (T2, aborted), d@4 e@5 (T3); y: b@0 (T1), f@2 (T4, info), g@4 (T5)."""
    txns = [
        Txn("w0", 0, [("x", "a"), ("y", "b")], OK, offsets={"a": 0, "b": 0}),
        Txn("w0", 1, [("x", "c")], FAIL, offsets={"c": 2}),
        Txn("w1", 0, [("x", "d"), ("x", "e")], OK, offsets={"d": 4, "e": 5}),
        Txn("w2", 0, [("y", "f")], INFO),
        Txn("w1", 1, [("y", "g")], OK, offsets={"g": 4}),
    ]
    committed = [("x", 0, "a"), ("x", 4, "d"), ("x", 5, "e"), ("y", 0, "b"), ("y", 2, "f"), ("y", 4, "g")]
    return History(
        txns=txns,
        sessions={
            "s1": [Reset(frozenset({"x", "y"})), Poll([("x", 0, "a"), ("y", 0, "b")]),
                   Poll([("x", 4, "d"), ("x", 5, "e"), ("y", 2, "f")])],
            "s2": [Reset(frozenset({"y"})), Poll([("y", 0, "b"), ("y", 2, "f"), ("y", 4, "g")])],
        },
        final_committed=list(committed),
        final_uncommitted=sorted([*committed, ("x", 2, "c")]),
        final_keys={"x", "y"},
    )


def _without(history: History, value: str) -> None:
    """Remove `value` from every read_committed read."""
    for events in history.sessions.values():
        for event in events:
            if isinstance(event, Poll):
                event.records[:] = [record for record in event.records if record[2] != value]
    history.final_committed[:] = [record for record in history.final_committed if record[2] != value]


def _nobody_read_past_g(history: History) -> None:
    _without(history, "g")
    history.final_committed.clear()
    history.final_keys.clear()


def _info_torn(history: History) -> None:
    history.txns[3].writes.append(("x", "h"))


def _read_at_taken_offset(history: History) -> None:
    history.txns.append(Txn("w3", 0, [("x", "q")], INFO))
    history.sessions["s2"].append(Poll([("x", 4, "q")]))


CASES: dict[str, tuple[Callable[[History], None], set[str]]] = {
    "clean": (lambda h: None, set()),
    "aborted read": (lambda h: h.sessions["s2"].append(Poll([("x", 2, "c")])), {"aborted_read"}),
    "aborted read in the final read": (lambda h: h.final_committed.append(("x", 2, "c")), {"aborted_read"}),
    "lost write": (lambda h: _without(h, "g"), {"lost_write"}),
    "unread but nobody read past it": (_nobody_read_past_g, set()),
    "torn committed transaction": (lambda h: _without(h, "e"), {"torn_transaction", "lost_write"}),
    "torn indeterminate transaction": (_info_torn, {"torn_transaction"}),
    "duplicate": (lambda h: h.final_committed.append(("y", 6, "a")), {"duplicate"}),
    "inconsistent offset": (_read_at_taken_offset, {"inconsistent_offset"}),
    "acknowledged at an aborted offset": (
        lambda h: h.txns.append(Txn("w3", 0, [("x", "k")], OK, offsets={"k": 2})),
        {"inconsistent_offset", "lost_write"}),
    "nonmonotonic poll": (lambda h: h.sessions["s1"].append(Poll([("x", 4, "d")])), {"nonmonotonic_poll"}),
    "the same offset read again": (lambda h: h.sessions["s1"].append(Poll([("x", 5, "e")])), {"nonmonotonic_poll"}),
    "nonmonotonic poll after a reset": (
        lambda h: h.sessions["s1"].extend([Reset(frozenset({"x"})), Poll([("x", 4, "d")])]), set()),
    "poll skip": (lambda h: h.sessions["s1"][2].records.pop(0), {"poll_skip"}),
    "nonmonotonic send": (lambda h: h.txns[2].writes.reverse(), {"nonmonotonic_send"}),
    "phantom": (lambda h: h.final_committed.append(("y", 6, "zzz")), {"phantom"}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_checker_finds_each_anomaly_and_only_it(case: str) -> None:
    change, expected = CASES[case]
    history = _clean()
    change(history)
    analysis = check(history)
    assert set(analysis.counts) == set(jepsen.ANOMALIES)
    assert set(analysis.anomalies) == expected, describe(analysis)


def test_checker_counts_outcomes() -> None:
    stats = check(_clean()).stats
    assert (stats["ok"], stats["info"], stats["info_visible"], stats["fail"]) == (3, 1, 1, 1)
    assert stats["aborted_values_in_log"] == 1


# -- the hazard the workload avoids --------------------------------------------------------------


@pytest.mark.parametrize("after_abort", ["reuse", "new producer"])
def test_reusing_a_producer_after_an_abort_with_a_lost_produce_answer_loses_a_committed_write(
        tmp_path: Path, after_abort: str) -> None:
    """librdkafka gives the next transaction's first batch the sequence numbers of the aborted batch whose
    Produce answer was lost; the broker, as Kafka, answers it as a duplicate of that aborted batch, at its
    offset, and the committed value is never written. A new producer (init_transactions bumps the epoch) is
    safe. Should `reuse` stop losing the write, the client no longer has the hazard."""
    topic = f"hazard-{uuid.uuid4().hex[:8]}"
    history = History(final_keys={(topic, 0)})
    with TcpProxy() as proxy, EmbeddedBroker(tmp_path / "broker", advertised_host="127.0.0.1",
                                             advertised_port=proxy.port) as broker:
        proxy.target = ("127.0.0.1", broker.config.port)
        # No re-bootstrap: when the cut leaves the one broker's connections down at once, librdkafka would
        # decommission the broker and the abort would wait on the message it can neither retry nor purge.
        config = {"bootstrap.servers": proxy.address, "transactional.id": f"hazard-{uuid.uuid4().hex[:8]}",
                  "reconnect.backoff.ms": 20, "reconnect.backoff.max.ms": 200, "metadata.recovery.strategy": "none"}
        producer = Producer(config)
        producer.init_transactions(15)

        def transaction(number: int, value: str, commit: bool, drop_answer: bool = False) -> None:
            txn = Txn("w", number, [((topic, 0), value)])
            history.txns.append(txn)
            producer.begin_transaction()
            producer.produce(topic, value.encode(), partition=0,
                             on_delivery=lambda err, msg: err or txn.offsets.update({value: msg.offset()}))
            if drop_answer:
                proxy.drop_answers(PRODUCE)
                deadline = time.monotonic() + 10
                while proxy.answers_dropped(PRODUCE) == 0 and time.monotonic() < deadline:
                    producer.poll(0.01)
                assert proxy.answers_dropped(PRODUCE) == 1
            if commit:
                producer.commit_transaction(15)
                txn.outcome = OK
            else:
                producer.abort_transaction(15)
                txn.outcome = FAIL

        transaction(0, "first", commit=True)
        transaction(1, "aborted", commit=False, drop_answer=True)
        if after_abort == "new producer":
            producer.close()
            producer = Producer(config)
            producer.init_transactions(15)
        transaction(2, "second", commit=True)
        producer.close()
        for level, into in ((READ_COMMITTED, history.final_committed), (READ_UNCOMMITTED, history.final_uncommitted)):
            into.extend(((topic, 0), r.offset, r.value.decode()) for r in read_records(proxy.address, topic,
                                                                                      isolation_level=level))
    analysis = check(history)
    assert analysis.stats["aborted_values_in_log"] == 1, "the aborted batch never reached the log"
    if after_abort == "reuse":
        # "second" was acknowledged at the offset of the aborted batch.
        assert analysis.anomalies == {"lost_write": 1, "inconsistent_offset": 1}, describe(analysis)
        aborted_at = [offset for _key, offset, value in history.final_uncommitted if value == "aborted"]
        assert [history.txns[2].offsets["second"]] == aborted_at
    else:
        assert analysis.anomalies == {}, describe(analysis)
        assert [value for _key, _offset, value in history.final_committed] == ["first", "second"]


# -- the workload under faults -------------------------------------------------------------------


# Closing a producer whose commit timed out warns that it could not abort; the workload closes such producers.
@pytest.mark.filterwarnings("ignore:Producer abort_transaction failed during close")
def test_transactions_under_broker_kills_and_network_faults(tmp_path: Path) -> None:
    seed = int(os.environ.get("SPARKEOS_TEST_SEED", random.randrange(2**32)))
    log.warning("jepsen seed %d", seed)
    workload = jepsen.Workload(tmp_path / "broker", jepsen.WorkloadConfig(seconds=25, seed=seed))
    history = workload.run()
    analysis = check(history)
    assert workload.injector is not None
    acted = workload.injector.acted()
    report = describe(analysis, acted)
    log.warning("%s", report)
    assert not workload.errors, workload.errors
    assert analysis.anomalies == {}, report

    stats = analysis.stats
    # The workload did enough for the zeros to mean something.
    assert stats["ok"] >= 100 and stats["fail"] >= 20 and stats["fenced"] >= 1, report
    assert stats["info"] >= 1, f"no transaction ended indeterminate\n{report}"
    assert stats["aborted_values_in_log"] >= 10, report
    assert stats["records_polled"] >= 1000 and stats["resets"] >= 3, report
    assert acted["kill"] >= 2, report
    assert acted["drop_produce"] + acted["drop_end_txn"] + acted["drop_add_partitions"] >= 3, report
    assert acted["drop_end_txn"] >= 1 and acted["refuse"] >= 1 and acted["delay"] >= 1 and acted["split"] >= 1, report
