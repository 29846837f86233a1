"""The CONNECT path by the letter of the specification: CONNECTED always says `version` (1.0
too), the ERROR for no common version lists ours, an ACK naming the wrong subscription says so,
and `session` ids are random."""

from __future__ import annotations

import asyncio
import queue
import re
from typing import Any

import stomp

from conftest import RunningBroker
from rawstomp import RawStomp
from sluice.client import Client


def test_connected_says_version_10_when_negotiated_down(broker: RunningBroker) -> None:
    raw = RawStomp(broker.port)
    raw.send(b"CONNECT\nhost:localhost\n\n\0")  # no accept-version: 1.0
    frame = raw.frame()
    assert frame.command == "CONNECTED"
    assert frame.headers["version"] == "1.0"
    assert "heart-beat" not in frame.headers


def test_stomppy_10_and_our_client_read_the_10_connected(broker: RunningBroker) -> None:
    connected: queue.Queue[Any] = queue.Queue()

    class Listener(stomp.ConnectionListener):  # type: ignore[misc]
        def on_connected(self, frame: Any) -> None:
            connected.put(frame)

    conn = stomp.Connection10([("127.0.0.1", broker.port)])
    conn.set_listener("l", Listener())
    conn.connect(wait=True)
    assert connected.get(timeout=10).headers["version"] == "1.0"
    conn.disconnect()

    async def main() -> None:
        async with await Client.connect(broker.address, version="1.0") as client:
            assert client.version is not None
            assert client.version.value == "1.0"

    asyncio.run(asyncio.wait_for(main(), 30))


def test_no_common_version_error_lists_the_supported_ones(broker: RunningBroker) -> None:
    raw = RawStomp(broker.port)
    raw.send(b"CONNECT\naccept-version:2.0,3.1\nhost:localhost\nreceipt:c\n\n\0")
    frame = raw.frame()
    assert frame.command == "ERROR"
    assert frame.headers["version"] == "1.0,1.1,1.2"
    assert frame.headers["receipt-id"] == "c"
    assert "no common STOMP version" in frame.headers["message"]
    assert raw.closed()


def test_session_ids_are_random_not_addresses(broker: RunningBroker) -> None:
    ids = {RawStomp(broker.port).connect().headers["session"] for _ in range(5)}
    assert len(ids) == 5
    for session in ids:
        assert re.fullmatch(r"sluice-[0-9a-f]{32}", session), session


def test_an_ack_naming_another_subscription_says_so_11(broker: RunningBroker) -> None:
    raw = RawStomp(broker.port)
    raw.connect(version="1.1")
    raw.send(b"SUBSCRIBE\nid:s1\ndestination:/queue/acks11\nack:client\n\n\0")
    raw.send(b"SEND\ndestination:/queue/acks11\n\nm\0")
    message = raw.frame()
    assert message.command == "MESSAGE"
    mid = message.headers["message-id"]
    raw.send(f"ACK\nsubscription:s2\nmessage-id:{mid}\n\n\0".encode())
    error = raw.frame()
    assert error.command == "ERROR"
    assert "no subscription with id 's2'" in error.headers["message"]


def test_an_ack_naming_another_subscription_says_so_12(broker: RunningBroker) -> None:
    raw = RawStomp(broker.port)
    raw.connect()
    raw.send(b"SUBSCRIBE\nid:s1\ndestination:/queue/acks12\nack:client\n\n\0")
    raw.send(b"SEND\ndestination:/queue/acks12\n\nm\0")
    message = raw.frame()
    raw.send(f"ACK\nid:{message.headers['ack']}\nsubscription:other\n\n\0".encode())
    error = raw.frame()
    assert error.command == "ERROR"
    assert "names subscription 'other'" in error.headers["message"]
    assert "subscription 's1'" in error.headers["message"]
