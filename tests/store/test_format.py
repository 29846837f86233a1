"""Round trips of every record type, and decoders that only ever fail with FormatError."""

from __future__ import annotations

import contextlib
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.store.api import StoredMessage
from sluice.store.journal import format as fmt
from sluice.store.journal.scan import check_record

from .helpers import fields

text = st.text(max_size=40)
u64 = st.integers(min_value=0, max_value=(1 << 64) - 1)
u32 = st.integers(min_value=0, max_value=(1 << 32) - 1)

messages = st.builds(
    StoredMessage,
    destination=text,
    seq=u64,
    message_id=text,
    timestamp_ms=u64,
    headers=st.dictionaries(text, st.text(max_size=200), max_size=8),
    body=st.binary(max_size=3000),
    expires_ms=u64,
    priority=st.integers(min_value=0, max_value=255),
    persistent=st.booleans(),
)

records = st.one_of(
    st.builds(fmt.Remove, u64, text, u64),
    st.builds(fmt.RemoveRange, text, u64),
    st.builds(fmt.TxBegin, u64, text),
    st.builds(fmt.TxCommit, u64, st.lists(u64, max_size=50).map(tuple)),
    st.builds(fmt.TxAbort, u64),
    st.builds(fmt.SubPut, text, text, text, st.none() | st.text(max_size=100), u64),
    st.builds(fmt.SubDelete, text, text),
    st.builds(fmt.SubCursor, text, text, u64),
    st.builds(fmt.DestDelete, text),
    st.builds(fmt.DispatchMark, text, u64),
    st.builds(fmt.DestState, text, u64, u64, st.lists(text, max_size=20).map(tuple)),
    st.builds(fmt.Checkpoint, u32, u64, u64),
    st.builds(fmt.FileHeader, u32, st.binary(min_size=16, max_size=16), u64),
)


@given(messages, u64, u32, st.booleans())
def test_add_round_trip(message: StoredMessage, txno: int, ordinal: int, copy: bool) -> None:
    prefix, body, meta = fmt.encode_add(message, txno, ordinal, copy=copy)
    payload = prefix + body
    decoded, meta2 = fmt.decode_add(payload)
    assert fields(decoded) == fields(message)
    assert meta2 == meta
    assert fmt.decode_add_meta(payload) == meta
    assert meta.size == message.size
    assert meta.dedup_id == ("" if copy else message.headers.get("x-dedup-id", ""))
    record = fmt.record_bytes(fmt.RecordType.ADD, payload)
    assert check_record(record, 0) == (fmt.RecordType.ADD, len(record), "")


@given(records)
def test_record_round_trip(record: fmt.Record) -> None:
    rtype, payload = fmt.encode(record)
    assert fmt.decode(rtype, payload) == record
    whole = fmt.record_bytes(rtype, payload)
    assert check_record(whole, 0) == (rtype, len(whole), "")


@settings(max_examples=300)
@given(st.sampled_from(sorted(fmt.VALID_TYPES)), st.binary(max_size=300))
def test_random_payloads_only_raise_format_error(rtype: int, payload: bytes) -> None:
    try:
        if rtype == fmt.RecordType.ADD:
            fmt.decode_add(payload)
        else:
            fmt.decode(rtype, payload)
    except fmt.FormatError:
        pass


@given(messages, st.data())
def test_truncated_or_flipped_add_never_crashes(
    message: StoredMessage, data: st.DataObject
) -> None:
    prefix, body, _ = fmt.encode_add(message)
    payload = bytearray(prefix + body)
    cut = data.draw(st.integers(min_value=0, max_value=len(payload)))
    flips = data.draw(st.lists(st.integers(0, max(len(payload) - 1, 0)), max_size=4))
    for i in flips:
        if payload:
            payload[i] ^= 0xFF
    with contextlib.suppress(fmt.FormatError):
        fmt.decode_add(bytes(payload[:cut]))


def test_huge_declared_lengths_are_refused_before_allocating() -> None:
    # A header count of 2**32-1 in a tiny payload must fail fast, not loop or allocate.
    prefix, body, _ = fmt.encode_add(StoredMessage("/q", 1, "m", 1, {}, b""))
    fixed = 42  # the fixed-size part of an ADD payload
    strings = 2 + 2 + 2 + len("/q") + len("m")
    damaged = bytearray(prefix + body)
    struct.pack_into("<I", damaged, fixed + strings, 0xFFFF_FFFF)
    with pytest.raises(fmt.FormatError):
        fmt.decode_add(bytes(damaged))
    header = bytearray(fmt.record_bytes(fmt.RecordType.REMOVE, b"x" * 20))
    struct.pack_into("<I", header, 0, 0xFFFF_FFF0)
    rtype, _, reason = check_record(bytes(header), 0)
    assert rtype == 0
    assert "length" in reason


def test_zero_header_is_never_a_record() -> None:
    assert check_record(b"\0" * 64, 0)[0] == 0


def test_strings_too_long_are_refused() -> None:
    with pytest.raises(fmt.FormatError):
        fmt.encode(fmt.DestDelete("x" * 70_000))
