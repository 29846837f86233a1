"""CPU cost of the broker's hot path, in process: SEND frames parsed, queued, dispatched and
encoded as MESSAGE frames, with no sockets (a fake transport collects the bytes).

    .venv/bin/python benchmarks/broker_path.py --messages 200000 --size 1024
    .venv/bin/python benchmarks/broker_path.py --messages 20000 --persistent [--latency-hops]

SEND frames are fed in reads of at most 64 KiB, as a socket delivers them. Prints microseconds of
CPU per message (every thread of the process: the journal writer's too); use it to compare changes
to the hot path. `--persistent` sends `persistent:true` SENDs with a receipt to the journal store
(in a temporary directory, synced as configured by default), and waits for their receipts;
`--latency-hops` times their hops as `sluice broker --latency-hops` does, and prints the table.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
import tempfile
import time
from pathlib import Path
from typing import Any

from sluice import config as config_mod
from sluice.server.listener import BrokerServer
from sluice.server.session import StompSession
from sluice.server.stores import open_stores
from sluice.server.traced import TracedStompSession
from sluice.store.memory import MemoryStore

_READ_BYTES = 65536


class FakeTransport:
    """Collects written bytes; never pauses."""

    def __init__(self) -> None:
        self.written = 0
        self.closing = False

    def write(self, data: bytes) -> None:
        self.written += len(data)

    def writelines(self, data: list[bytes]) -> None:
        for chunk in data:
            self.written += len(chunk)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 1) if name == "peername" else default

    def set_write_buffer_limits(self, high: int, low: int) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0  # every write is taken at once

    def is_closing(self) -> bool:
        return self.closing

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def close(self) -> None:
        self.closing = True

    def abort(self) -> None:
        self.closing = True


def _acl(rules: int) -> list[dict[str, object]]:
    """`rules` ACL rules of which only the last matches the benchmark's queue: the cost of
    authorization (each decision is cached after the first)."""
    if rules <= 0:
        return []
    others = [{"destination": f"/queue/other{n}.>", "read": ["ops"]} for n in range(rules - 1)]
    everyone = ["*"]
    return [
        *others,
        {"destination": "/queue/>", "read": everyone, "write": everyone, "admin": everyone},
    ]


def _session(server: BrokerServer) -> StompSession:
    """A session as the listener makes it: traced with `--latency-hops`."""
    if server.latency is not None:
        return TracedStompSession(server.context, server.latency)
    return StompSession(server.context)


async def run(
    messages: int,
    size: int,
    profile: bool,
    acl_rules: int = 0,
    *,
    persistent: bool = False,
    latency_hops: bool = False,
) -> None:
    with tempfile.TemporaryDirectory(prefix="broker-path-") as data:
        await _run(messages, size, profile, acl_rules, persistent, latency_hops, Path(data))


async def _run(
    messages: int,
    size: int,
    profile: bool,
    acl_rules: int,
    persistent: bool,
    latency_hops: bool,
    data: Path,
) -> None:
    overrides: dict[str, object] = {"store": {"kind": "memory"}}
    if persistent:
        overrides["store"] = {"kind": "journal", "data_dir": str(data)}
        overrides["latency"] = {"hops": latency_hops}
    if acl_rules:
        overrides["acl"] = _acl(acl_rules)
    cfg = config_mod.load(env={}, overrides=overrides)
    if persistent:
        store, temp_store = open_stores(cfg)
        server = BrokerServer(cfg, store, temp_store=temp_store)
    else:
        server = BrokerServer(cfg, MemoryStore())
    server.broker.open()
    producer, consumer = _session(server), _session(server)
    out_p, out_c = FakeTransport(), FakeTransport()
    producer.connection_made(out_p)  # type: ignore[arg-type]
    consumer.connection_made(out_c)  # type: ignore[arg-type]
    connect = b"CONNECT\naccept-version:1.2\nhost:x\n\n\0"
    producer.data_received(connect)
    consumer.data_received(connect)
    consumer.data_received(
        b"SUBSCRIBE\nid:1\ndestination:/queue/bench\nack:client\nactivemq.prefetchSize:1000\n\n\0"
    )
    body = b"x" * size
    extra = b"persistent:true\nreceipt:r\n" if persistent else b""
    frame = b"SEND\ndestination:/queue/bench\n%bcontent-length:%d\n\n%b\0" % (extra, size, body)
    # Reads of at most 64 KiB, as from a socket: a larger frame arrives in pieces.
    per_chunk = max(1, _READ_BYTES // len(frame))
    chunk = frame * per_chunk
    reads = [chunk[i : i + _READ_BYTES] for i in range(0, len(chunk), _READ_BYTES)]
    sent = 0
    acked = 0
    profiler = cProfile.Profile() if profile else None
    started = time.process_time()
    if profiler:
        profiler.enable()
    queue = server.broker.destinations
    while sent < messages:
        for read in reads:
            producer.data_received(read)
        sent += per_chunk
        # Let dispatch and flushes run.
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        while persistent and producer.pending_receipts > per_chunk:
            # The journal writer's completions come back to this loop (not CPU of the loop).
            await asyncio.sleep(0.0002)
        sub = next(iter(consumer.core.subs.values())) if consumer.core else None
        if sub is not None and sub.inflight:
            last = next(reversed(sub.inflight))
            consumer.data_received(b"ACK\nid:%d\n\n\0" % last)
            acked = last
    while persistent and producer.pending_receipts:
        await asyncio.sleep(0.0002)
    await asyncio.sleep(0)
    elapsed = time.process_time() - started
    if profiler:
        profiler.disable()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(25)
    depth = queue["/queue/bench"].depth
    print(
        f"{sent} messages of {size} B: {elapsed * 1e6 / sent:.2f} us CPU per message "
        f"({sent / elapsed:,.0f} msg/s on one core), {out_c.written / 1e6:.1f} MB out, "
        f"left queued {depth}, last ack tag {acked}"
    )
    if server.latency is not None:
        print("\n".join(server.latency.table()))
    server.broker.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument(
        "--acl-rules",
        type=int,
        default=0,
        help="check every frame against this many ACL rules (the last one matches)",
    )
    parser.add_argument(
        "--persistent",
        action="store_true",
        help="persistent SENDs with a receipt, on the journal store in a temporary directory",
    )
    parser.add_argument(
        "--latency-hops", action="store_true", help="with --persistent: time their hops"
    )
    args = parser.parse_args()
    if args.latency_hops and not args.persistent:
        parser.error("--latency-hops times persistent sends: add --persistent")
    main_coro = run(
        args.messages,
        args.size,
        args.profile,
        args.acl_rules,
        persistent=args.persistent,
        latency_hops=args.latency_hops,
    )
    try:
        import uvloop  # noqa: PLC0415

        uvloop.run(main_coro)
    except ImportError:
        asyncio.run(main_coro)


if __name__ == "__main__":
    main()
