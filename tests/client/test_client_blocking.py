"""The blocking client, driven from a worker thread against the fake broker on the test's loop."""

from __future__ import annotations

import asyncio
import threading

import pytest

from sluice.client import BlockingClient, ClientError, Message
from sluice.stomp.frames import Command


def _round_trip(address: str) -> dict[str, object]:
    results: dict[str, object] = {}
    callback_threads: list[str] = []
    called = threading.Event()

    def on_message(message: Message) -> None:
        callback_threads.append(threading.current_thread().name)
        called.set()

    with BlockingClient(address, heartbeat_ms=(0, 0)) as client:
        sub = client.subscribe("/queue/b", ack="client-individual")
        client.send("/queue/b", "hello", headers={"k": "v"})
        message = sub.receive(timeout=5)
        assert message is not None
        results["text"] = message.text
        results["header"] = message.headers["k"]
        client.ack(message, receipt=True)
        results["empty"] = sub.receive(timeout=0.01)

        with client.transaction() as tx:
            client.send("/queue/b", "in tx", transaction=tx)
        results["after commit"] = sub.receive(timeout=5)
        try:
            with client.transaction() as tx:
                client.send("/queue/b", "dropped", transaction=tx)
                raise ValueError("no")
        except ValueError as exc:
            results["raised"] = str(exc)

        client.subscribe("/queue/cb", callback=on_message)
        client.send("/queue/cb", "to the callback")
        results["called"] = called.wait(5)
        results["callback threads"] = callback_threads

        sub.unsubscribe()
        results["iterated"] = [m.text for m in sub]
    with pytest.raises(ClientError):
        client.send("/queue/b", "closed")
    client.close()
    return results


async def test_blocking_round_trip(fake_broker) -> None:
    async with fake_broker() as broker:
        results = await asyncio.to_thread(_round_trip, broker.address)
        assert results["text"] == "hello"
        assert results["header"] == "v"
        assert results["empty"] is None
        after_commit = results["after commit"]
        assert isinstance(after_commit, Message)
        assert after_commit.text == "in tx"
        assert results["raised"] == "no"
        assert results["called"] is True
        assert results["callback threads"] == ["sluice-client-loop"]
        assert results["iterated"] == []
        assert len(broker.frames(Command.ACK)) == 1
        assert len(broker.frames(Command.ABORT)) == 1
        assert [f.body for f in broker.routed].count(b"dropped") == 0
        assert len(broker.frames(Command.DISCONNECT)) == 1
        loop_threads = [t for t in threading.enumerate() if t.name == "sluice-client-loop"]
        assert loop_threads == []


def test_blocking_connect_failure_stops_the_thread(refused_address) -> None:
    client = BlockingClient(refused_address, connect_timeout_s=2)
    with pytest.raises(ClientError, match="not connected"):
        client.send("/queue/a", "x")
    with pytest.raises(ClientError, match="no broker reachable"):
        client.connect()
    assert [t for t in threading.enumerate() if t.name == "sluice-client-loop"] == []
    client.close()  # nothing to close: a no-op
