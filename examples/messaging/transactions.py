"""Transactions: sends and acks become final together at COMMIT, or not at all."""

import asyncio
import uuid

from _common import BROKER

from sluice.client import Client


async def main() -> None:
    queue = f"/queue/ledger-{uuid.uuid4().hex[:8]}"
    async with await Client.connect(BROKER) as client:
        sub = await client.subscribe(queue, ack="client-individual")

        tx = await client.begin()
        await client.send(queue, b"refund", transaction=tx)
        await client.abort(tx)  # never delivered

        async with client.transaction() as tx:  # commits when the block ends without error
            await client.send(queue, b"debit", transaction=tx)
            await client.send(queue, b"credit", transaction=tx)

        for _ in range(2):
            message = await sub.get(timeout=5)
            print("committed", message.body.decode())
            await client.ack(message)
        if await sub.get(timeout=0.5) is None:
            print("nothing from the aborted transaction")

        # An ACK inside a transaction counts only once the transaction commits.
        await client.send(queue, b"invoice")
        message = await sub.get(timeout=5)
        tx = await client.begin()
        await client.ack(message, transaction=tx)
        await client.abort(tx)  # the ACK is undone: the message comes back
        message = await sub.get(timeout=5)
        print("after ABORT", message.body.decode(), "redelivered", message.redelivered)
        async with client.transaction() as tx:
            await client.ack(message, transaction=tx)
        if await sub.get(timeout=0.5) is None:
            print("after COMMIT the ACK holds")


asyncio.run(main())
