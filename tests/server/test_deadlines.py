"""Deadlines against silent and trickling peers, over real sockets with small configured values:
a frame must be complete within `frame_timeout_s` of its first byte; a connection without
heart-beats that sends nothing and holds nothing is closed after `idle_timeout_s`; a consumer
that is legitimately idle (it has a subscription) is not."""

from __future__ import annotations

from conftest import RunningBroker, start_broker
from rawstomp import RawStomp
from waiting import wait_until


def _broker(**limits: object) -> RunningBroker:
    return start_broker(limits=limits)


def _error_message(peer: RawStomp) -> str:
    frame = peer.frame(timeout=20)
    assert frame.command == "ERROR", frame
    return frame.headers["message"]


def test_a_frame_trickled_past_its_deadline_is_refused_with_the_limit_named() -> None:
    broker = _broker(frame_timeout_s=0.3, idle_timeout_s=0)
    try:
        peer = RawStomp(broker.port)
        peer.connect(extra="heart-beat:0,0\n")
        # The first bytes of a frame, and no more: the broker closes it at the deadline.
        peer.send(b"SEND\ndestination:/queue/slow\ncontent-length:100\n\nabc")
        assert "limit frame_timeout_s=0.3 exceeded" in _error_message(peer)
        assert peer.closed()
        stats = broker.stats()
        assert stats["frame_timeouts"] == 1
        assert stats["closed_frame_timeout"] == 1
    finally:
        broker.stop()


def test_a_partial_connect_frame_meets_the_frame_deadline_too() -> None:
    broker = _broker(frame_timeout_s=0.3)
    try:
        peer = RawStomp(broker.port)
        peer.send(b"CONNECT\naccept-version:1.2\nhost:loc")
        assert "frame_timeout_s" in _error_message(peer)
        assert peer.closed()
    finally:
        broker.stop()


def test_a_silent_connection_without_heartbeats_is_closed_but_a_subscriber_is_not() -> None:
    broker = _broker(idle_timeout_s=0.5)
    try:
        consumer = RawStomp(broker.port)
        consumer.connect(extra="heart-beat:0,0\n")
        consumer.send(b"SUBSCRIBE\nid:1\ndestination:/queue/idle\nreceipt:s\n\n\0")
        assert consumer.frame().command == "RECEIPT"
        # Silent from now on, like the consumer (which has been silent for longer).
        silent = RawStomp(broker.port)
        silent.connect(extra="heart-beat:0,0\n")
        assert "limit idle_timeout_s=0.5 exceeded" in _error_message(silent)
        assert silent.closed()
        wait_until(lambda: broker.stats().get("closed_idle_timeout") == 1, what="idle close")
        # The consumer, idle at least as long, is still served.
        producer = RawStomp(broker.port)
        producer.connect()
        producer.send(b"SEND\ndestination:/queue/idle\nreceipt:p\n\nhello\0")
        assert producer.frame().command == "RECEIPT"
        message = consumer.frame()
        assert message.command == "MESSAGE"
        assert message.body == b"hello"
        assert broker.stats()["idle_timeouts"] == 1
    finally:
        broker.stop()


def test_deadlines_off_leave_a_silent_connection_open() -> None:
    broker = _broker(idle_timeout_s=0, frame_timeout_s=0)
    try:
        peer = RawStomp(broker.port)
        peer.connect(extra="heart-beat:0,0\n")
        peer.send(b"SEND\ndestination:/queue/x\n")
        # With a deadline on, this wait is long enough for it to fire many times over.
        assert not peer.closed(timeout=1.0)
        stats = broker.stats()
        assert stats.get("frame_timeouts", 0) == 0
        assert stats.get("idle_timeouts", 0) == 0
    finally:
        broker.stop()
