"""`max_pending_receipts_per_connection` holds for every receipt, whatever it waits on: a
persistent SEND's write, a receipted ACK's removal, a COMMIT, or the receipts queued behind them.
At the bound the broker stops reading the connection (as producer flow control would) and reads
it again once half the receipts are out; nothing is refused and every receipt comes, in order."""

from __future__ import annotations

import pytest

from conftest import RunningBroker, start_broker
from held_store import HeldStore
from rawstomp import RawStomp
from sluice.server.flow import ReadPause
from waiting import wait_until

from .conftest import sessions

LIMIT = 4
PAIRS = 10


def _hold(broker: RunningBroker, store: HeldStore) -> None:
    def hold() -> None:
        store.holding = True

    broker.call(hold)


def _head_waiting_on_the_store(
    kind: str, c: RawStomp, broker: RunningBroker, store: HeldStore
) -> None:
    """Send one frame whose receipt `head` waits for a store write that is held."""
    if kind == "send":
        _hold(broker, store)
        c.send(b"SEND\ndestination:/queue/r\npersistent:true\nreceipt:head\n\nx\0")
    elif kind == "ack":
        c.send(b"SEND\ndestination:/queue/r\npersistent:true\nreceipt:stored\n\nx\0")
        assert c.frame().headers["receipt-id"] == "stored"
        c.send(b"SUBSCRIBE\nid:1\ndestination:/queue/r\nack:client-individual\n\n\0")
        message = c.frame()
        assert message.command == "MESSAGE"
        _hold(broker, store)
        c.send(b"ACK\nid:%b\nreceipt:head\n\n\0" % message.headers["ack"].encode())
    else:
        _hold(broker, store)
        c.send(
            b"BEGIN\ntransaction:tx\n\n\0"
            b"SEND\ndestination:/queue/r\npersistent:true\ntransaction:tx\n\nx\0"
            b"COMMIT\ntransaction:tx\nreceipt:head\n\n\0"
        )


@pytest.mark.parametrize("kind", ["send", "ack", "commit"])
def test_receipts_behind_a_pending_write_pause_reading_at_the_bound(kind: str) -> None:
    store = HeldStore()
    broker = start_broker(
        message_store=store, limits={"max_pending_receipts_per_connection": LIMIT}
    )
    try:
        c = RawStomp(broker.port)
        c.connect()
        _head_waiting_on_the_store(kind, c, broker, store)
        followers = [f"{frame}-{i}" for i in range(PAIRS) for frame in ("b", "a")]
        c.send(
            b"".join(
                b"BEGIN\ntransaction:t\nreceipt:b-%d\n\n\0ABORT\ntransaction:t\nreceipt:a-%d\n\n\0"
                % (i, i)
                for i in range(PAIRS)
            )
        )
        wait_until(
            lambda: broker.stats().get("flow_paused_receipts") == 1,
            timeout=10,
            what="reading paused on receipts",
        )
        (view,) = sessions(broker)
        assert view.pending_receipts == LIMIT
        assert ReadPause.RECEIPTS in view.reasons

        broker.call(store.release)
        received = [c.frame().headers["receipt-id"] for _ in range(1 + len(followers))]
        assert received == ["head", *followers]
        (view,) = sessions(broker)
        assert view.pending_receipts == 0
        assert view.reasons == frozenset()
    finally:
        broker.stop()
