"""Wildcard topic subscriptions (`.` separates words, `*` one word, `>` the rest) and JMS
selectors on headers."""

import asyncio
import uuid

from _common import BROKER

from sluice.client import Client


async def main() -> None:
    root = f"PRICE{uuid.uuid4().hex[:6]}"
    async with await Client.connect(BROKER) as client:
        every_stock = await client.subscribe(f"/topic/{root}.STOCK.>")
        nyse_big = await client.subscribe(
            f"/topic/{root}.STOCK.*", selector="exchange = 'NYSE' AND price > 100"
        )
        await client.send(
            f"/topic/{root}.STOCK.ACME", "ACME 12", headers={"exchange": "NYSE", "price": "12"}
        )
        await client.send(
            f"/topic/{root}.STOCK.IBM", "IBM 140", headers={"exchange": "NYSE", "price": "140"}
        )
        await client.send(f"/topic/{root}.BOND.US10Y", "US10Y 4.1", headers={"price": "101"})
        print("wildcard got", sorted([(await every_stock.get(timeout=5)).text for _ in range(2)]))
        print("selector got", (await nyse_big.get(timeout=5)).text)
        if await every_stock.get(timeout=0.5) is None and await nyse_big.get(timeout=0.1) is None:
            print("nothing else matched")


asyncio.run(main())
