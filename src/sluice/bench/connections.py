"""The connections scenario: many connections held open, each round-tripping a few messages.

Connection i subscribes to its own queue `/queue/bench.conn.<run>.<i>` (ack=auto, with a receipt)
and sends to it at `--rate-per-connection`; the run holds every connection for `--duration`
seconds and reports how many were established and held, messages round-tripped, and errors.
Connections are spread over worker processes (`--per-process`, 2,500 by default) whose open-files
limit is raised to the hard limit. With `--broker-pid` the broker's resident memory is read from
/proc before any connection, once all are established, and every second of the hold, to report
memory per connection.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from sluice.bench.payload import HEAD_STRUCT, MAGIC, filler
from sluice.bench.report import format_latency, latency_summary, merge_histograms, write_json
from sluice.bench.runner import RunAborted, WorkerPool
from sluice.bench.stats import LatencyHistogram
from sluice.bench.wire import BrokerAddress, LinkError, StompLink, open_link
from sluice.bench.worker import Channel, raise_open_files_limit
from sluice.stomp import Command, Frame, encode_headers

__all__ = ["ConnectionsWorker", "add_connections_parser", "read_rss_kib", "run_connections"]

_NS_PER_US = 1000
_NS_PER_S = 1_000_000_000
_PROGRESS_INTERVAL_S = 1.0
_DRAIN_GRACE_S = 3.0
_DISCONNECT_TIMEOUT_S = 5.0
# How long workers may take to disconnect their share after sending their results.
_DISCONNECT_GRACE_S = 60.0
_REASON_CHARS = 80
_SETUP_SLACK_S = 300.0
_KIB = 1024


def add_connections_parser(p: argparse.ArgumentParser) -> None:
    """The options of `sluice bench connections` (the common ones are added by the caller)."""
    p.add_argument("--connections", type=int, default=1000, metavar="N")
    p.add_argument("--duration", type=float, default=30.0, metavar="S", help="hold time")
    p.add_argument(
        "--rate-per-connection",
        type=float,
        default=0.1,
        metavar="R",
        help="messages per second each connection sends to itself (0: none)",
    )
    p.add_argument("--size", type=int, default=128, help="body bytes (at least 32)")
    p.add_argument("--per-process", type=int, default=2500, metavar="N", help="per worker")
    p.add_argument(
        "--connect-concurrency",
        type=int,
        default=100,
        metavar="N",
        help="handshakes in flight per worker",
    )
    p.add_argument("--broker-pid", type=int, default=None, metavar="PID", help="sample its RSS")


def read_rss_kib(pid: int) -> int | None:
    """VmRSS of a process in KiB from /proc/PID/status, or None if it cannot be read."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("VmRSS:"):
            parts = line.split()
            if len(parts) >= 2 and parts[1].isdigit():
                return int(parts[1])
    return None


def _reason(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    # Drop the per-connection name so equal failures count together.
    if ": " in text and text.startswith("conn "):
        text = text.split(": ", 1)[1]
    return text[:_REASON_CHARS]


class _Held:
    """One held connection and its own queue."""

    __slots__ = (
        "destination",
        "duplicates",
        "head",
        "index",
        "last_seq",
        "latency",
        "link",
        "received",
        "sent",
        "unexpected",
    )

    def __init__(self, index: int, link: StompLink, destination: str, size: int) -> None:
        self.index = index
        self.link = link
        self.destination = destination
        block = encode_headers(
            [("destination", destination), ("content-length", str(size))], link.version
        )
        self.head = b"SEND\n" + block + b"\n"
        self.sent = 0
        self.received = 0
        self.duplicates = 0
        self.unexpected = 0
        self.last_seq = -1
        self.latency: LatencyHistogram | None = None


class ConnectionsWorker:
    """A share of the connections, in one worker process."""

    def __init__(self, channel: Channel, spec: dict[str, Any]) -> None:
        broker = spec["broker"]
        self.channel = channel
        self.address = BrokerAddress(
            host=broker["host"],
            port=int(broker["port"]),
            login=broker.get("login"),
            passcode=broker.get("passcode"),
            host_header=broker.get("host_header", "/"),
        )
        self.first = int(spec["first"])
        self.count = int(spec["count"])
        self.prefix = str(spec["destination_prefix"])
        self.size = int(spec["size"])
        self.rate_per_connection = float(spec["rate_per_connection"])
        self.concurrency = int(spec["connect_concurrency"])
        self.timeout_s = float(spec["connect_timeout_s"])
        self.held: list[_Held] = []
        self.connect_errors: Counter[str] = Counter()
        self.lost: Counter[str] = Counter()
        self.latency = LatencyHistogram()
        self.unexpected = 0
        self._tail = filler(self.size) + b"\0"
        self._body_tail = filler(self.size)

    async def _open_one(self, index: int, gate: asyncio.Semaphore) -> None:
        async with gate:
            destination = f"{self.prefix}.{index}"
            link: StompLink | None = None
            try:
                link = await open_link(self.address, f"conn {index}", self.timeout_s)
                held = _Held(index, link, destination, self.size)
                link.on_message = lambda frame, now_ns: self._message(held, frame, now_ns)
                await link.request(
                    Command.SUBSCRIBE,
                    {
                        "id": "0",
                        "destination": destination,
                        "ack": "auto",
                        "activemq.prefetchSize": "10",
                        "prefetch-count": "10",
                    },
                    "sub",
                    self.timeout_s,
                )
            except (LinkError, OSError) as exc:
                self.connect_errors[_reason(exc)] += 1
                if link is not None:
                    link.close()
                return
            link.on_close = self._closed
            self.held.append(held)

    def _closed(self, reason: str | None) -> None:
        if reason is not None:
            self.lost[reason.split(": ", 1)[-1][:_REASON_CHARS]] += 1

    def _message(self, held: _Held, frame: Frame, now_ns: int) -> None:
        body = frame.body
        if not (
            len(body) == self.size and body.startswith(MAGIC) and body.endswith(self._body_tail)
        ):
            held.unexpected += 1
            return
        _, index, seq, sent_ns, _intended = HEAD_STRUCT.unpack_from(body)
        if index != held.index or seq >= held.sent:
            held.unexpected += 1
            return
        if seq <= held.last_seq:
            held.duplicates += 1
            return
        held.last_seq = seq
        held.received += 1
        self.latency.record((now_ns - sent_ns) // _NS_PER_US)

    async def _traffic(self) -> None:
        """Send round-robin so that each connection sends at its rate, phases spread evenly."""
        live = [h for h in self.held if h.link.alive]
        if not live or self.rate_per_connection <= 0:
            return
        interval_ns = _NS_PER_S / (self.rate_per_connection * len(live))
        origin = time.monotonic_ns()
        k = 0
        pack = HEAD_STRUCT.pack
        while True:
            now = time.monotonic_ns()
            due = origin + int(k * interval_ns)
            if due > now:
                await asyncio.sleep((due - now) / _NS_PER_S)
                continue
            held = live[k % len(live)]
            k += 1
            if not held.link.alive:
                continue
            try:
                held.link.write(
                    held.head + pack(MAGIC, held.index, held.sent, now, due) + self._tail
                )
            except LinkError:
                continue
            held.sent += 1

    async def _progress(self) -> None:
        while True:
            await asyncio.sleep(_PROGRESS_INTERVAL_S)
            self.channel.send(
                {
                    "event": "progress",
                    "open": sum(1 for h in self.held if h.link.alive),
                    "sent": sum(h.sent for h in self.held),
                    "received": sum(h.received for h in self.held),
                }
            )

    async def run(self) -> None:
        """Open the connections, hold them with traffic between `start` and `stop`, report."""
        raise_open_files_limit()
        gate = asyncio.Semaphore(max(1, self.concurrency))
        started = time.monotonic()
        await asyncio.gather(
            *(self._open_one(i, gate) for i in range(self.first, self.first + self.count))
        )
        self.channel.send(
            {
                "event": "ready",
                "established": len(self.held),
                "failed": sum(self.connect_errors.values()),
                "connect_s": time.monotonic() - started,
            }
        )
        tasks: list[asyncio.Task[None]] = [asyncio.create_task(self._progress())]
        while True:
            command = (await self.channel.receive()).get("cmd")
            if command == "start" and len(tasks) == 1:
                tasks.append(asyncio.create_task(self._traffic()))
            elif command == "stop":
                break
        for task in tasks:
            task.cancel()
        held_at_stop = sum(1 for h in self.held if h.link.alive)
        # Let messages already sent come back before counting them missing.
        end = time.monotonic() + _DRAIN_GRACE_S
        while time.monotonic() < end and any(
            h.link.alive and h.received + h.duplicates < h.sent for h in self.held
        ):
            await asyncio.sleep(0.05)
        # The counts are final now; send them before disconnecting, which a broker may take long
        # over with thousands of connections.
        self.channel.send(self._result(held_at_stop))
        closing = time.monotonic()
        await self._close_all()
        self.channel.send({"event": "closed", "disconnect_s": time.monotonic() - closing})

    async def _close_all(self) -> None:
        gate = asyncio.Semaphore(max(1, self.concurrency))

        async def close(held: _Held) -> None:
            held.link.on_close = None
            async with gate:
                await held.link.disconnect(_DISCONNECT_TIMEOUT_S)

        await asyncio.gather(*(close(h) for h in self.held), return_exceptions=True)

    def _result(self, held_at_stop: int) -> dict[str, Any]:
        alive = self.held
        return {
            "event": "result",
            "established": len(self.held),
            "failed": sum(self.connect_errors.values()),
            "connect_errors": dict(self.connect_errors),
            "held": held_at_stop,
            "lost": sum(self.lost.values()),
            "lost_reasons": dict(self.lost),
            "sent": sum(h.sent for h in alive),
            "received": sum(h.received for h in alive),
            "duplicates": sum(h.duplicates for h in alive),
            "unexpected": sum(h.unexpected for h in alive),
            "latency": self.latency.to_dict(),
        }


def _merge_counts(items: list[dict[str, int]]) -> dict[str, int]:
    total: Counter[str] = Counter()
    for item in items:
        total.update(item)
    return dict(total.most_common())


def _disconnect_s(pool: WorkerPool) -> float | None:
    """The longest time a worker took to disconnect its share, None if one did not finish."""
    times: list[float] = []
    for worker in pool.workers:
        value = worker.last.get("closed", {}).get("disconnect_s")
        if value is None:
            return None
        times.append(float(value))
    return round(max(times), 3) if times else None


def _hold(pool: WorkerPool, duration_s: float, broker_pid: int | None) -> int | None:
    """Pump for the hold time; return the largest RSS sampled meanwhile."""
    end = time.monotonic() + duration_s
    peak: int | None = None
    next_sample = time.monotonic()
    while time.monotonic() < end:
        errors = pool.errors()
        if errors:
            raise RunAborted(errors[0])
        if time.monotonic() >= pool.deadline:
            raise RunAborted("timed out holding the connections")
        if broker_pid is not None and time.monotonic() >= next_sample:
            rss = read_rss_kib(broker_pid)
            if rss is not None:
                peak = rss if peak is None else max(peak, rss)
            next_sample += 1.0
        pool.pump(min(0.1, max(0.0, end - time.monotonic())))
    return peak


def run_connections(args: argparse.Namespace) -> int:
    """Run `sluice bench connections` and print its report; return the exit code."""
    from sluice.bench.cli import EXIT_FAILURE, EXIT_OK, EXIT_USAGE, new_run_id  # noqa: PLC0415

    if args.connections < 1 or args.per_process < 1 or args.size < HEAD_STRUCT.size:
        print(
            "sluice bench connections: --connections and --per-process must be positive and "
            f"--size at least {HEAD_STRUCT.size}",
            file=sys.stderr,
        )
        return EXIT_USAGE
    raise_open_files_limit()
    host, port = args.broker
    run_id = new_run_id()
    prefix = f"/queue/bench.conn.{run_id}"
    processes = math.ceil(args.connections / args.per_process)
    if args.processes is not None:
        processes = max(1, min(args.processes, args.connections))
    timeout_s = args.timeout or args.duration + _SETUP_SLACK_S
    print(
        f"sluice bench connections: {args.connections} connections to {host}:{port} in "
        f"{processes} process(es), held {args.duration:g} s, "
        f"{args.rate_per_connection:g} msg/s each to {prefix}.<i>",
        flush=True,
    )
    pid = args.broker_pid
    rss_before = read_rss_kib(pid) if pid is not None else None
    pool = WorkerPool(time.monotonic() + timeout_s)
    base = {
        "kind": "connections",
        "broker": {
            "host": host,
            "port": port,
            "login": args.login,
            "passcode": args.passcode,
            "host_header": args.host_header,
        },
        "destination_prefix": prefix,
        "size": args.size,
        "rate_per_connection": args.rate_per_connection,
        "connect_concurrency": args.connect_concurrency,
        "connect_timeout_s": args.connect_timeout,
        "uvloop": not args.no_uvloop,
    }
    shares = [
        args.connections // processes + (1 if i < args.connections % processes else 0)
        for i in range(processes)
    ]
    reason: str | None = None
    rss_established = rss_peak = None
    connect_s = 0.0
    try:
        first = 0
        started = time.monotonic()
        for i, share in enumerate(shares):
            pool.start(f"connections-{i}", {**base, "first": first, "count": share})
            first += share
        pool.wait_for("connections", lambda: all("ready" in w.events for w in pool.workers))
        connect_s = time.monotonic() - started
        if pid is not None:
            rss_established = read_rss_kib(pid)
        pool.broadcast("start")
        rss_peak = _hold(pool, args.duration, pid)
    except RunAborted as exc:
        reason = str(exc)
    except KeyboardInterrupt:
        reason = "interrupted"
    finally:
        pool.finish(join_s=_DISCONNECT_GRACE_S)
    results = [w.result for w in pool.workers if w.result is not None]
    summary: dict[str, Any] = {
        "scenario": "connections",
        "connections": args.connections,
        "processes": processes,
        "connect_s": round(connect_s, 3),
        "established": sum(int(r.get("established", 0)) for r in results),
        "failed": sum(int(r.get("failed", 0)) for r in results),
        "connect_errors": _merge_counts([r.get("connect_errors", {}) for r in results]),
        "held": sum(int(r.get("held", 0)) for r in results),
        "lost": sum(int(r.get("lost", 0)) for r in results),
        "lost_reasons": _merge_counts([r.get("lost_reasons", {}) for r in results]),
        "sent": sum(int(r.get("sent", 0)) for r in results),
        "received": sum(int(r.get("received", 0)) for r in results),
        "duplicates": sum(int(r.get("duplicates", 0)) for r in results),
        "unexpected": sum(int(r.get("unexpected", 0)) for r in results),
        "latency_ms": latency_summary(merge_histograms(r["latency"] for r in results)),
        "disconnect_s": _disconnect_s(pool),
        "errors": pool.errors(),
        "reason": reason,
    }
    summary["missing"] = summary["sent"] - summary["received"]
    if pid is not None:
        summary["broker_rss_kib"] = {
            "before": rss_before,
            "established": rss_established,
            "peak_during_hold": rss_peak,
        }
        if rss_before is not None and rss_established is not None and summary["established"]:
            per = (rss_established - rss_before) * _KIB / summary["established"]
            summary["broker_bytes_per_connection"] = round(per)
    failures = [reason] if reason else []
    failures += summary["errors"][:1] if not reason else []
    if summary["established"] < args.connections:
        failures.append(f"{summary['established']} of {args.connections} connections established")
    elif summary["held"] < summary["established"]:
        failures.append(f"{summary['established'] - summary['held']} connections lost while held")
    if summary["missing"] or summary["duplicates"] or summary["unexpected"]:
        failures.append(
            f"{summary['missing']} messages missing, {summary['duplicates']} duplicated, "
            f"{summary['unexpected']} unexpected"
        )
    summary["ok"] = not failures
    summary["failure"] = "; ".join(failures) if failures else None
    for line in format_connections(summary):
        print(line)
    if args.json is not None:
        from sluice.bench.cli import options_of  # noqa: PLC0415

        write_json(args.json, "connections", options_of(args), summary)
    if failures:
        print(f"sluice bench connections: {summary['failure']}", file=sys.stderr)
        return EXIT_FAILURE
    return EXIT_OK


def format_connections(summary: dict[str, Any]) -> list[str]:
    """The human-readable report of a connections run."""
    lines = [
        f"established {summary['established']} of {summary['connections']} connections in "
        f"{summary['connect_s']:.1f} s ({summary['failed']} failed); "
        f"held {summary['held']}, lost {summary['lost']}",
        f"round-tripped {summary['received']} of {summary['sent']} messages "
        f"({summary['duplicates']} duplicates, {summary['unexpected']} unexpected)",
        format_latency("round-trip latency", summary["latency_ms"]),
        (
            f"disconnected all in {summary['disconnect_s']:.1f} s"
            if summary["disconnect_s"] is not None
            else "disconnecting did not finish in time (not counted as a failure)"
        ),
    ]
    for reason, count in list(summary["connect_errors"].items())[:5]:
        lines.append(f"connect error x{count}: {reason}")
    for reason, count in list(summary["lost_reasons"].items())[:5]:
        lines.append(f"lost x{count}: {reason}")
    rss = summary.get("broker_rss_kib")
    if rss is not None and rss["before"] is None:
        lines.append("broker RSS: /proc/PID/status of --broker-pid could not be read")
    elif rss is not None:
        lines.append(
            f"broker RSS: {rss['before']} KiB before, {rss['established']} KiB established, "
            f"{rss['peak_during_hold']} KiB peak while held"
            + (
                f"; {summary['broker_bytes_per_connection'] / _KIB:.1f} KiB per connection"
                if "broker_bytes_per_connection" in summary
                else ""
            )
        )
    for error in summary["errors"][:5]:
        lines.append(f"error: {error}")
    return lines
