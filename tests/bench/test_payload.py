"""Bodies: what a producer encodes, a consumer decodes and checks."""

from __future__ import annotations

import pytest

from sluice.bench.payload import (
    HEAD_BYTES,
    MAGIC,
    BodyError,
    decode_body,
    encode_body,
    encode_head,
    filler,
)


@pytest.mark.parametrize("size", [HEAD_BYTES, HEAD_BYTES + 1, 100, 1024, 65536])
def test_round_trip(size: int) -> None:
    body = encode_body(7, 123_456_789, 10**15, size, intended_ns=10**15 - 5)
    assert len(body) == size
    head = decode_body(body, size)
    assert (head.producer, head.seq, head.sent_ns, head.intended_ns) == (
        7,
        123_456_789,
        10**15,
        10**15 - 5,
    )


def test_intended_defaults_to_sent() -> None:
    head = decode_body(encode_body(0, 0, 42, 64), 64)
    assert head.intended_ns == 42


def test_head_is_what_the_hot_path_concatenates() -> None:
    assert encode_head(1, 2, 3) + filler(100) == encode_body(1, 2, 3, 100)
    assert encode_head(1, 2, 3).startswith(MAGIC)


def test_too_small_a_size_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 32"):
        filler(HEAD_BYTES - 1)


def test_wrong_size_is_detected() -> None:
    body = encode_body(1, 1, 1, 100)
    with pytest.raises(BodyError, match="99 bytes"):
        decode_body(body[:-1], 100)


def test_wrong_magic_is_detected() -> None:
    body = bytearray(encode_body(1, 1, 1, 100))
    body[0] ^= 0xFF
    with pytest.raises(BodyError, match="magic"):
        decode_body(bytes(body), 100)


def test_damaged_filler_is_detected() -> None:
    body = bytearray(encode_body(1, 1, 1, 100))
    body[-1] ^= 0x01
    with pytest.raises(BodyError, match="filler"):
        decode_body(bytes(body), 100, expected_filler=filler(100))
