"""Durable topic subscriptions: a cursor that keeps what was published while its consumer was
away. It needs a client-id on CONNECT and a name on SUBSCRIBE (ActiveMQ's headers)."""

import asyncio
import uuid

from _common import BROKER

from sluice.client import Client


async def main() -> None:
    topic = f"/topic/prices-{uuid.uuid4().hex[:8]}"
    client_id = f"audit-{uuid.uuid4().hex[:8]}"
    durable = {"activemq.subscriptionName": "audit-trail"}

    async with await Client.connect(BROKER, client_id=client_id) as auditor:
        await auditor.subscribe(topic, headers=durable)  # creates it, then goes away

    async with await Client.connect(BROKER) as producer:
        for price in ("101.5", "101.7"):
            await producer.send(topic, price)

    async with await Client.connect(BROKER, client_id=client_id) as auditor:
        sub = await auditor.subscribe(topic, headers=durable)
        print("missed while away:", [(await sub.get(timeout=5)).text for _ in range(2)])
        await sub.unsubscribe(headers=durable)  # with the name: deletes the durable

    async with await Client.connect(BROKER) as producer:
        await producer.send(topic, "101.9")  # kept for nobody: the subscription is gone

    async with await Client.connect(BROKER, client_id=client_id) as auditor:
        sub = await auditor.subscribe(topic, headers=durable)  # a new one, from now on
        message = await sub.get(timeout=0.5)
        print("after deleting it:", [] if message is None else [message.text])


asyncio.run(main())
