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
        await client.send(queue, b"debit", transaction=tx)
        await client.send(queue, b"credit", transaction=tx)
        await client.abort(tx)  # neither is ever delivered

        async with client.transaction() as tx:  # commits when the block ends without error
            await client.send(queue, b"debit", transaction=tx)
            await client.send(queue, b"credit", transaction=tx)

        for _ in range(2):
            message = await sub.get(timeout=5)
            print("committed", message.body.decode())
            await client.ack(message)


asyncio.run(main())
