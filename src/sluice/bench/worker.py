"""The worker process: runs a share of the producers and consumers on its own event loop.

The coordinating process (`runner`) starts workers with multiprocessing's `spawn` context and talks
to each over a pipe (`channel`) in JSON, one object per message; nothing received from the broker
is ever unpickled. Commands go down (`warmup`, `start`, `mark`, `stop`), events come up:

- `ready`: every link is connected and every subscription confirmed by a receipt;
- `progress`: distinct messages received so far by this worker's consumers, the producers whose
  end marker any of them received, and the fewest markers one of them received (every 100 ms,
  when something changed);
- `warmed`, `sent`, `marked`: this worker's producers finished a phase (the warm-up, the measured
  messages, the end markers) and hold no unanswered receipt;
- `error`: something failed (the worker still answers `stop`);
- `result`: everything measured, sent once after `stop`, then the worker exits.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
from collections.abc import Awaitable, Callable
from multiprocessing.connection import Connection
from typing import Any

from sluice.bench.channel import Channel
from sluice.bench.check import run_queue_check
from sluice.bench.connections_worker import ConnectionsWorker
from sluice.bench.limits import raise_open_files_limit
from sluice.bench.roles import BenchConsumer, BenchProducer, ConsumerSpec, ProducerSpec
from sluice.bench.stomplink import BrokerTarget, LinkError, StompLink, open_link

__all__ = ["run_worker", "worker_main"]

log = logging.getLogger(__name__)

_ACK_FLUSH_INTERVAL_S = 0.02
_PROGRESS_EVERY_TICKS = 5
_DISCONNECT_TIMEOUT_S = 5.0


class _ClientsWorker:
    """Producers and consumers of the throughput, sync and latency scenarios."""

    def __init__(self, channel: Channel, spec: dict[str, Any]) -> None:
        self.channel = channel
        self.address = BrokerTarget.from_spec(spec)
        self.connect_timeout_s = float(spec.get("connect_timeout_s", 10.0))
        self.producer_specs = [ProducerSpec(**p) for p in spec.get("producers", [])]
        self.consumer_specs = [ConsumerSpec(**c) for c in spec.get("consumers", [])]
        self.producers: list[BenchProducer] = []
        self.consumers: list[BenchConsumer] = []
        self.errors: list[str] = []
        self._phase: asyncio.Task[None] | None = None
        self._reported: set[int] = set()

    def _error(self, reason: str) -> None:
        self.errors.append(reason)
        self.channel.send({"event": "error", "reason": reason})

    async def _open(self) -> None:
        async def consumer(spec: ConsumerSpec) -> BenchConsumer:
            link = await open_link(
                self.address, f"consumer {spec.consumer_id}", self.connect_timeout_s
            )
            consumer = BenchConsumer(spec, link)
            self.consumers.append(consumer)
            await consumer.subscribe(self.connect_timeout_s)
            return consumer

        async def producer(spec: ProducerSpec) -> BenchProducer:
            link = await open_link(
                self.address, f"producer {spec.producer_id}", self.connect_timeout_s
            )
            producer = BenchProducer(spec, link)
            self.producers.append(producer)
            return producer

        jobs: list[Awaitable[Any]] = [consumer(s) for s in self.consumer_specs]
        jobs += [producer(s) for s in self.producer_specs]
        await asyncio.gather(*jobs)

    async def _produce(self, warmup: bool, done_event: str) -> None:
        def span(p: BenchProducer) -> tuple[int, int]:
            w = p.spec.warmup
            return (0, w) if warmup else (w, w + p.spec.count)

        try:
            await asyncio.gather(*(p.run(*span(p), measured=not warmup) for p in self.producers))
        except LinkError as exc:
            self._error(str(exc))
            return
        self.channel.send({"event": done_event})

    async def _mark(self) -> None:
        try:
            await asyncio.gather(*(p.mark() for p in self.producers))
        except LinkError as exc:
            self._error(str(exc))
            return
        self.channel.send({"event": "marked"})

    def _progress(self) -> dict[str, Any]:
        consumers = self.consumers
        markers: set[int] = set()
        for consumer in consumers:
            markers |= consumer.markers
        return {
            "event": "progress",
            "unique": sum(c.unique for c in consumers),
            "markers": sorted(markers),
            "markers_min": min((len(c.markers) for c in consumers), default=0),
        }

    async def _tick(self) -> None:
        ticks = 0
        reported: dict[str, Any] = {}
        while True:
            await asyncio.sleep(_ACK_FLUSH_INTERVAL_S)
            for consumer in self.consumers:
                consumer.flush_acks()
            ticks += 1
            if ticks % _PROGRESS_EVERY_TICKS == 0:
                progress = self._progress()
                if progress != reported:
                    reported = progress
                    self.channel.send(progress)
                for consumer in self.consumers:
                    link = consumer.link
                    if not link.alive and not link.closed and id(link) not in self._reported:
                        self._reported.add(id(link))
                        self._error(link.error or f"{link.name}: closed")

    async def run(self) -> None:
        """Connect, then follow the coordinator's commands until `stop`."""
        try:
            await self._open()
        except (LinkError, OSError) as exc:
            self._error(f"connecting to {self.address.host}:{self.address.port}: {exc}")
        else:
            self.channel.send({"event": "ready"})
        ticker = asyncio.create_task(self._tick())
        try:
            while True:
                command = (await self.channel.receive()).get("cmd")
                if command == "stop":
                    break
                if command not in ("warmup", "start", "mark"):
                    continue
                if self._phase is not None and not self._phase.done():
                    self._error(f"{command} received while the previous phase is running")
                    continue
                if command == "mark":
                    self._phase = asyncio.create_task(self._mark())
                    continue
                warm = command == "warmup"
                self._phase = asyncio.create_task(self._produce(warm, "warmed" if warm else "sent"))
        finally:
            ticker.cancel()
            if self._phase is not None and not self._phase.done():
                self._phase.cancel()
            await self._shutdown()

    async def _shutdown(self) -> None:
        for consumer in self.consumers:
            consumer.finish()
        links: list[StompLink] = [c.link for c in self.consumers] + [p.link for p in self.producers]
        await asyncio.gather(
            *(link.disconnect(_DISCONNECT_TIMEOUT_S) for link in links), return_exceptions=True
        )
        self.channel.send(
            {
                "event": "result",
                "producers": [p.result() for p in self.producers],
                "consumers": [c.result() for c in self.consumers],
                "errors": self.errors,
            }
        )


async def run_worker(conn: Connection, spec: dict[str, Any]) -> None:
    """The body of a worker process, on a running loop."""
    channel = Channel(conn)
    try:
        if spec["kind"] == "connections":
            await ConnectionsWorker(channel, spec).run()
        elif spec["kind"] == "check":
            await run_queue_check(channel, spec)
        else:
            await _ClientsWorker(channel, spec).run()
    except Exception as exc:  # the worker's task boundary: report, never hang the coordinator
        log.exception("bench worker failed")
        channel.send({"event": "error", "reason": f"worker failed: {type(exc).__name__}: {exc}"})
        channel.send({"event": "result", "producers": [], "consumers": [], "errors": [str(exc)]})
    finally:
        channel.close()


def worker_main(conn: Connection, spec_json: str) -> None:
    """Entry point of a spawned worker process."""
    # Ctrl-C reaches the whole process group; the coordinator decides when workers stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    spec: dict[str, Any] = json.loads(spec_json)
    logging.basicConfig(level=spec.get("log_level", logging.WARNING))
    raise_open_files_limit()
    loop_factory: Callable[[], asyncio.AbstractEventLoop] | None = None
    if spec.get("uvloop", True):
        try:
            import uvloop  # noqa: PLC0415

            loop_factory = uvloop.new_event_loop
        except ImportError:
            loop_factory = None
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        runner.run(run_worker(conn, spec))
    conn.close()
