"""Publish sensor readings to a topic: JSON events with an event time, a key and a value.

    python producer.py --broker HOST:PORT [--events N] [--keys K] [--topic /topic/pipeline.events]

Event times start at the current time and advance 10 ms per event, so a few thousand events span
several 10-second windows. The last event is a `_tick` 30 s later in event time: it carries the
job's watermark past every window, so a bounded run can close them all (the job counts ticks in no
window; see job.py for why it aggregates them rather than filtering them out first). Events
published again within those 30 s are behind the watermark, and the job drops them as late.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from typing import Any

from sluice.client import BlockingClient

STEP_MS = 10
TICK_AHEAD_MS = 30_000


def publish_events(
    broker: str, topic: str, events: int, *, keys: int = 5, seed: int = 7
) -> list[dict[str, Any]]:
    """Publish `events` events and the closing tick to `topic`; return the events (not the tick)."""
    rng = random.Random(seed)
    start_ms = int(time.time() * 1000)
    published = []
    with BlockingClient(broker) as client:
        for i in range(events):
            event = {
                "ts": start_ms + i * STEP_MS,
                "key": f"sensor-{rng.randrange(keys)}",
                "value": round(rng.gauss(20.0, 5.0), 2),
            }
            # Pipelined; the last send below waits for its receipt, so all are in when it returns.
            client.send(topic, json.dumps(event), persistent=True, receipt=False)
            published.append(event)
        tick = {"ts": start_ms + events * STEP_MS + TICK_AHEAD_MS, "key": "_tick", "value": 0.0}
        client.send(topic, json.dumps(tick), persistent=True)
    return published


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--broker", default="127.0.0.1:61613")
    parser.add_argument("--topic", default="/topic/pipeline.events")
    parser.add_argument("--events", type=int, default=5000)
    parser.add_argument("--keys", type=int, default=5)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    publish_events(args.broker, args.topic, args.events, keys=args.keys, seed=args.seed)
    print(f"published {args.events} events (+1 tick) to {args.topic}")


if __name__ == "__main__":
    main()
