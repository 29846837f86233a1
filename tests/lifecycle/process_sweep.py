"""Messages on the wire: what the simulation sends (`body_for`, `headers_for`) and reading what
the broker delivers against the model, one frame (`take`) or every destination at once (`sweep`).

A sweep subscribes to every queue, every dead-letter queue and every durable subscription that
exists on one connection, then publishes a sentinel to each (to a topic once: every durable
subscription of it gets the copy) and reads until every subscription has seen its sentinel. FIFO
puts everything that was there before the sentinel in front of it, so the sweep knows it has
seen it all without waiting for silence. Without `ack` it leaves everything in place (the
messages come back redelivered); with `ack` it drains.
"""

from __future__ import annotations

import time
from typing import Any

from lifecycle.process_io import SimClient
from lifecycle.process_model import (
    QUEUES,
    TOPICS,
    Expiry,
    Model,
    SimFailure,
    SimMessage,
    Sweep,
    dlq_of,
)

SIM_ID = "x-sim-id"
SENTINEL = "x-sim-sentinel"
STREAM_ABORT = "x-stream-abort"
SWEEP_PREFETCH = 100_000
# A healthy broker hands a sentinel over in milliseconds; this leaves room for a slow machine.
SENTINEL_TIMEOUT_S = 10.0
# A short expiry: the message may or may not be consumed before it expires.
SHORT_EXPIRY_MS = 800

# (kind, name) of a sweep's subscription: queue, dlq, durable, or deleted (a durable
# subscription deleted earlier, subscribed again to check it starts empty).
_Sub = tuple[str, str]


def body_for(msg_id: int, size: int) -> str:
    """The body of message `msg_id`: checked byte for byte on every delivery."""
    head = f"{msg_id}:"
    return head + chr(ord("a") + msg_id % 26) * max(0, size - len(head))


def headers_for(msg: SimMessage, **extra: str) -> dict[str, str]:
    """The SEND headers of a message: its id, persistence, expiry and dedup id."""
    headers = {SIM_ID: str(msg.msg_id), "persistent": str(msg.persistent).lower(), **extra}
    now_ms = int(time.time() * 1000)
    if msg.expiry is Expiry.SHORT:
        headers["expires"] = str(now_ms + SHORT_EXPIRY_MS)
    elif msg.expiry is Expiry.PAST:
        headers["expires"] = str(now_ms - 60_000)
    if msg.dedup is not None:
        headers["x-dedup-id"] = msg.dedup
    return headers


def take(
    model: Model,
    client: SimClient,
    frame: Any,
    kind: str,
    name: str,
    *,
    ack_markers: bool = True,
) -> SimMessage | None:
    """Check one delivered frame against the model (`kind` queue, durable or dlq). Sentinels
    and stream abort markers are acknowledged (if `ack_markers`) and give None."""
    h = frame.headers
    if SENTINEL in h or STREAM_ABORT in h:
        if ack_markers:
            client.frame("ACK", id=h["ack"])
        return None
    raw = h.get(SIM_ID)
    if raw is None:
        raise SimFailure("unknown-message", f"{name} delivered a message without {SIM_ID}: {h}")
    redelivered = h.get("redelivered") == "true"
    if kind == "queue":
        msg = model.observe_queue(name, int(raw), redelivered)
    elif kind == "durable":
        msg = model.observe_durable(name, int(raw), redelivered)
    else:
        msg = model.observe_dlq(name, int(raw), h.get("x-original-destination"))
    expected = body_for(msg.msg_id, msg.size)
    if frame.body != expected:
        got = frame.body if isinstance(frame.body, str) else repr(frame.body)
        raise SimFailure(
            "corrupt-body",
            f"{name} message {msg.msg_id}: {len(got)} chars, expected {len(expected)}; "
            f"starts {got[:40]!r}",
        )
    return msg


def sweep(
    model: Model,
    port: int,
    token: str,
    *,
    ack: bool,
    final: bool = False,
    check_deleted: bool = False,
) -> None:
    """Read every destination up to a sentinel named `token` and check the model (see the
    module docstring); `check_deleted` also checks deleted durable subscriptions are empty."""
    result = Sweep()
    subs: dict[str, _Sub] = {}
    client = SimClient(port, client_id="sim")
    try:
        for queue in QUEUES:
            subs[queue] = ("queue", queue)
            result.queues[queue] = []
        for dlq in sorted({dlq_of(d) for d in QUEUES + TOPICS}):
            subs[dlq] = ("dlq", dlq)
            result.dlqs[dlq] = []
        for sub_id, (_kind, name) in subs.items():
            client.subscribe(name, sub_id, prefetch=SWEEP_PREFETCH)
        topics = set()
        for name, durable in model.durables.items():
            if durable.exists:
                kind = "durable"
                result.durables[name] = []
            elif check_deleted and durable.deleted:
                kind = "deleted"
                result.deleted_durables[name] = []
            else:
                continue
            subs[f"durable-{name}"] = (kind, name)
            topics.add(durable.topic)
            client.subscribe(
                durable.topic,
                f"durable-{name}",
                prefetch=SWEEP_PREFETCH,
                **{"activemq.subscriptionName": name},
            )
        destinations = [name for kind, name in subs.values() if kind in ("queue", "dlq")]
        sentinels = [
            client.send(dest, token, {SENTINEL: token, "persistent": "true"})
            for dest in destinations + sorted(topics)
        ]
        client.wait_receipts(sentinels, "sentinel SEND")
        delivered = _read_to_sentinels(model, client, subs, token, result, ack=ack)
        for sub_id, (kind, name) in subs.items():
            extra = {"activemq.subscriptionName": name} if kind == "deleted" else {}
            client.call("UNSUBSCRIBE", id=sub_id, **extra)
        for frame in client.take_buffered():
            kind, name = subs[frame.headers["subscription"]]
            if kind != "deleted":
                msg = take(model, client, frame, kind, name, ack_markers=False)
                if msg is not None:
                    delivered.append((kind, name, msg))
        # What was read and not acknowledged went back at UNSUBSCRIBE.
        for kind, name, msg in delivered:
            if kind == "queue":
                model.requeued(msg)
            elif kind == "durable":
                model.durable_requeued(name, msg.msg_id, 1)
    finally:
        client.close()
    model.check_sweep(result, final=final)


def _read_to_sentinels(
    model: Model,
    client: SimClient,
    subs: dict[str, _Sub],
    token: str,
    result: Sweep,
    *,
    ack: bool,
) -> list[tuple[str, str, SimMessage]]:
    """Read until every subscription has its sentinel; returns what was read and not
    acknowledged."""
    waiting = set(subs)
    kept: list[tuple[str, str, SimMessage]] = []
    acks: list[tuple[str, str, str, SimMessage]] = []
    while waiting:
        try:
            frame = client.message(SENTINEL_TIMEOUT_S)
        except SimFailure:
            got = {k: len(v) for k, v in {**result.queues, **result.durables}.items()}
            raise SimFailure(
                "not-delivered",
                f"a sentinel published after subscribing did not reach {sorted(waiting)} "
                f"within {SENTINEL_TIMEOUT_S:.0f} s; delivered so far {got}",
            ) from None
        h = frame.headers
        sub_id = h["subscription"]
        kind, name = subs[sub_id]
        if h.get(SENTINEL) == token:
            waiting.discard(sub_id)
        if kind == "deleted":
            if SENTINEL not in h and STREAM_ABORT not in h:
                result.deleted_durables[name].append(int(h.get(SIM_ID, "-1")))
            client.frame("ACK", id=h["ack"])
            continue
        msg = take(model, client, frame, kind, name)
        if msg is None:
            continue
        redelivered = h.get("redelivered") == "true"
        if kind == "queue":
            result.queues[name].append((msg.msg_id, redelivered))
        elif kind == "durable":
            result.durables[name].append((msg.msg_id, redelivered))
        else:
            result.dlqs[name].append(msg.msg_id)
        if ack:
            acks.append((client.frame("ACK", id=h["ack"]), kind, name, msg))
        else:
            kept.append((kind, name, msg))
    client.wait_receipts([a[0] for a in acks], "ACK")
    for _, kind, name, msg in acks:
        if kind == "queue":
            model.acked(msg)
        elif kind == "durable":
            model.durable_acked(name, msg.msg_id)
        else:
            model.dlq_acked(msg)
    return kept
