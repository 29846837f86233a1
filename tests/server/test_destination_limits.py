"""The destination table against one hostile client, over real sockets: idle, empty destinations
are removed after `destination_idle_timeout_s` (and the broker's memory goes back down), one
connection may create at most `max_destinations_per_connection`, a name is at most
`max_destination_name_bytes`, and wildcard subscriptions count against
`max_subscriptions_per_connection`."""

from __future__ import annotations

import re
import time
from pathlib import Path

from brokerproc import BrokerProcess
from conftest import RunningBroker, start_broker
from rawstomp import RawStomp
from waiting import wait_until

MiB = 1024 * 1024
BATCH = 500


def _error_message(peer: RawStomp) -> str:
    frame = peer.frame(timeout=20)
    assert frame.command == "ERROR", frame
    return frame.headers["message"]


def _touch_destinations(peer: RawStomp, first: int, count: int) -> None:
    """Create destinations `first`.. as an attacker would: a SEND to a topic nobody reads (the
    message goes nowhere) and a SUBSCRIBE/UNSUBSCRIBE of a queue, each one left empty."""
    for start in range(first, first + count, BATCH):
        frames = []
        for n in range(start, min(start + BATCH, first + count)):
            if n % 2:
                frames.append(b"SEND\ndestination:/topic/d%d\n\nx\0" % n)
            else:
                frames.append(b"SUBSCRIBE\nid:s\ndestination:/queue/d%d\n\n\0" % n)
                frames.append(b"UNSUBSCRIBE\nid:s\n\n\0")
        frames.append(b"BEGIN\ntransaction:t\nreceipt:b%d\n\n\0ABORT\ntransaction:t\n\n\0" % start)
        peer.send(b"".join(frames))
        assert peer.frame(timeout=60).headers["receipt-id"] == f"b{start}"


def test_idle_destinations_are_removed_and_their_memory_given_back(tmp_path: Path) -> None:
    total = 30_000
    broker = BrokerProcess(
        f"""
[store]
kind = "memory"
[limits]
max_destinations_per_connection = {total}
destination_idle_timeout_s = 2.0
""",
        tmp_path,
    ).start()
    try:
        attacker = RawStomp(broker.port, timeout=60)
        attacker.connect()
        baseline = broker.rss_bytes()
        started = time.monotonic()
        _touch_destinations(attacker, 0, total)
        created_s = time.monotonic() - started
        full = broker.rss_bytes()
        assert full - baseline > 20 * MiB, "the destinations took no memory to measure"
        # First every destination removed, as the broker counts it: on a busy machine the
        # sweeps take as long as the machine makes them, and that is not what is tested here.
        wait_until(
            lambda: _removed_idle(broker) >= total,
            timeout=600,
            what=f"{total} idle destinations removed",
        )
        # Then back near the baseline: what stays is the allocator's (about 22 MiB here, of the
        # 100 MiB 30,000 destinations take). Creation and removal overlap on a busy machine, so
        # the peak is no yardstick.
        wait_until(
            lambda: broker.rss_bytes() - baseline < 28 * MiB,
            timeout=60,
            what="the memory of the removed destinations given back",
        )
        after = broker.rss_bytes()
        print(
            f"baseline {baseline / MiB:.1f} MiB, {total} destinations {full / MiB:.1f} MiB "
            f"(created in {created_s:.1f} s), after removal {after / MiB:.1f} MiB"
        )
        stopping = time.monotonic()
    finally:
        assert broker.stop() == 0
    print(f"stopped in {time.monotonic() - stopping:.1f} s")
    assert "idle destinations (unused for destination_idle_timeout_s=2)" in broker.log_text
    assert "Traceback" not in broker.log_text


_REMOVED_IDLE = re.compile(r"removed (\d+) idle destinations")


def _removed_idle(broker: BrokerProcess) -> int:
    """Idle destinations the broker has removed so far, from its log lines."""
    return sum(int(n) for n in _REMOVED_IDLE.findall(broker.log_text))


def _broker(**limits: object) -> RunningBroker:
    return start_broker(limits=limits)


def test_a_full_table_has_room_again_once_idle_destinations_go() -> None:
    broker = _broker(max_destinations=50, destination_idle_timeout_s=0.2)
    try:
        greedy = RawStomp(broker.port)
        greedy.connect()
        greedy.send(b"".join(b"SEND\ndestination:/topic/g%d\n\nx\0" % n for n in range(50)))
        greedy.send(b"SEND\ndestination:/topic/g0\nreceipt:r\n\nx\0")
        assert greedy.frame().command == "RECEIPT"
        other = RawStomp(broker.port)
        other.connect()
        other.send(b"SEND\ndestination:/queue/mine\nreceipt:m\n\nhello\0")
        assert "limit max_destinations=50 exceeded" in _error_message(other)
        wait_until(lambda: broker.stats()["destinations"] == 0, what="idle destinations removed")
        newcomer = RawStomp(broker.port)
        newcomer.connect()
        newcomer.send(b"SEND\ndestination:/queue/mine\nreceipt:m\n\nhello\0")
        assert newcomer.frame().command == "RECEIPT"
        assert broker.stats()["destinations_removed_idle"] == 50
    finally:
        broker.stop()


def test_a_destination_with_messages_or_a_durable_subscription_is_kept() -> None:
    broker = _broker(destination_idle_timeout_s=0.2)
    try:
        peer = RawStomp(broker.port)
        peer.connect(extra="client-id:c1\n")
        peer.send(b"SEND\ndestination:/queue/full\nreceipt:1\n\nkeep me\0")
        assert peer.frame().command == "RECEIPT"
        peer.send(
            b"SUBSCRIBE\nid:d\ndestination:/topic/durable\nactivemq.subscriptionName:n\n"
            b"receipt:2\n\n\0UNSUBSCRIBE\nid:d\nreceipt:3\n\n\0"
        )
        assert peer.frame().command == "RECEIPT"
        assert peer.frame().command == "RECEIPT"
        peer.send(b"SUBSCRIBE\nid:e\ndestination:/queue/empty\nreceipt:4\n\n\0")
        assert peer.frame().command == "RECEIPT"
        peer.send(b"UNSUBSCRIBE\nid:e\nreceipt:5\n\n\0")
        assert peer.frame().command == "RECEIPT"
        names = lambda: set(broker.server.broker.destinations)  # noqa: E731
        wait_until(lambda: "/queue/empty" not in broker.call(names), what="/queue/empty removed")
        kept = broker.call(names)
        assert {"/queue/full", "/topic/durable"} <= kept
        assert broker.stats()["destinations_removed_idle"] >= 1
        # The message is still there for a consumer.
        peer.send(b"SUBSCRIBE\nid:f\ndestination:/queue/full\n\n\0")
        assert peer.frame().body == b"keep me"
    finally:
        broker.stop()


def test_a_topic_created_again_numbers_on() -> None:
    broker = _broker(destination_idle_timeout_s=0.2)
    try:
        peer = RawStomp(broker.port)
        peer.connect()
        peer.send(b"SUBSCRIBE\nid:1\ndestination:/topic/t\n\n\0")
        for n in range(3):
            peer.send(b"SEND\ndestination:/topic/t\n\n%d\0" % n)
        offsets = [int(peer.frame().headers["x-offset"]) for _ in range(3)]
        peer.send(b"UNSUBSCRIBE\nid:1\nreceipt:u\n\n\0")
        assert peer.frame().command == "RECEIPT"
        wait_until(
            lambda: "/topic/t" not in broker.call(lambda: set(broker.server.broker.destinations)),
            what="/topic/t removed",
        )
        peer.send(b"SUBSCRIBE\nid:2\ndestination:/topic/t\n\n\0SEND\ndestination:/topic/t\n\nz\0")
        assert int(peer.frame().headers["x-offset"]) == offsets[-1] + 1
    finally:
        broker.stop()


def test_one_connection_may_create_only_its_quota_of_destinations() -> None:
    broker = _broker(max_destinations_per_connection=5, destination_idle_timeout_s=0)
    try:
        greedy = RawStomp(broker.port)
        greedy.connect()
        greedy.send(b"".join(b"SEND\ndestination:/queue/g%d\n\nx\0" % n for n in range(5)))
        # Sending to destinations that exist costs nothing of the quota.
        greedy.send(b"SEND\ndestination:/queue/g0\nreceipt:ok\n\nx\0")
        assert greedy.frame().headers["receipt-id"] == "ok"
        greedy.send(b"SEND\ndestination:/queue/g5\nreceipt:r\n\nx\0")
        error = _error_message(greedy)
        assert "limit max_destinations_per_connection=5 exceeded" in error
        # Others keep their own quota.
        other = RawStomp(broker.port)
        other.connect()
        other.send(b"SEND\ndestination:/queue/o\nreceipt:r\n\nx\0")
        assert other.frame().command == "RECEIPT"
        assert broker.stats()["limit_max_destinations_per_connection"] == 1
    finally:
        broker.stop()


def test_a_destination_name_longer_than_the_limit_is_refused() -> None:
    broker = _broker(max_destination_name_bytes=64)
    try:
        for frame in (
            b"SEND\ndestination:/queue/%b\nreceipt:r\n\nx\0" % (b"n" * 100),
            b"SUBSCRIBE\nid:1\ndestination:/topic/%b.>\nreceipt:r\n\n\0" % (b"n" * 100),
        ):
            peer = RawStomp(broker.port)
            peer.connect()
            peer.send(frame)
            assert "limit max_destination_name_bytes=64 exceeded" in _error_message(peer)
        assert broker.stats()["limit_max_destination_name_bytes"] == 2
        assert broker.stats()["destinations"] == 0
    finally:
        broker.stop()


def test_wildcard_subscriptions_count_against_the_subscription_limit() -> None:
    broker = _broker(max_subscriptions_per_connection=2)
    try:
        peer = RawStomp(broker.port)
        peer.connect()
        peer.send(b"SUBSCRIBE\nid:1\ndestination:/topic/a.*\nreceipt:1\n\n\0")
        assert peer.frame().command == "RECEIPT"
        peer.send(b"SUBSCRIBE\nid:2\ndestination:/topic/b.>\nreceipt:2\n\n\0")
        assert peer.frame().command == "RECEIPT"
        peer.send(b"SUBSCRIBE\nid:3\ndestination:/topic/c.*\nreceipt:3\n\n\0")
        assert "limit max_subscriptions_per_connection=2 exceeded" in _error_message(peer)
    finally:
        broker.stop()


def test_the_journal_forgets_a_removed_destination_and_keeps_the_others(tmp_path: Path) -> None:
    store = {"kind": "journal", "data_dir": str(tmp_path)}
    broker = start_broker(store=store, limits={"destination_idle_timeout_s": 0.2})
    try:
        peer = RawStomp(broker.port)
        peer.connect()
        peer.send(b"SEND\ndestination:/queue/kept\npersistent:true\nreceipt:1\n\nsafe\0")
        assert peer.frame().command == "RECEIPT"
        # A queue that had a persistent message, consumed: empty, and so removed.
        peer.send(b"SEND\ndestination:/queue/gone\npersistent:true\nreceipt:2\n\nx\0")
        assert peer.frame().command == "RECEIPT"
        peer.send(b"SUBSCRIBE\nid:1\ndestination:/queue/gone\nack:client-individual\n\n\0")
        message = peer.frame()
        peer.send(b"ACK\nid:%b\nreceipt:3\n\n\0" % message.headers["ack"].encode())
        assert peer.frame().command == "RECEIPT"
        peer.send(b"UNSUBSCRIBE\nid:1\nreceipt:4\n\n\0")
        assert peer.frame().command == "RECEIPT"
        wait_until(
            lambda: (
                "/queue/gone" not in broker.call(lambda: set(broker.server.broker.destinations))
            ),
            what="/queue/gone removed",
        )
        peer.close()
    finally:
        broker.stop()
    again = start_broker(store=store)
    try:
        names = again.call(lambda: set(again.server.broker.destinations))
        assert "/queue/gone" not in names
        assert "/queue/kept" in names
        peer = RawStomp(again.port)
        peer.connect()
        peer.send(b"SUBSCRIBE\nid:1\ndestination:/queue/kept\n\n\0")
        assert peer.frame().body == b"safe"
    finally:
        again.stop()
