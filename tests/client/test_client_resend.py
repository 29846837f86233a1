"""`resend=True`: a SEND whose RECEIPT a lost connection did not bring goes out again on the next
connection, with the same `x-dedup-id`, and the caller sees it succeed."""

from __future__ import annotations

import asyncio

import pytest

from sluice.client import Client, ConnectionLost
from sluice.stomp.frames import Command


async def test_unreceipted_send_goes_again_with_the_same_dedup_id(fake_broker) -> None:
    async with fake_broker() as broker:
        broker.hold_destinations.add("/queue/hold")
        client = await Client.connect(broker.address, resend=True, initial_reconnect_delay_s=0.01)
        async with client:
            await client.send("/queue/a", "first")
            sending = asyncio.ensure_future(client.send("/queue/hold", "maybe"))
            await broker.wait_for(lambda: len(broker.frames(Command.SEND)) == 2)
            first = broker.last
            # The SEND stays without a RECEIPT on this connection; the next one answers it.
            broker.hold_destinations.clear()
            first.drop()
            await sending
            second = broker.last
            assert second is not first
            before = [f for f in broker.frames(Command.SEND, first) if f.body == b"maybe"]
            after = [f for f in broker.frames(Command.SEND, second) if f.body == b"maybe"]
            assert len(before) == len(after) == 1
            dedup_id = before[0].headers["x-dedup-id"]
            assert dedup_id == after[0].headers["x-dedup-id"]
            assert client.resent == 1
            # Every send has an id of its own.
            ids = {f.headers["x-dedup-id"] for f in broker.frames(Command.SEND)}
            assert len(ids) == 2


async def test_the_callers_dedup_id_is_kept(fake_broker) -> None:
    async with fake_broker() as broker:
        async with await Client.connect(broker.address, resend=True) as client:
            await client.send("/queue/a", "x", headers={"x-dedup-id": "order-17"})
            assert broker.frames(Command.SEND)[0].headers["x-dedup-id"] == "order-17"


async def test_resends_are_bounded(fake_broker) -> None:
    async with fake_broker() as broker:
        broker.hold_destinations.add("/queue/hold")
        client = await Client.connect(
            broker.address, resend=True, max_resends=1, initial_reconnect_delay_s=0.01
        )
        async with client:
            sending = asyncio.ensure_future(client.send("/queue/hold", "never"))
            await broker.wait_for(lambda: len(broker.frames(Command.SEND)) == 1)
            broker.last.drop()
            await broker.wait_for(lambda: len(broker.frames(Command.SEND)) == 2)
            broker.last.drop()
            with pytest.raises(ConnectionLost):
                await sending
            assert client.resent == 1


async def test_without_resend_no_dedup_id_is_added(fake_broker) -> None:
    async with fake_broker() as broker:
        async with await Client.connect(broker.address) as client:
            await client.send("/queue/a", "x")
            assert "x-dedup-id" not in broker.frames(Command.SEND)[0].headers
