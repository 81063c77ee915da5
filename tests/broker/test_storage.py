"""PartitionLog on disk, without the network: recovery, segments, indexes and producer state.

Batches are built with kafka-python's record builder, the same bytes a producer would send.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from sparkeos.broker.records import InvalidBatch, parse_header
from sparkeos.broker.storage.log import LogConfig, OffsetOutOfRange, PartitionLog
from sparkeos.broker.storage.producer_state import SequenceError

OUT_OF_ORDER_SEQUENCE_NUMBER = 45
INVALID_PRODUCER_EPOCH = 47
MESSAGE_TOO_LARGE = 10
CODEC_GZIP = 1
PID = 4242


def make_batch(
    count: int,
    *,
    producer_id: int = -1,
    epoch: int = -1,
    base_sequence: int = -1,
    compression: int = 0,
    timestamps: list[int] | None = None,
    value_size: int = 20,
    tag: str = "",
) -> bytes:
    builder = DefaultRecordBatchBuilder(
        magic=2, compression_type=compression, is_transactional=False, producer_id=producer_id,
        producer_epoch=epoch, base_sequence=base_sequence, batch_size=1 << 24,
    )
    for i in range(count):
        timestamp = timestamps[i] if timestamps else 1_700_000_000_000 + i
        value = f"{tag}{i}:".encode().ljust(value_size, b"v")
        builder.append(i, timestamp, f"k{i}".encode(), value, [])
    return bytes(builder.build())


def open_log(directory: Path, **config: int) -> PartitionLog:
    return PartitionLog(directory, LogConfig(**config))


def segment_files(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.log"))


def crash(log: PartitionLog) -> None:
    """Close the files without the clean-shutdown marker or a snapshot, as after kill -9."""
    log.close_without_marker()


def batches_in(data: bytes) -> list[tuple[int, int]]:
    """(base offset, last offset) of each whole batch in a read result."""
    found = []
    pos = 0
    while pos < len(data):
        header = parse_header(data, pos)
        found.append((header.base_offset, header.last_offset))
        pos += header.size
    assert pos == len(data), "a read must return whole batches only"
    return found


def record_offsets(data: bytes) -> list[int]:
    offsets = []
    pos = 0
    while pos < len(data):
        header = parse_header(data, pos)
        offsets.extend(r.offset for r in DefaultRecordBatch(data[pos : pos + header.size]))
        pos += header.size
    return offsets


def test_append_assigns_offsets_and_reads_back_exact_bytes(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    sent = [make_batch(3, tag="a"), make_batch(1, tag="b"), make_batch(5, compression=CODEC_GZIP, value_size=200)]
    bases = [log.append(batch).base_offset for batch in sent]
    assert bases == [0, 3, 4]
    assert log.log_end_offset == 9
    data = log.read(0, 1 << 20)
    assert batches_in(data) == [(0, 2), (3, 3), (4, 8)]
    # Only baseOffset (and the leader epoch, 0 here) differ from what was sent.
    pos = 0
    for base, batch in zip(bases, sent, strict=True):
        stored = data[pos : pos + len(batch)]
        assert stored[8:] == batch[8:]
        assert struct.unpack(">q", stored[:8])[0] == base
        pos += len(batch)
    assert record_offsets(data) == list(range(9))
    log.close()


def test_torn_tail_is_cut_and_appends_continue(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    for i in range(5):
        log.append(make_batch(3, tag=f"{i}-"))
    assert log.log_end_offset == 15
    crash(log)
    (segment,) = segment_files(tmp_path)
    whole_size = segment.stat().st_size
    batch_size = whole_size // 5

    # Garbage after the last whole batch (a header that promises more bytes than exist).
    with open(segment, "ab") as handle:
        handle.write(struct.pack(">qi", 15, 5000) + b"\x00" * 100)
    log = open_log(tmp_path)
    assert log.log_end_offset == 15
    assert segment.stat().st_size == whole_size
    crash(log)

    # A batch cut in the middle, as when the process dies during a write.
    os.truncate(segment, whole_size - batch_size // 2)
    log = open_log(tmp_path)
    assert log.log_end_offset == 12
    assert segment.stat().st_size == whole_size - batch_size
    assert record_offsets(log.read(0, 1 << 20)) == list(range(12))
    result = log.append(make_batch(2, tag="after"))
    assert (result.base_offset, result.last_offset) == (12, 13)
    assert record_offsets(log.read(0, 1 << 20)) == list(range(14))
    crash(log)

    # Fewer bytes than a header at the tail.
    with open(segment, "ab") as handle:
        handle.write(b"\x01\x02\x03")
    log = open_log(tmp_path)
    assert log.log_end_offset == 14
    assert log.append(make_batch(1)).base_offset == 14
    log.close()


@pytest.mark.parametrize("victim", [4, 2])
def test_crc_corruption_in_last_segment_is_cut_on_unclean_restart(tmp_path: Path, victim: int) -> None:
    log = open_log(tmp_path)
    for i in range(5):
        log.append(make_batch(4, tag=f"{i}-"))
    crash(log)
    (segment,) = segment_files(tmp_path)
    batch_size = segment.stat().st_size // 5
    # Flip one byte of a record value: the length fields stay plausible, only the CRC tells.
    data = bytearray(segment.read_bytes())
    data[victim * batch_size + batch_size - 5] ^= 0xFF
    segment.write_bytes(data)

    log = open_log(tmp_path)
    # Kafka keeps only the valid prefix: everything from the first corrupt batch goes.
    assert log.log_end_offset == victim * 4
    assert segment.stat().st_size == victim * batch_size
    assert log.append(make_batch(1)).base_offset == victim * 4
    log.close()


def test_clean_restart_keeps_everything(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    for _ in range(3):
        log.append(make_batch(2))
    log.close()
    log = open_log(tmp_path)
    assert log.log_end_offset == 6
    assert record_offsets(log.read(0, 1 << 20)) == list(range(6))
    log.close()


def test_segment_roll_and_reopen_keep_offsets(tmp_path: Path) -> None:
    log = open_log(tmp_path, segment_bytes=2000)
    expected_end = 0
    for i in range(60):
        count = 1 + i % 4
        result = log.append(make_batch(count, tag=f"{i}-", value_size=30 + 7 * (i % 5)))
        assert result.base_offset == expected_end
        expected_end += count
    files = segment_files(tmp_path)
    assert len(files) > 3
    bases = [int(p.stem) for p in files]
    assert bases[0] == 0
    assert all(p.stat().st_size <= 2000 for p in files)
    # Each segment is named after the first offset it holds, continuing the previous one.
    for path, base in zip(files, bases, strict=True):
        assert parse_header(path.read_bytes()[:61]).base_offset == base
    log.close()

    for reopen in (lambda: None, lambda: None):
        reopen()
        log = open_log(tmp_path, segment_bytes=2000)
        assert log.log_end_offset == expected_end
        assert [int(p.stem) for p in segment_files(tmp_path)][: len(bases)] == bases
        assert record_offsets(_read_all(log)) == list(range(expected_end))
        crash(log)

    log = open_log(tmp_path, segment_bytes=2000)
    assert log.append(make_batch(3)).base_offset == expected_end
    log.close()


def _read_all(log: PartitionLog) -> bytes:
    out = bytearray()
    offset = log.log_start_offset
    for _ in range(10_000):
        if offset >= log.log_end_offset:
            return bytes(out)
        data = log.read(offset, 1 << 16)
        assert data, f"no data at {offset} below the end {log.log_end_offset}"
        out += data
        offset = batches_in(data)[-1][1] + 1
    raise AssertionError("read did not reach the log end")


@pytest.mark.parametrize("unclean", [False, True])
def test_index_lookup_for_every_offset(tmp_path: Path, unclean: bool) -> None:
    # Small segments and batches of mixed sizes put index entries at many positions.
    log = open_log(tmp_path, segment_bytes=20_000)
    spans = []
    for i in range(150):
        count = 1 + (i * 7) % 6
        result = log.append(make_batch(count, value_size=50 + (i * 37) % 400))
        spans.append((result.base_offset, result.last_offset))
    end = log.log_end_offset
    if unclean:
        crash(log)
    else:
        log.close()

    log = open_log(tmp_path, segment_bytes=20_000)
    assert len(segment_files(tmp_path)) > 2
    span_of = {o: span for span in spans for o in range(span[0], span[1] + 1)}
    for offset in range(end):
        data = log.read(offset, 1)
        # The whole batch holding the offset, even when it is larger than max_bytes.
        assert batches_in(data) == [span_of[offset]], offset
    for offset in range(0, end, 13):
        data = log.read(offset, 1 << 20)
        got = batches_in(data)
        assert got[0] == span_of[offset]
        assert all(got[i][1] + 1 == got[i + 1][0] for i in range(len(got) - 1))
    assert log.read(end, 1 << 20) == b""
    with pytest.raises(OffsetOutOfRange):
        log.read(end + 1, 1 << 20)
    log.close()


def test_read_stops_at_upper_bound(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    for _ in range(4):
        log.append(make_batch(5))
    assert batches_in(log.read(0, 1 << 20, upper_bound=10)) == [(0, 4), (5, 9)]
    assert batches_in(log.read(7, 1 << 20, upper_bound=15)) == [(5, 9), (10, 14)]
    assert log.read(10, 1 << 20, upper_bound=10) == b""
    log.close()


def test_oversized_batch_is_rejected(tmp_path: Path) -> None:
    log = open_log(tmp_path, max_message_bytes=1000)
    with pytest.raises(InvalidBatch) as raised:
        log.append(make_batch(1, value_size=2000))
    assert raised.value.error_code == MESSAGE_TOO_LARGE
    assert log.log_end_offset == 0
    assert log.append(make_batch(1, value_size=100)).base_offset == 0
    log.close()


def test_timestamp_lookups(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    log.append(make_batch(3, timestamps=[1000, 3000, 2000]))
    log.append(make_batch(2, timestamps=[2000, 5000], compression=CODEC_GZIP, value_size=200))
    log.append(make_batch(1, timestamps=[5000]))
    assert log.offset_for_timestamp(0) == (0, 1000)
    assert log.offset_for_timestamp(1500) == (1, 3000)
    assert log.offset_for_timestamp(3000) == (1, 3000)
    assert log.offset_for_timestamp(3001) == (4, 5000)
    assert log.offset_for_timestamp(5001) is None
    # Ties on the largest timestamp: the first record that has it.
    assert log.max_timestamp_offset() == (4, 5000)
    log.close()


@pytest.mark.parametrize("unclean", [False, True])
def test_timestamp_lookups_match_a_full_scan(tmp_path: Path, unclean: bool) -> None:
    # Many segments and index entries, timestamps mostly rising with jitter, repeats and drops.
    log = open_log(tmp_path, segment_bytes=30_000)
    timestamps: list[int] = []
    for i in range(400):
        count = 1 + i % 5
        batch_ts = [10_000 + 10 * i + ((j * 7919 + i * 31) % 97) - 40 for j in range(count)]
        if i % 50 == 7:
            batch_ts[0] = 500  # a late record far in the past
        timestamps.extend(batch_ts)
        log.append(make_batch(count, timestamps=batch_ts, value_size=60))
    crash(log) if unclean else log.close()
    log = open_log(tmp_path, segment_bytes=30_000)
    assert len(segment_files(tmp_path)) > 3

    def first_at_or_after(target: int, start: int = 0) -> tuple[int, int] | None:
        return next(((o, ts) for o, ts in enumerate(timestamps) if o >= start and ts >= target), None)

    for target in [0, 500, 501, *range(9_000, 14_500, 37), max(timestamps), max(timestamps) + 1]:
        assert log.offset_for_timestamp(target) == first_at_or_after(target), target
    top = max(timestamps)
    assert log.max_timestamp_offset() == (timestamps.index(top), top)

    # Below a moved log start offset nothing is visible, even the largest timestamp.
    cut = timestamps.index(top) + 1
    log.delete_records_before(cut)
    rest_top = max(timestamps[cut:])
    assert log.max_timestamp_offset() == (timestamps.index(rest_top, cut), rest_top)
    for target in (0, 12_000, top):
        assert log.offset_for_timestamp(target) == first_at_or_after(target, cut), target
    log.close()


# -- producer state ------------------------------------------------------------------------------


def _idempotent(count: int, base_sequence: int, epoch: int = 0, tag: str = "") -> bytes:
    return make_batch(count, producer_id=PID, epoch=epoch, base_sequence=base_sequence, tag=tag)


@pytest.mark.parametrize("unclean", [False, True])
def test_producer_state_survives_reopen(tmp_path: Path, unclean: bool) -> None:
    log = open_log(tmp_path)
    first = _idempotent(3, 0, tag="a")
    second = _idempotent(2, 3, tag="b")
    assert log.append(first).base_offset == 0
    assert log.append(make_batch(4)).base_offset == 3  # a non-idempotent batch in between
    assert log.append(second).base_offset == 7
    crash(log) if unclean else log.close()

    log = open_log(tmp_path)
    duplicate = log.append(second)
    assert duplicate.duplicate
    assert (duplicate.base_offset, duplicate.last_offset) == (7, 8)
    older = log.append(first)
    assert older.duplicate and older.base_offset == 0
    assert log.log_end_offset == 9

    with pytest.raises(SequenceError) as gap:
        log.append(_idempotent(1, 10))
    assert gap.value.error_code == OUT_OF_ORDER_SEQUENCE_NUMBER
    assert log.log_end_offset == 9

    assert log.append(_idempotent(1, 5, tag="c")).base_offset == 9
    # A new epoch starts at sequence 0; the old epoch is then fenced.
    with pytest.raises(SequenceError) as bad_start:
        log.append(_idempotent(1, 3, epoch=1))
    assert bad_start.value.error_code == OUT_OF_ORDER_SEQUENCE_NUMBER
    assert log.append(_idempotent(2, 0, epoch=1, tag="d")).base_offset == 10
    crash(log) if unclean else log.close()

    log = open_log(tmp_path)
    with pytest.raises(SequenceError) as stale:
        log.append(_idempotent(1, 6, epoch=0))
    assert stale.value.error_code == INVALID_PRODUCER_EPOCH
    again = log.append(_idempotent(2, 0, epoch=1, tag="d"))
    assert again.duplicate and again.base_offset == 10
    assert log.append(_idempotent(1, 2, epoch=1)).base_offset == 12
    log.close()


def test_producer_state_snapshot_plus_replay_after_crash(tmp_path: Path) -> None:
    # Snapshots are written at rolls and clean shutdowns; batches after the last snapshot are
    # replayed from the log on an unclean restart.
    log = open_log(tmp_path, segment_bytes=600)
    sent = []
    sequence = 0
    for i in range(12):
        batch = _idempotent(2, sequence, tag=f"{i}-")
        sequence += 2
        sent.append((batch, log.append(batch).base_offset))
    assert len(segment_files(tmp_path)) > 2
    assert list(tmp_path.glob("*.snapshot"))
    crash(log)

    log = open_log(tmp_path, segment_bytes=600)
    # The last five batches are remembered, whichever segment they were written to.
    for batch, offset in sent[-5:]:
        result = log.append(batch)
        assert result.duplicate and result.base_offset == offset
    with pytest.raises(SequenceError) as too_old:
        log.append(sent[0][0])
    assert too_old.value.error_code == OUT_OF_ORDER_SEQUENCE_NUMBER
    assert log.append(_idempotent(1, sequence)).base_offset == 24
    log.close()


def test_producer_state_after_torn_tail(tmp_path: Path) -> None:
    # A batch lost to a torn write must not count as written: the producer's retry is new.
    log = open_log(tmp_path)
    log.append(_idempotent(2, 0, tag="a"))
    lost = _idempotent(2, 2, tag="b")
    log.append(lost)
    crash(log)
    (segment,) = segment_files(tmp_path)
    os.truncate(segment, segment.stat().st_size - 7)

    log = open_log(tmp_path)
    assert log.log_end_offset == 2
    retry = log.append(lost)
    assert not retry.duplicate and retry.base_offset == 2
    log.close()
