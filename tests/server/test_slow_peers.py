"""Peers that do not read, over real sockets: the broker stops reading them once their outbound
buffer passes its high-water mark, so what it holds for them stays bounded; it reads them again
once they drain; and it closes, as slow, a peer stuck past `slow_consumer_timeout_s`."""

from __future__ import annotations

import select
import threading
import time

from conftest import RunningBroker, start_broker
from rawstomp import RawStomp
from sluice.server.flow import ReadPause
from waiting import wait_until

from .conftest import sessions

HIGH = 64 * 1024
LOW = 16 * 1024
# One RECEIPT of a 200-byte receipt id, with room to spare: what may pass the high-water mark.
ONE_REPLY = 1024
# Kernel socket buffers absorb megabytes before the broker's own buffer fills; stop well beyond.
MAX_SENT = 128 * 1024 * 1024
PAIRS_PER_CHUNK = 128


def _broker(**limits: object) -> RunningBroker:
    return start_broker(
        limits={"write_buffer_high_bytes": HIGH, "write_buffer_low_bytes": LOW, **limits}
    )


def _receipt_id(n: int) -> bytes:
    return b"%08d" % n + b"." * 192


def _pairs(first: int, pairs: int) -> bytes:
    """Receipted BEGIN/ABORT pairs: each frame asks for a reply and costs nothing else."""
    out = []
    for n in range(first, first + 2 * pairs, 2):
        out.append(b"BEGIN\ntransaction:t\nreceipt:%b\n\n\0" % _receipt_id(n))
        out.append(b"ABORT\ntransaction:t\nreceipt:%b\n\n\0" % _receipt_id(n + 1))
    return b"".join(out)


def _not_reading_peer(broker: RunningBroker) -> tuple[RawStomp, int, bytes]:
    """Connect, then send receipted frames without reading a byte until the broker stops reading
    this connection (or, with a short deadline, has already closed it as slow). Returns the peer,
    the number of frames begun, and the bytes not yet sent."""
    peer = RawStomp(broker.port, timeout=60, rcvbuf=4096)
    peer.connect()
    peer.sock.setblocking(False)
    frames, pending, sent = 0, b"", 0
    while True:
        if not pending:
            assert sent < MAX_SENT, "the broker kept reading a peer that reads nothing"
            pending = _pairs(frames, PAIRS_PER_CHUNK)
            frames += 2 * PAIRS_PER_CHUNK
        try:
            count = peer.sock.send(pending)
        except BlockingIOError:
            views = sessions(broker)
            if not views or ReadPause.OUTBOUND in views[0].reasons:
                return peer, frames, pending
            select.select([], [peer.sock], [], 0.05)
            continue
        except (ConnectionResetError, BrokenPipeError):
            return peer, frames, pending  # closed as slow already
        pending = pending[count:]
        sent += count


def test_a_peer_that_does_not_read_is_not_read_and_its_replies_stay_bounded() -> None:
    broker = _broker()
    try:
        peer, frames, pending = _not_reading_peer(broker)
        (view,) = sessions(broker)
        assert ReadPause.OUTBOUND in view.reasons
        assert not view.writable
        assert view.outbound_bytes <= HIGH + ONE_REPLY, view
        assert broker.stats()["write_paused"] >= 1

        # The peer reads at last: the broker drains, reads again, and answers every frame in order.
        peer.sock.setblocking(True)
        rest = threading.Thread(
            target=peer.sock.sendall, args=(pending + b"DISCONNECT\nreceipt:end\n\n\0",)
        )
        rest.start()
        expected = 0
        while True:
            receipt = peer.frame(timeout=60)
            assert receipt.command == "RECEIPT", receipt
            if receipt.headers["receipt-id"] == "end":
                break
            assert receipt.headers["receipt-id"] == _receipt_id(expected).decode()
            expected += 1
        rest.join(60)
        assert expected == frames
        assert broker.stats().get("slow_consumers_closed", 0) == 0
    finally:
        broker.stop()


def test_a_peer_stuck_past_the_deadline_is_closed_as_slow() -> None:
    broker = _broker(slow_consumer_timeout_s=0.5)
    try:
        peer, _, _ = _not_reading_peer(broker)
        wait_until(lambda: broker.stats().get("slow_consumers_closed") == 1, what="slow close")
        assert broker.stats()["closed_slow_consumer"] == 1
        assert sessions(broker) == []
        peer.sock.setblocking(True)
        assert peer.closed(timeout=10)
    finally:
        broker.stop()


def _subscribe(port: int, destination: str, rcvbuf: int | None = None) -> RawStomp:
    consumer = RawStomp(port, timeout=60, rcvbuf=rcvbuf)
    consumer.connect()
    consumer.send(b"SUBSCRIBE\nid:1\ndestination:%b\nack:auto\nreceipt:s\n\n\0" % destination)
    assert consumer.frame().headers["receipt-id"] == "s"
    return consumer


def test_a_slow_consumer_is_closed_past_its_deadline_and_counted() -> None:
    broker = _broker(slow_consumer_timeout_s=0.5)
    try:
        consumer = _subscribe(broker.port, b"/queue/slow", rcvbuf=4096)
        producer = RawStomp(broker.port)
        producer.connect()
        body = b"m" * 4096
        batch = b"SEND\ndestination:/queue/slow\n\n%b\0" % body * 63
        sent = 0
        # Produce until the consumer's outbound is full (the queue keeps the rest), or until it
        # was closed already when the deadline is shorter than a batch takes on a busy machine.
        while broker.stats().get("slow_consumers_closed", 0) == 0 and all(
            v.writable for v in sessions(broker) if v.subscriptions
        ):
            assert sent < MAX_SENT, "the consumer's outbound never filled"
            producer.send(batch + b"SEND\ndestination:/queue/slow\nreceipt:b\n\n%b\0" % body)
            assert producer.frame().headers["receipt-id"] == "b"
            sent += 64 * len(body)
        wait_until(lambda: broker.stats().get("slow_consumers_closed") == 1, what="slow close")
        stats = broker.stats()
        assert stats["closed_slow_consumer"] == 1
        assert stats["write_paused"] >= 1
        # Only the consumer went; the producer is still served.
        assert [v.subscriptions for v in sessions(broker)] == [0]
        producer.send(b"SEND\ndestination:/queue/slow\nreceipt:alive\n\nx\0")
        assert producer.frame().headers["receipt-id"] == "alive"
        assert consumer.closed(timeout=10)
    finally:
        broker.stop()


def test_a_consumer_that_also_produces_drains_and_is_read_again() -> None:
    broker = _broker()
    try:
        client = _subscribe(broker.port, b"/queue/echo", rcvbuf=4096)
        messages = 4096
        body = b"e" * 4088
        frames = [b"SEND\ndestination:/queue/echo\n\n%08d%b\0" % (i, body) for i in range(messages)]
        data = b"".join(frames) + b"SEND\ndestination:/queue/echo\nreceipt:last\n\nend\0"
        sender = threading.Thread(target=client.sock.sendall, args=(data,))
        sender.start()
        # Not reading: the broker's buffer for this connection fills and it stops reading it.
        deadline = time.monotonic() + 60
        while not any(ReadPause.OUTBOUND in v.reasons for v in sessions(broker)):
            assert time.monotonic() < deadline, "reading never paused"
            time.sleep(0.02)
        (view,) = sessions(broker)
        assert view.outbound_bytes <= HIGH + len(frames[0]) * 2, view
        # Now it reads: every message comes back in order, and the last SEND's receipt.
        received, receipt = 0, None
        while receipt is None or received < messages + 1:
            frame = client.frame(timeout=60)
            if frame.command == "RECEIPT":
                receipt = frame.headers["receipt-id"]
                continue
            assert frame.command == "MESSAGE", frame
            if received < messages:
                assert int(frame.body[:8]) == received
            else:
                assert frame.body == b"end"
            received += 1
        sender.join(60)
        assert receipt == "last"
        assert broker.stats().get("slow_consumers_closed", 0) == 0
    finally:
        broker.stop()
