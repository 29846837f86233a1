"""Scanning a data file across damage: resync finds the next intact record, cheaply."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import pytest

from sluice.store.api import StoredMessage
from sluice.store.journal import format as fmt
from sluice.store.journal.scan import Damage, FileScan, ScannedRecord

STORE_ID = b"s" * 16


def add_record(seq: int, body: bytes) -> bytes:
    prefix, body, _ = fmt.encode_add(StoredMessage("/queue/s", seq, f"m{seq}", 1, {}, body))
    return fmt.record_bytes(fmt.RecordType.ADD, prefix + body)


def write_file(path: Path, records: list[bytes], zeros: int) -> list[int]:
    """Header, then `records`, then zero fill; returns each record's offset."""
    data = bytearray(fmt.encode_file_header(1, STORE_ID, 0))
    offsets = []
    for record in records:
        offsets.append(len(data))
        data += record
    data += bytes(zeros)
    path.write_bytes(bytes(data))
    return offsets


@pytest.fixture
def crc_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Lengths of every payload checksummed through `format.payload_crc`."""
    calls: list[int] = []
    real: Callable[[int, bytes | memoryview], int] = fmt.payload_crc

    def counting(rtype: int, payload: bytes | memoryview) -> int:
        calls.append(len(payload))
        return real(rtype, payload)

    monkeypatch.setattr(fmt, "payload_crc", counting)
    return calls


@pytest.mark.parametrize("damaged_byte", [0, 3, 8, 40])
def test_resync_over_a_large_damaged_record_checks_few_checksums(
    tmp_path: Path, crc_calls: list[int], damaged_byte: int
) -> None:
    rng = random.Random(damaged_byte)
    big = bytearray(add_record(2, rng.randbytes(8 * 1024 * 1024)))
    big[damaged_byte] ^= 0x5A  # length, type or a payload byte: the record is damaged
    records = [add_record(1, b"a" * 100), bytes(big), add_record(3, b"c" * 100)]
    path = tmp_path / "db-1.log"
    offsets = write_file(path, records, zeros=1024 * 1024)
    items = list(FileScan(path))
    kinds = [(type(i).__name__, i.offset) for i in items]
    assert kinds == [
        ("ScannedRecord", 0),
        ("ScannedRecord", offsets[0]),
        ("Damage", offsets[1]),
        ("ScannedRecord", offsets[2]),
    ]
    damage = items[2]
    assert isinstance(damage, Damage)
    assert damage.resume == offsets[2]
    # Bounded work, whatever the machine: a handful of checksums, none over megabytes of
    # candidates that were never records. (Trying every offset did thousands.)
    assert len(crc_calls) <= 8, len(crc_calls)
    assert sum(crc_calls) <= len(big) + 64 * 1024


def test_intact_record_between_two_damaged_ones_is_found(tmp_path: Path) -> None:
    records = [add_record(i, bytes([i]) * 3000) for i in range(1, 5)]
    path = tmp_path / "db-1.log"
    offsets = write_file(path, records, zeros=4096)
    raw = bytearray(path.read_bytes())
    raw[offsets[0] + 20] ^= 1  # payload of record 1
    raw[offsets[2] + 8] ^= 0x80  # type byte of record 3: its header is implausible
    path.write_bytes(bytes(raw))
    found = [i.offset for i in FileScan(path) if isinstance(i, ScannedRecord)]
    assert found == [0, offsets[1], offsets[3]]


def test_record_after_a_zeroed_stretch_is_found_when_it_starts_with_zero_bytes(
    tmp_path: Path,
) -> None:
    # A payload of exactly 512 bytes: the record's first byte (length, little endian) is zero.
    overhead = len(add_record(2, b"")) - fmt.HEADER_BYTES
    second = add_record(2, b"y" * (512 - overhead))
    assert second[0] == 0
    records = [add_record(1, b"x" * 500), second]
    path = tmp_path / "db-1.log"
    offsets = write_file(path, records, zeros=1024)
    raw = bytearray(path.read_bytes())
    raw[offsets[0] : offsets[1]] = bytes(offsets[1] - offsets[0])  # a zeroed sector
    path.write_bytes(bytes(raw))
    items = list(FileScan(path))
    assert [type(i).__name__ for i in items] == ["ScannedRecord", "Damage", "ScannedRecord"]
    assert items[2].offset == offsets[1]


def test_padding_record_round_trip() -> None:
    record = fmt.padding_header(300) + bytes(291)
    length, crc, rtype = fmt.HEADER.unpack_from(record)
    assert (length, rtype) == (291, fmt.RecordType.PADDING)
    assert fmt.payload_crc(rtype, record[9:]) == crc
    assert fmt.decode(rtype, record[9:]) == fmt.Padding(291)
