"""Duplicate detection: a SEND with an x-dedup-id already seen on the destination is receipted
and dropped, so a producer may retry after a lost receipt without creating a duplicate."""

import asyncio
import uuid

from _common import BROKER

from sluice.client import Client


async def main() -> None:
    queue = f"/queue/payments-{uuid.uuid4().hex[:8]}"
    async with await Client.connect(BROKER) as client:
        for attempt in range(3):  # a producer retrying the same payment
            await client.send(
                queue, f"pay 10 EUR (attempt {attempt})", headers={"x-dedup-id": "payment-7781"}
            )
        sub = await client.subscribe(queue)
        print("delivered", (await sub.get(timeout=5)).body.decode())
        if await sub.get(timeout=0.5) is None:  # None: nothing came within the timeout
            print("no duplicate")


asyncio.run(main())
