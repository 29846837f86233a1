"""Fixtures for the stream tests: a broker on the journal store, an asyncio runner for
`async def` tests, and a raw STOMP producer that sends chunks exactly as a test writes them."""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import RunningBroker, start_broker
from rawstomp import RawStomp
from sluice.stomp.encoding import encode_frame
from sluice.stomp.frames import Command

ASYNC_TEST_TIMEOUT_S = 60.0
Q = "/queue/files"
# Small journal files: quick to preallocate, and streams roll over several of them.
JOURNAL_FILE_BYTES = 4 * 1024 * 1024


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """Run `async def` tests on a fresh event loop, with a time limit."""
    if not inspect.iscoroutinefunction(pyfuncitem.obj):
        return None
    names = pyfuncitem._fixtureinfo.argnames
    kwargs = {name: pyfuncitem.funcargs[name] for name in names}

    async def limited() -> None:
        async with asyncio.timeout(ASYNC_TEST_TIMEOUT_S):
            await pyfuncitem.obj(**kwargs)

    asyncio.run(limited())
    return True


def journal_broker(tmp_path: Path, *, stomp_port: int = 0, **policy: Any) -> RunningBroker:
    """A broker on the journal store in `tmp_path/data`, with `[policy]` overrides; on
    `stomp_port` to start again where an earlier one listened."""
    overrides: dict[str, dict[str, Any]] = {
        "stomp": {"port": stomp_port},
        "store": {
            "kind": "journal",
            "data_dir": str(tmp_path / "data"),
            "journal_file_bytes": JOURNAL_FILE_BYTES,
        },
    }
    if policy:
        overrides["policy"] = policy
    return start_broker(**overrides)


@pytest.fixture
def jbroker(tmp_path: Path) -> Iterator[RunningBroker]:
    """A broker on the journal store."""
    running = journal_broker(tmp_path)
    try:
        yield running
    finally:
        running.stop()


def payload(size: int, seed: int = 1) -> bytes:
    """Deterministic bytes that are not all alike."""
    out = bytearray()
    block = hashlib.sha256(seed.to_bytes(8, "little")).digest()
    while len(out) < size:
        block = hashlib.sha256(block).digest()
        out += block * 64
    return bytes(out[:size])


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class RawProducer:
    """Sends SEND frames with exactly the headers a test gives, each with a receipt."""

    def __init__(self, port: int) -> None:
        self.raw = RawStomp(port)
        self.raw.connect()
        self._receipts = 0

    def send(self, headers: dict[str, str], body: bytes = b"", destination: str = Q) -> None:
        self._receipts += 1
        receipt = f"r{self._receipts}"
        frame_headers = {"destination": destination, "persistent": "true", "receipt": receipt}
        frame_headers.update(headers)
        self.raw.send(encode_frame(Command.SEND, frame_headers, body))
        answer = self.raw.frame()
        assert answer.command == "RECEIPT", answer
        assert answer.headers["receipt-id"] == receipt

    def begin(self, transaction: str) -> None:
        """BEGIN, with a receipt."""
        self.raw.send(encode_frame(Command.BEGIN, {"transaction": transaction, "receipt": "b"}))
        assert self.raw.frame().command == "RECEIPT"

    def chunk(
        self,
        stream_id: str,
        seq: int,
        offset: int,
        body: bytes,
        *,
        end: bytes | None = None,
        **extra: str,
    ) -> None:
        """One chunk; with `end` (the whole stream's bytes) it is the end chunk."""
        headers = {
            "x-stream-id": stream_id,
            "x-stream-seq": str(seq),
            "x-stream-offset": str(offset),
        }
        if end is not None:
            headers.update(
                {
                    "x-stream-end": "true",
                    "x-stream-length": str(len(end)),
                    "x-stream-sha256": sha(end),
                }
            )
        headers.update({k.replace("_", "-"): v for k, v in extra.items()})
        self.send(headers, body)

    def stream(self, stream_id: str, data: bytes, chunk: int) -> None:
        """A whole well-formed stream."""
        pieces = [data[i : i + chunk] for i in range(0, len(data), chunk)] or [b""]
        offset = 0
        for seq, piece in enumerate(pieces):
            last = seq == len(pieces) - 1
            self.chunk(stream_id, seq, offset, piece, end=data if last else None)
            offset += len(piece)

    def close(self) -> None:
        self.raw.close()


def run_cli(*args: str, timeout: float = 60.0, **popen: Any) -> subprocess.CompletedProcess[str]:
    """Run `python -m sluice ARGS` and wait for it."""
    return subprocess.run(
        [sys.executable, "-m", "sluice", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
        check=False,
        **popen,
    )


def start_cli(*args: str) -> subprocess.Popen[str]:
    """Start `python -m sluice ARGS` without waiting."""
    return subprocess.Popen(
        [sys.executable, "-m", "sluice", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
    )


@pytest.fixture
def refused_address() -> str:
    """A 127.0.0.1 address where nothing listens."""
    import socket  # noqa: PLC0415

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"127.0.0.1:{port}"
