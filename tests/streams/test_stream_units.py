"""Pure parts of streams: chunk headers, safe names, sizes, the progress bar, re-chunking."""

from __future__ import annotations

import argparse
import dataclasses
import io

import pytest

from sluice.cli.getdir import MAX_NAME_BYTES, safe_name
from sluice.cli.progress import Progress, format_bytes, format_duration
from sluice.cli.transfer import _size
from sluice.client.message import Message
from sluice.client.streams.chunker import _Rechunker
from sluice.client.streams.chunks import parse_chunk
from sluice.client.streams.options import StreamOptionFields, StreamOptions
from sluice.errors import ClientError


def _message(headers: dict[str, str]) -> Message:
    return Message("/queue/q", "m-1", "s", "a", headers, b"")


def test_parse_chunk() -> None:
    chunk, problem = parse_chunk(
        _message(
            {
                "x-stream-id": "s",
                "x-stream-seq": "3",
                "x-stream-offset": " 30 ",
                "x-stream-end": "true",
                "x-stream-length": "35",
                "x-stream-sha256": "AB" * 32,
            }
        )
    )
    assert problem is None
    assert chunk is not None
    assert (chunk.stream_id, chunk.seq, chunk.offset, chunk.end, chunk.length) == (
        "s", 3, 30, True, 35,
    )  # fmt: skip
    assert chunk.sha256 == "ab" * 32
    abort, _ = parse_chunk(_message({"x-stream-id": "s", "x-stream-abort": "true"}))
    assert abort is not None
    assert abort.abort
    assert abort.abort_reason == "no reason given"
    for bad in (
        {"x-stream-id": "s", "x-stream-seq": "-1"},
        {"x-stream-id": "s", "x-stream-seq": "٣"},
    ):
        chunk, problem = parse_chunk(_message(bad))
        assert chunk is None
        assert problem is not None


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("report.pdf", "report.pdf"),
        ("../../etc/passwd", "passwd"),
        ("C:\\Users\\x\\evil.exe", "evil.exe"),
        ("...hidden", "hidden"),
        ("a\x00b\nc", "abc"),
        ("dir/", "stream-abc"),
        ("..", "stream-abc"),
        (None, "stream-abc"),
    ],
)
def test_safe_name(raw: str | None, expected: str) -> None:
    assert safe_name(raw, "abc") == expected


def test_safe_name_is_bounded_and_id_sanitized() -> None:
    assert len(safe_name("é" * 500, "x").encode()) <= MAX_NAME_BYTES
    assert safe_name("", "../x/y") == "stream-xy"


def test_sizes() -> None:
    assert _size("1048576") == 1 << 20
    assert _size("64k") == _size("64KiB") == _size("64 KB") == 65536
    assert _size("2MiB") == 2 << 20
    with pytest.raises(argparse.ArgumentTypeError):
        _size("lots")


def test_progress_bar() -> None:
    out = io.StringIO()
    bar = Progress("f.bin", 1000, out, enabled=True)
    bar.update(500)
    bar.close()
    text = out.getvalue()
    assert "f.bin" in text
    assert "50.0%" in text or "100.0%" in text
    assert text.endswith("\n")
    quiet = io.StringIO()
    silent = Progress("f.bin", None, quiet, enabled=False)
    silent.update(10)
    silent.close()
    assert quiet.getvalue() == ""
    assert format_bytes(1536) == "1.5 KiB"
    assert format_bytes(10) == "10 B"
    assert format_duration(3725) == "1:02:05"
    assert format_duration(75) == "1:15"


def test_rechunker() -> None:
    cutter = _Rechunker(4)
    out = cutter.feed(b"ab") + cutter.feed(b"cdefghij") + cutter.feed(memoryview(b"k"))
    assert out == [b"abcd", b"efgh"]
    assert cutter.rest() == b"ijk"
    assert cutter.rest() == b""


def test_stream_options_are_checked_and_changed_by_keywords() -> None:
    # The keyword arguments of send_stream are exactly the fields of StreamOptions.
    assert set(StreamOptionFields.__annotations__) == {
        field.name for field in dataclasses.fields(StreamOptions)
    }
    base = StreamOptions(chunk_size=10, stream_id="s")
    assert StreamOptions.of(base, {"window": 2}) == StreamOptions(
        chunk_size=10, stream_id="s", window=2
    )
    assert StreamOptions.of(None, {}) == StreamOptions()
    with pytest.raises(ClientError, match="chunk_size"):
        StreamOptions(chunk_size=0)
    with pytest.raises(ClientError, match="window"):
        StreamOptions.of(base, {"window": 0})
    with pytest.raises(ClientError, match="x-stream-seq"):
        StreamOptions(headers={"x-stream-seq": "1"})
