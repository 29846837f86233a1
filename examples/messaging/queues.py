"""Queues: persistent sends, acknowledgements, NACK and redelivery."""

import asyncio
import uuid

from _common import BROKER

from sluice.client import Client


async def main() -> None:
    queue = f"/queue/orders-{uuid.uuid4().hex[:8]}"
    async with await Client.connect(BROKER) as client:
        # persistent=True: the broker has it on disk before send() returns.
        await client.send(queue, b"order-1", persistent=True, headers={"customer": "42"})
        await client.send(queue, b"order-2", persistent=True)

        sub = await client.subscribe(queue, ack="client-individual", prefetch=10)
        first = await sub.get(timeout=5)
        print("got", first.body.decode(), "customer", first.headers["customer"])
        await client.ack(first)

        second = await sub.get(timeout=5)
        await client.nack(second)  # give it back: it is redelivered, marked as such
        again = await sub.get(timeout=5)
        print("redelivered", again.body.decode(), again.redelivered, again.delivery_count)
        await client.ack(again)


asyncio.run(main())
