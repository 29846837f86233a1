"""Throughput of the STOMP codec on 1 KiB SEND frames: parse and encode, frames per second.

Also parses through a server-side `StompConnection`, to show what the state machine adds.

Run: `.venv/bin/python benchmarks/stomp_codec.py [--frames N] [--chunk BYTES] [--repeat R]`.
Parsing feeds the stream in chunks of `--chunk` bytes (as a socket read would) and drains the
parser after each one. Prints the best of `--repeat` runs.
"""

from __future__ import annotations

import argparse
import time

from sluice.stomp.codec import FrameParser, StompLimits
from sluice.stomp.connection import Role, StompConnection
from sluice.stomp.encoding import encode_frame
from sluice.stomp.frames import Command, Frame, Version

HEADERS = {
    "destination": "/queue/bench",
    "persistent": "true",
    "receipt": "r-123456",
    "priority": "4",
    "correlation-id": "c-0001",
}
BODY = bytes(range(256)) * 4


def bench_parse(stream: bytes, frames: int, chunk: int) -> float:
    """Parse `stream` fed in `chunk`-byte pieces; return frames per second."""
    parser = FrameParser(StompLimits())
    view = memoryview(stream)
    count = 0
    start = time.perf_counter()
    for offset in range(0, len(stream), chunk):
        parser.feed(view[offset : offset + chunk])
        while (event := parser.next_event()) is not None:
            if type(event) is Frame:
                count += 1
    elapsed = time.perf_counter() - start
    assert count == frames, count
    return frames / elapsed


def bench_connection(stream: bytes, frames: int, chunk: int) -> float:
    """Like `bench_parse`, through a connected server-side `StompConnection` (state and headers
    checked per frame); return frames per second."""
    conn = StompConnection(Role.SERVER)
    conn.receive_data(b"CONNECT\naccept-version:1.2\nhost:h\n\n\0", 0.0)
    connect = conn.next_event()
    assert isinstance(connect, Frame)
    conn.accept(connect, server_heartbeat=(0, 0), server_name="bench", session="1")
    view = memoryview(stream)
    count = 0
    start = time.perf_counter()
    for offset in range(0, len(stream), chunk):
        conn.receive_data(view[offset : offset + chunk], 0.0)
        while (event := conn.next_event()) is not None:
            if type(event) is Frame:
                count += 1
    elapsed = time.perf_counter() - start
    assert count == frames, count
    return frames / elapsed


def bench_encode(frames: int) -> float:
    """Encode `frames` SEND frames; return frames per second."""
    start = time.perf_counter()
    for _ in range(frames):
        encode_frame(Command.SEND, HEADERS, BODY, Version.V1_2)
    return frames / (time.perf_counter() - start)


def main() -> None:
    """Run both benchmarks and print the results."""
    args = argparse.ArgumentParser(description=__doc__)
    args.add_argument("--frames", type=int, default=200_000)
    args.add_argument("--chunk", type=int, default=65_536)
    args.add_argument("--repeat", type=int, default=3)
    options = args.parse_args()
    frame = encode_frame(Command.SEND, HEADERS, BODY, Version.V1_2)
    stream = frame * options.frames
    parse = max(bench_parse(stream, options.frames, options.chunk) for _ in range(options.repeat))
    conn = max(
        bench_connection(stream, options.frames, options.chunk) for _ in range(options.repeat)
    )
    encode = max(bench_encode(options.frames) for _ in range(options.repeat))
    print(f"frame size: {len(frame)} bytes, {options.frames} frames, {options.chunk}-byte reads")
    print(f"parse:  {parse:,.0f} frames/s ({parse * len(frame) / 1e6:,.0f} MB/s)")
    print(f"parse through StompConnection (server): {conn:,.0f} frames/s")
    print(f"encode: {encode:,.0f} frames/s ({encode * len(frame) / 1e6:,.0f} MB/s)")


if __name__ == "__main__":
    main()
