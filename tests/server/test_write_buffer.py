"""A consumer that stops reading: what the broker queues for it in user space stays near its
connection's write high-water mark, even when a dispatch pass has much more to give."""

from __future__ import annotations

import socket
from typing import Any

from conftest import start_broker
from rawstomp import RawStomp

KiB = 1024
HIGH = 64 * KiB
LOW = 16 * KiB
MESSAGE_BYTES = 1 * KiB
MESSAGES = 8000  # far more than the socket buffers take


def _outbound_bytes(server: Any, destination: str) -> tuple[bool, int] | None:
    """For the session subscribed to `destination`: is it writable, and how many bytes wait in
    user space (queued frames and the transport's buffer)?"""
    for session in server.sessions:
        core = session.core
        if core is None or not any(s.destination.name == destination for s in core.subs.values()):
            continue
        return session.writable, session.outbound.pending_bytes
    return None


def test_a_dispatch_pass_stops_at_the_write_high_water_mark() -> None:
    broker = start_broker(limits={"write_buffer_high_bytes": HIGH, "write_buffer_low_bytes": LOW})
    consumer = socket.socket()
    try:
        producer = RawStomp(broker.port)
        producer.connect()
        body = b"x" * MESSAGE_BYTES
        frames = b"".join(
            b"SEND\ndestination:/queue/flood\ncontent-length:%d\n\n%b\0" % (len(body), body)
            for _ in range(MESSAGES)
        )
        producer.send(frames + b"DISCONNECT\nreceipt:sent\n\n\0")
        assert producer.frame().headers["receipt-id"] == "sent"
        # A consumer that never reads, with a small receive window.
        consumer.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 * KiB)
        consumer.connect(("127.0.0.1", broker.port))
        consumer.sendall(
            b"CONNECT\naccept-version:1.2\nhost:localhost\n\n\0"
            b"SUBSCRIBE\nid:1\ndestination:/queue/flood\nack:auto\n\n\0"
        )
        state = None
        for _ in range(200):  # the broker stops writing once the socket buffers are full
            state = broker.call(lambda: _outbound_bytes(broker.server, "/queue/flood"))
            if state is not None and not state[0]:
                break
            broker.call(lambda: None)  # one more turn of the broker's loop
        assert state is not None
        writable, waiting = state
        assert not writable
        # Before it noticed, a pass handed the connection at most about one mark's worth more.
        assert waiting <= 2 * HIGH + 2 * MESSAGE_BYTES, waiting
    finally:
        consumer.close()
        broker.stop()
