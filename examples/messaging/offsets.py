"""Topics are logs: every message has an offset (x-offset), and a subscriber may start anywhere
in what the topic keeps. Run the broker with examples/messaging/broker.toml, which keeps an hour
of /topic/replay.> messages."""

import asyncio
import uuid

from _common import BROKER

from sluice.client import Client


async def main() -> None:
    topic = f"/topic/replay.events-{uuid.uuid4().hex[:8]}"
    async with await Client.connect(BROKER) as client:
        for n in range(5):
            await client.send(topic, f"event {n}")
        everything = await client.subscribe(topic, headers={"x-offset": "earliest"})
        events = [await everything.get(timeout=5) for _ in range(5)]
        print("offsets", [m.offset for m in events])
        third = events[2].offset
        assert third is not None
        tail = await client.subscribe(topic, headers={"x-offset": str(third)})
        print("from offset", third, [(await tail.get(timeout=5)).text for _ in range(3)])


asyncio.run(main())
