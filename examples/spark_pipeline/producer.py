"""Publish sensor readings to a topic: JSON events with an event time, a key and a value.

    python producer.py --broker HOST:PORT [--events N] [--keys K] [--topic /topic/pipeline.events]

Event times start at the current time and advance 10 ms per event, so a few thousand events span
several 10-second windows. The last event is a `_tick` 30 s later in event time: it carries the
job's watermark past every window, so a bounded run can close them all (the job does not count
ticks).
"""

from __future__ import annotations

import argparse
import json
import random
import time

from sluice.client import BlockingClient

STEP_MS = 10


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--broker", default="127.0.0.1:61613")
    parser.add_argument("--topic", default="/topic/pipeline.events")
    parser.add_argument("--events", type=int, default=5000)
    parser.add_argument("--keys", type=int, default=5)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()

    rng = random.Random(args.seed)
    start_ms = int(time.time() * 1000)
    with BlockingClient(args.broker) as client:
        for i in range(args.events):
            event = {
                "ts": start_ms + i * STEP_MS,
                "key": f"sensor-{rng.randrange(args.keys)}",
                "value": round(rng.gauss(20.0, 5.0), 2),
            }
            # Pipelined; the last send below waits for its receipt, so all are in when it returns.
            client.send(args.topic, json.dumps(event), persistent=True, receipt=False)
        tick = {"ts": start_ms + args.events * STEP_MS + 30_000, "key": "_tick", "value": 0.0}
        client.send(args.topic, json.dumps(tick), persistent=True)
    print(f"published {args.events} events (+1 tick) to {args.topic}")


if __name__ == "__main__":
    main()
