"""Redelivery and dead letters: a message rejected too often, or expired, goes to DLQ.<name>."""

import asyncio
import time
import uuid

from _common import BROKER

from sluice.client import Client


async def main() -> None:
    name = f"jobs-{uuid.uuid4().hex[:8]}"
    async with await Client.connect(BROKER) as client:
        expired_at = int(time.time() * 1000) - 1
        await client.send(f"/queue/{name}", b"too late", headers={"expires": str(expired_at)})
        await client.send(f"/queue/{name}", b"poison")
        sub = await client.subscribe(f"/queue/{name}", ack="client-individual")
        # The default max_redeliveries is 6: the 7th NACK sends it to the dead-letter queue.
        for _ in range(7):
            message = await sub.get(timeout=5)
            await client.nack(message)
        dlq = await client.subscribe(f"/queue/DLQ.{name}")
        for _ in range(2):
            dead = await dlq.get(timeout=5)
            print(
                "dead letter",
                dead.body.decode(),
                "from",
                dead.headers["x-original-destination"],
                "because",
                dead.headers["x-dlq-reason"],
            )


asyncio.run(main())
