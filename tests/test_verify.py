"""sparkeos.verify: reading a topic to its end against the real embedded broker, and the exactly-once checker."""

from __future__ import annotations

from collections import Counter

import pytest
from confluent_kafka import Producer

from sparkeos.broker import EmbeddedBroker
from sparkeos.verify import (
    READ_UNCOMMITTED,
    ExactlyOnceReport,
    ReadTimeout,
    Record,
    assert_exactly_once,
    check_exactly_once,
    count_records,
    end_offsets,
    read_records,
    read_values,
)
from support.spark import create_topic, produce, produce_transaction, unique


def mixed_topic(bootstrap: str) -> str:
    """Four partitions, each ending differently:
    0: plain records, a committed transaction, then an aborted one (the range ends on aborted records and a marker)
    1: an aborted transaction only (a range with nothing visible in it)
    2: a plain record, then a committed transaction (the range ends on a commit marker)
    3: nothing
    """
    topic = create_topic(bootstrap, unique("mixed"), partitions=4)
    produce(bootstrap, topic, ["a0", "a1"], keys=["k0", "k1"], partition=0, headers=[("h", b"v")])
    produce_transaction(bootstrap, topic, ["c0", "c1", "c2"], commit=True, partition=0)
    produce_transaction(bootstrap, topic, ["x0", "x1"], commit=False, partition=0)
    produce_transaction(bootstrap, topic, ["y0", "y1"], commit=False, partition=1)
    produce(bootstrap, topic, ["b0"], partition=2)
    produce_transaction(bootstrap, topic, ["d0"], commit=True, partition=2)
    return topic


def test_reads_every_partition_to_its_end_past_markers_and_aborted_records(broker: EmbeddedBroker) -> None:
    bootstrap = broker.bootstrap_servers
    topic = mixed_topic(bootstrap)
    # 0: a0 a1 c0 c1 c2 commit x0 x1 abort; 1: y0 y1 abort; 2: b0 d0 commit.
    assert end_offsets(bootstrap, topic) == {0: 9, 1: 3, 2: 3, 3: 0}

    records = read_records(bootstrap, topic, timeout_s=30)
    assert sorted(records) == [
        Record(0, 0, b"k0", b"a0", [("h", b"v")]),
        Record(0, 1, b"k1", b"a1", [("h", b"v")]),
        Record(0, 2, None, b"c0", None),
        Record(0, 3, None, b"c1", None),
        Record(0, 4, None, b"c2", None),
        Record(2, 0, None, b"b0", None),
        Record(2, 1, None, b"d0", None),
    ]
    assert Counter(read_values(bootstrap, topic, timeout_s=30)) == Counter(r.value for r in records)
    assert count_records(bootstrap, topic, timeout_s=30) == 7

    uncommitted = read_values(bootstrap, topic, isolation_level=READ_UNCOMMITTED, timeout_s=30)
    assert sorted(uncommitted) == sorted([b"a0", b"a1", b"c0", b"c1", b"c2", b"x0", b"x1", b"y0", b"y1", b"b0",
                                          b"d0"])


def test_an_open_transaction_ends_the_read_committed_range(broker: EmbeddedBroker) -> None:
    """The reader stops at the last stable offset instead of waiting for the open transaction."""
    bootstrap = broker.bootstrap_servers
    topic = create_topic(bootstrap, unique("open"), partitions=1)
    produce(bootstrap, topic, ["before"], partition=0)
    open_producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": unique("open")})
    open_producer.init_transactions(30)
    open_producer.begin_transaction()
    open_producer.produce(topic, value=b"pending", partition=0)
    assert open_producer.flush(30) == 0
    produce(bootstrap, topic, ["after"], partition=0)

    assert end_offsets(bootstrap, topic) == {0: 1}
    assert end_offsets(bootstrap, topic, isolation_level=READ_UNCOMMITTED) == {0: 3}
    assert read_values(bootstrap, topic, timeout_s=30) == [b"before"]
    assert read_values(bootstrap, topic, isolation_level=READ_UNCOMMITTED, timeout_s=30) == [
        b"before", b"pending", b"after"]

    open_producer.commit_transaction(30)
    assert read_values(bootstrap, topic, timeout_s=30) == [b"before", b"pending", b"after"]


def test_a_topic_that_does_not_exist_reads_as_empty(broker: EmbeddedBroker) -> None:
    missing = unique("missing")
    assert end_offsets(broker.bootstrap_servers, missing) == {}
    assert read_records(broker.bootstrap_servers, missing, timeout_s=30) == []


def test_a_reader_that_cannot_reach_the_end_in_time_names_what_is_unfinished(broker: EmbeddedBroker) -> None:
    bootstrap = broker.bootstrap_servers
    topic = mixed_topic(bootstrap)
    with pytest.raises(ReadTimeout) as timed_out:
        read_values(bootstrap, topic, timeout_s=0)
    assert timed_out.value.topic == topic
    assert set(timed_out.value.positions) == {0, 1, 2}, "partition 3 is empty: nothing to read there"
    assert "partition 0 at no offset yet of 9" in str(timed_out.value)


# --- the checker ----------------------------------------------------------------------------------


def test_an_exact_output_is_exact_whatever_the_order() -> None:
    report = check_exactly_once(Counter({b"a": 2, b"b": 1}), [b"b", b"a", b"a"], aborted=[b"x"])
    assert report.exact
    assert not (report.lost or report.duplicated or report.unexpected or report.aborted_visible)
    assert str(report) == "exact: 3 expected, 3 read"


def test_each_kind_of_difference_is_reported_apart() -> None:
    expected = [b"lost", b"twice", b"kept", b"kept"]
    read = [b"twice", b"twice", b"kept", b"kept", b"stray", b"leaked", b"leaked"]
    report = check_exactly_once(expected, read, aborted=[b"leaked", b"never-read"])
    assert not report.exact
    assert report.lost == Counter({b"lost": 1})
    assert report.duplicated == Counter({b"twice": 1})
    assert report.unexpected == Counter({b"stray": 1})
    assert report.aborted_visible == Counter({b"leaked": 2})
    assert report.expected.total() == 4 and report.read.total() == 7
    text = report.describe()
    assert text.splitlines()[0] == (
        "NOT exact: 4 expected, 7 read; 1 lost, 1 duplicated, 1 unexpected, 2 aborted-visible")
    assert "  lost, e.g. b'lost' (expected 1, read 0)" in text
    assert "  duplicated, e.g. b'twice' (expected 1, read 2)" in text
    assert "  unexpected, e.g. b'stray' (expected 0, read 1)" in text
    assert "  aborted-visible, e.g. b'leaked' (expected 0, read 2)" in text


@pytest.mark.parametrize(
    ("read", "kind"),
    [
        ([b"a"], "lost"),
        ([b"a", b"b", b"b"], "duplicated"),
        ([b"a", b"b", b"c"], "unexpected"),
        ([b"a", b"b", b"x"], "aborted_visible"),
    ],
)
def test_any_single_difference_makes_the_output_inexact(read: list[bytes], kind: str) -> None:
    report = check_exactly_once([b"a", b"b"], read, aborted=[b"x"])
    assert not report.exact
    kinds = ("lost", "duplicated", "unexpected", "aborted_visible")
    assert [k for k in kinds if getattr(report, k)] == [kind]


def test_a_value_both_expected_and_aborted_read_too_often_counts_as_duplicated() -> None:
    report = check_exactly_once([b"v"], [b"v", b"v"], aborted=[b"v"])
    assert report.duplicated == Counter({b"v": 1}) and not report.aborted_visible


def test_samples_are_limited_and_ordered() -> None:
    report = check_exactly_once([str(i).encode() for i in range(20)], [])
    line = next(line for line in report.describe(samples=3).splitlines() if line.startswith("  lost"))
    assert line == "  lost, e.g. b'0' (expected 1, read 0); b'1' (expected 1, read 0); b'10' (expected 1, read 0)"
    mixed = check_exactly_once([None, b"a", 1], [])  # values that do not sort together still print
    assert "3 lost" in mixed.describe()


def test_the_assertion_helper_fails_with_the_report_and_the_context() -> None:
    exact = assert_exactly_once([b"a"], [b"a"])
    assert isinstance(exact, ExactlyOnceReport) and exact.exact
    with pytest.raises(AssertionError) as failure:
        assert_exactly_once([b"a"], [b"a", b"a"], context="seed 7")
    message = str(failure.value)
    assert message.startswith("NOT exact: 1 expected, 2 read; 0 lost, 1 duplicated")
    assert message.endswith("\nseed 7")
