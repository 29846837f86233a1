"""Exclusive consumers and message groups.

An exclusive consumer gets every message of the queue; when it leaves, the next one takes over.
Messages with the same JMSXGroupID go to one consumer, in order, until the group closes
(JMSXGroupSeq -1) or its consumer leaves. A consumer with `x-max-open-groups` holds at most that
many open groups: a new group waits until one of its groups closes.
"""

import asyncio
import uuid

from _common import BROKER

from sluice.client import Client


async def main() -> None:
    queue = f"/queue/accounts-{uuid.uuid4().hex[:8]}"
    async with (
        await Client.connect(BROKER) as producer,
        await Client.connect(BROKER) as a,
        await Client.connect(BROKER) as b,
    ):
        sub_a = await a.subscribe(queue, ack="client-individual")
        sub_b = await b.subscribe(queue, ack="client-individual")
        # In this order, plain round robin would give each consumer some of both accounts.
        order = ["alice-0", "alice-1", "bob-0", "bob-1", "alice-2", "bob-2"]
        for body in order:
            await producer.send(queue, body, headers={"JMSXGroupID": body.split("-")[0]})
        for name, sub, client in (("a", sub_a, a), ("b", sub_b, b)):
            got = []
            for _ in range(3):
                message = await sub.get(timeout=5)
                got.append(message.body.decode())
                await client.ack(message)
            print(f"consumer {name} got", " ".join(got))

        exclusive_queue = queue + ".exclusive"
        headers = {"activemq.exclusive": "true"}
        sub_a = await a.subscribe(exclusive_queue, ack="client-individual", headers=headers)
        sub_b = await b.subscribe(exclusive_queue, ack="client-individual", headers=headers)
        await producer.send(exclusive_queue, "one")
        message = await sub_a.get(timeout=5)
        print("exclusive consumer a got", message.body.decode())
        await sub_a.unsubscribe()  # b takes over; the unacknowledged message comes back
        message = await sub_b.get(timeout=5)
        print("b took over and got", message.body.decode(), "redelivered", message.redelivered)
        await b.ack(message)

        # One open group per consumer: X goes to a, Y to b, and Z waits until X closes.
        one_at_a_time = queue + ".one-group"
        headers = {"x-max-open-groups": "1"}
        sub_a = await a.subscribe(one_at_a_time, ack="client-individual", headers=headers)
        sub_b = await b.subscribe(one_at_a_time, ack="client-individual", headers=headers)
        for body in ("X-0", "Y-0", "Z-0", "X-1"):
            group_headers = {"JMSXGroupID": body[0]}
            if body == "X-1":
                group_headers["JMSXGroupSeq"] = "-1"  # the last of X: closes the group
            await producer.send(one_at_a_time, body, headers=group_headers)
        for name, sub, client, count in (("a", sub_a, a, 3), ("b", sub_b, b, 1)):
            got = []
            for _ in range(count):
                message = await sub.get(timeout=5)
                got.append(message.body.decode())
                await client.ack(message)  # acknowledging X-1 closes X: Z goes to a
            print(f"one group at a time: {name} got", " ".join(got))


asyncio.run(main())
