"""Priorities 0-9: higher first, first in first out within a priority."""

import asyncio
import uuid

from _common import BROKER

from sluice.client import Client


async def main() -> None:
    queue = f"/queue/tickets-{uuid.uuid4().hex[:8]}"
    async with await Client.connect(BROKER) as client:
        for body, priority in [("routine", 1), ("outage", 9), ("question", 4), ("fire", 9)]:
            await client.send(queue, body, headers={"priority": str(priority)})
        sub = await client.subscribe(queue)
        order = [(await sub.get(timeout=5)).body.decode() for _ in range(4)]
        print("order", " ".join(order))


asyncio.run(main())
