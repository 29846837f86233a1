"""Pauses of the broker's event loop while it holds a large backlog in memory, and what the
cyclic garbage collector has to do with them.

    .venv/bin/python benchmarks/gc_pauses.py --backlog 200000 --size 256 --rate 2000 --seconds 20
    .venv/bin/python benchmarks/gc_pauses.py --backlog 200000 --seconds 5 --churn 3000000

Starts `sluice broker` (journal store in a temporary directory, default limits, 127.0.0.1 on a
port the OS chooses) in a subprocess, through this script's `--serve` mode: the broker as
`python -m sluice broker` runs it, plus two probes inside its process, written to a JSON file
when it stops. One times every collection (`gc.callbacks`: its generation and how long it took);
the other is a task on the broker's event loop that sleeps 1 ms again and again and records how
late it wakes up: how long the loop could not run anything.

1. backlog: `--backlog` messages of `--size` bytes to /queue/gc.backlog, in batches of 1,000
   with a receipt on the last, every other batch persistent; nobody consumes them.
2. steady: for `--seconds`, a producer sends persistent messages with a receipt at `--rate` a
   second (on a fixed schedule, not waiting for receipts) to /queue/gc.flow, and a consumer
   receives and acknowledges each. Latency is measured from each message's scheduled time: to its
   RECEIPT, and to its MESSAGE at the consumer.
3. churn (`--churn N`, off by default): N non-persistent messages through /queue/gc.churn as
   fast as they go, at most 10,000 ahead of the consumer (so the queue stays short), acknowledged
   every 1,000; the broker's RSS is sampled every second: memory must stay bounded.

Every phase reports the longest stall of the broker's loop, the collections of each generation
(count, total and longest), and the broker's RSS; `--json FILE` writes it all.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from array import array
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from sluice.stomp.codec import FrameParser, StompLimits
from sluice.stomp.frames import Frame, Version

LISTENING = re.compile(r"listening on [\d.]+:(\d+)")
BATCH = 1000
CHURN_AHEAD = 10_000
_PROBE_SLEEP_S = 0.001

# -- inside the broker process --------------------------------------------------------------------


class _Probes:
    """What `--serve` records in the broker process: collections and the loop's lateness."""

    def __init__(self) -> None:
        # (monotonic start, seconds, CPU seconds of the thread, generation), flat. The CPU time
        # leaves out what other processes took from a busy machine meanwhile.
        self.collections = array("d")
        # (monotonic time, seconds late) of every wake-up at least 1 ms late, flat.
        self.stalls = array("d")
        self.wakeups = 0
        # The broker's own `gc.callbacks` entries (objects with counters), seen while it runs.
        self._broker_callbacks: list[object] = []
        self._started = 0.0
        self._started_cpu = 0.0

    def on_gc(self, phase: str, info: dict[str, int]) -> None:
        now, cpu = time.monotonic(), time.thread_time()
        if phase == "start":
            self._started, self._started_cpu = now, cpu
        else:
            self.collections.extend(
                (self._started, now - self._started, cpu - self._started_cpu, info["generation"])
            )

    def _note_broker_callbacks(self) -> None:
        for callback in gc.callbacks:
            owner = getattr(callback, "__self__", None)
            if owner is not None and owner is not self and owner not in self._broker_callbacks:
                self._broker_callbacks.append(owner)

    def _broker_counters(self) -> list[dict[str, Any]]:
        return [
            {"type": type(owner).__name__}
            | {k: v for k, v in vars(owner).items() if isinstance(v, int | float)}
            for owner in self._broker_callbacks
        ]

    async def watch_loop(self) -> None:
        while True:
            before = time.monotonic()
            await asyncio.sleep(_PROBE_SLEEP_S)
            now = time.monotonic()
            self.wakeups += 1
            if self.wakeups % 1000 == 1:
                self._note_broker_callbacks()
            late = now - before - _PROBE_SLEEP_S
            if late >= 0.001:
                self.stalls.extend((now, late))

    def dump(self, path: Path) -> None:
        path.write_text(
            json.dumps(
                {
                    "collections": list(self.collections),
                    "stalls": list(self.stalls),
                    "wakeups": self.wakeups,
                    "broker_callbacks": self._broker_counters(),
                    "tracked_at_exit": len(gc.get_objects()),
                }
            )
        )


def _serve(out: Path, broker_argv: list[str]) -> int:
    """Run `sluice broker` in this process with the probes on; write them to `out` at exit."""
    from sluice.cli import main  # noqa: PLC0415

    probes = _Probes()
    gc.callbacks.append(probes.on_gc)
    real_run = asyncio.run

    def run_with_probe(coro: Coroutine[Any, Any, Any], **kwargs: Any) -> Any:
        # `sluice broker` serves in one `asyncio.run`: the probe task shares its loop.
        async def both() -> Any:
            watch = asyncio.get_running_loop().create_task(probes.watch_loop())
            try:
                return await coro
            finally:
                watch.cancel()

        return real_run(both(), **kwargs)

    asyncio.run = run_with_probe  # type: ignore[assignment]
    try:
        return main(broker_argv)
    finally:
        gc.callbacks.remove(probes.on_gc)
        probes.dump(out)


# -- the load -------------------------------------------------------------------------------------


class _Peer(asyncio.Protocol):
    """A STOMP connection whose frames go to a callback. An ERROR frame, a lost connection or a
    failing callback ends the run: `failed` (shared by the peers of a phase) gets the error."""

    def __init__(self, on_frame: Any, failed: asyncio.Future[None]) -> None:
        self.parser = FrameParser(StompLimits(), Version.V1_2)
        self.on_frame = on_frame
        self.failed = failed
        self.closing = False
        self.transport: asyncio.Transport | None = None
        self.connected = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        transport.write(b"CONNECT\naccept-version:1.2\nhost:localhost\nheart-beat:0,0\n\n\0")

    def data_received(self, data: bytes) -> None:
        self.parser.feed(data)
        try:
            while (event := self.parser.next_event()) is not None:
                if not isinstance(event, Frame):
                    continue
                if event.command == "CONNECTED":
                    self.connected.set_result(None)
                elif event.command == "ERROR":
                    raise RuntimeError(f"ERROR from the broker: {event.headers}")
                else:
                    self.on_frame(event)
        except Exception as exc:
            self._fail(exc)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closing:
            self._fail(exc or ConnectionError("the broker closed the connection"))

    def _fail(self, exc: BaseException) -> None:
        if not self.failed.done():
            self.failed.set_exception(exc)
        if self.transport is not None:
            self.transport.abort()

    def send(self, data: bytes) -> None:
        assert self.transport is not None
        self.transport.write(data)

    def close(self) -> None:
        self.closing = True
        assert self.transport is not None
        self.transport.close()


async def _connect(port: int, on_frame: Any, failed: asyncio.Future[None]) -> _Peer:
    loop = asyncio.get_running_loop()
    _transport, peer = await loop.create_connection(
        lambda: _Peer(on_frame, failed), "127.0.0.1", port
    )
    await _until(peer.connected, failed, 30)
    return peer


async def _until(done: asyncio.Future[Any], failed: asyncio.Future[None], timeout: float) -> Any:
    """Wait for `done` unless a peer fails first."""
    finished, _ = await asyncio.wait({done, failed}, timeout=timeout, return_when="FIRST_COMPLETED")
    if failed in finished:
        failed.result()  # raises the peer's error
    if done not in finished:
        raise TimeoutError(f"nothing for {timeout} s")
    return done.result()


def _send(destination: bytes, body: bytes, headers: bytes = b"") -> bytes:
    return b"SEND\ndestination:%b\n%bcontent-length:%d\n\n%b\0" % (
        destination,
        headers,
        len(body),
        body,
    )


async def _fill(port: int, count: int, size: int) -> None:
    """The backlog: batches of `BATCH`, every other one persistent, each waiting for its
    receipt."""
    loop = asyncio.get_running_loop()
    failed = loop.create_future()
    receipt: asyncio.Future[str] = loop.create_future()

    def on_receipt(frame: Frame) -> None:
        receipt.set_result(frame.headers["receipt-id"])

    peer = await _connect(port, on_receipt, failed)
    body = b"x" * size
    sent = 0
    while sent < count:
        batch = min(BATCH, count - sent)
        persistent = b"persistent:true\n" if (sent // BATCH) % 2 == 0 else b""
        frame = _send(b"/queue/gc.backlog", body, persistent)
        last = _send(b"/queue/gc.backlog", body, persistent + b"receipt:b%d\n" % sent)
        peer.send(frame * (batch - 1) + last)
        assert await _until(receipt, failed, 120) == f"b{sent}"
        receipt = loop.create_future()
        sent += batch
    peer.close()


def _percentile(sorted_values: list[float], fraction: float) -> float:
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, int(fraction * len(sorted_values)))]


def _latency(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "count": len(ordered),
        "p50_ms": _percentile(ordered, 0.5) * 1e3,
        "p99_ms": _percentile(ordered, 0.99) * 1e3,
        "max_ms": (ordered[-1] if ordered else float("nan")) * 1e3,
    }


async def _steady(port: int, rate: float, seconds: float, size: int) -> dict[str, Any]:
    """Persistent sends with a receipt on a fixed schedule; each consumed and acknowledged."""
    count = int(rate * seconds)
    scheduled = [0.0] * count
    receipt_s: list[float] = []
    delivered_s: list[float] = []
    loop = asyncio.get_running_loop()
    failed = loop.create_future()
    done = loop.create_future()
    subscribed = loop.create_future()

    def on_receipt(frame: Frame) -> None:
        receipt_s.append(time.monotonic() - scheduled[int(frame.headers["receipt-id"])])
        finished()

    def finished() -> None:
        # A queue may deliver a persistent message before its RECEIPT: wait for both.
        if len(delivered_s) == len(receipt_s) == count and not done.done():
            done.set_result(None)

    def on_message(frame: Frame) -> None:
        if frame.command == "RECEIPT":
            subscribed.set_result(None)
            return
        delivered_s.append(time.monotonic() - scheduled[int(frame.headers["n"])])
        consumer.send(b"ACK\nid:%b\n\n\0" % frame.headers["ack"].encode())
        finished()

    producer = await _connect(port, on_receipt, failed)
    consumer = await _connect(port, on_message, failed)
    consumer.send(
        b"SUBSCRIBE\nid:1\ndestination:/queue/gc.flow\nack:client-individual\nreceipt:s\n\n\0"
    )
    await _until(subscribed, failed, 30)
    body = b"y" * size
    started = time.monotonic() + 0.1
    for n in range(count):
        scheduled[n] = at = started + n / rate
        delay = at - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        headers = b"persistent:true\nreceipt:%d\nn:%d\n" % (n, n)
        producer.send(_send(b"/queue/gc.flow", body, headers))
        if failed.done():
            failed.result()
    await _until(done, failed, 60)
    producer.close()
    consumer.close()
    return {"messages": count, "receipt": _latency(receipt_s), "delivered": _latency(delivered_s)}


async def _churn(port: int, count: int, size: int, rss: Any) -> dict[str, Any]:
    """Non-persistent messages through a queue as fast as they go, at most `CHURN_AHEAD` ahead
    of the consumer; the broker's RSS every second."""
    received = 0
    loop = asyncio.get_running_loop()
    failed = loop.create_future()
    progress = asyncio.Event()
    samples: list[tuple[float, int, int]] = []  # (seconds, messages received, RSS bytes)

    def on_message(frame: Frame) -> None:
        nonlocal received
        received += 1
        if received % BATCH == 0 or received == count:
            consumer.send(b"ACK\nid:%b\n\n\0" % frame.headers["ack"].encode())
            progress.set()

    producer = await _connect(port, lambda frame: None, failed)
    consumer = await _connect(port, on_message, failed)
    consumer.send(b"SUBSCRIBE\nid:1\ndestination:/queue/gc.churn\nack:client\n\n\0")
    batch = _send(b"/queue/gc.churn", b"z" * size) * BATCH
    started = time.monotonic()
    next_sample = started
    sent = 0
    while received < count:
        now = time.monotonic()
        if now >= next_sample:
            samples.append((now - started, received, rss()))
            next_sample += 1.0
        if sent < count and sent - received < CHURN_AHEAD:
            producer.send(batch)
            sent += BATCH
            await asyncio.sleep(0)
        else:
            progress.clear()
            await _until(asyncio.ensure_future(progress.wait()), failed, 60)
    elapsed = time.monotonic() - started
    samples.append((elapsed, received, rss()))
    producer.close()
    consumer.close()
    return {"messages": received, "seconds": elapsed, "rss_samples": samples}


# -- the broker subprocess and the report ---------------------------------------------------------


class _Broker:
    """`sluice broker` in a subprocess with the probes (this script's `--serve`)."""

    def __init__(self, workdir: Path) -> None:
        self.probes_path = workdir / "probes.json"
        argv = [
            *("broker", "--store", "journal", "--data", str(workdir / "data")),
            *("--stomp", "127.0.0.1:0", "--no-http"),
        ]
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--serve", str(self.probes_path), "--", *argv],
            cwd=workdir,
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
            env={k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")},
        )
        assert self.proc.stderr is not None
        self.port = 0
        for line in self.proc.stderr:
            match = LISTENING.search(line)
            if match:
                self.port = int(match.group(1))
                break
        else:
            raise RuntimeError("broker exited before listening")
        # Keep reading so the broker never blocks on a full pipe.
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        assert self.proc.stderr is not None
        for _line in self.proc.stderr:
            pass

    def rss_bytes(self) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError("no VmRSS")

    def cpu_s(self) -> float:
        """CPU seconds the broker has used, its threads together."""
        # The fields after the command name, which is in parentheses: utime and stime.
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> dict[str, Any]:
        """SIGTERM, wait, and return what the probes recorded."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(30)
            raise
        if self.proc.returncode != 0:
            raise RuntimeError(f"broker exited with {self.proc.returncode}")
        probes: dict[str, Any] = json.loads(self.probes_path.read_text())
        return probes


def _phase_probes(probes: dict[str, Any], start: float, end: float) -> dict[str, Any]:
    """The collections and stalls recorded in [start, end); times in seconds from `start`."""
    flat = probes["collections"]
    by_gen: dict[str, list[tuple[float, float]]] = {"0": [], "1": [], "2": []}
    full: list[tuple[float, float, float]] = []
    for i in range(0, len(flat), 4):
        at, wall, cpu, generation = flat[i : i + 4]
        if start <= at < end:
            by_gen[str(int(generation))].append((wall, cpu))
            if generation == 2:
                full.append((round(at - start, 3), round(wall * 1e3, 2), round(cpu * 1e3, 2)))
    stalls = probes["stalls"]
    lateness = [
        (stalls[i] - start, stalls[i + 1])
        for i in range(0, len(stalls), 2)
        if start <= stalls[i] < end
    ]
    return {
        "longest_stall_ms": max((late for _at, late in lateness), default=0.0) * 1e3,
        "stalls_over_5ms": [
            (round(at, 3), round(late * 1e3, 2)) for at, late in lateness if late > 0.005
        ],
        "full_collections": full,
        "collections": {
            gen: {
                "count": len(times),
                "total_ms": sum(wall for wall, _cpu in times) * 1e3,
                "max_ms": max((wall for wall, _cpu in times), default=0.0) * 1e3,
                "total_cpu_ms": sum(cpu for _wall, cpu in times) * 1e3,
                "max_cpu_ms": max((cpu for _wall, cpu in times), default=0.0) * 1e3,
            }
            for gen, times in by_gen.items()
        },
    }


def _print_phase(name: str, phase: dict[str, Any]) -> None:
    gens = ", ".join(
        f"gen{gen} {c['count']} (total {c['total_ms']:.0f} ms, longest {c['max_ms']:.1f} ms, "
        f"of CPU {c['max_cpu_ms']:.1f} ms)"
        for gen, c in phase["collections"].items()
    )
    print(
        f"{name}: longest loop stall {phase['longest_stall_ms']:.1f} ms, "
        f"{len(phase['stalls_over_5ms'])} stalls over 5 ms; collections: {gens}"
    )


async def _measure(args: argparse.Namespace, broker: _Broker) -> dict[str, Any]:
    result: dict[str, Any] = {"marks": {}, "broker_cpu_s": {}}
    marks, cpu = result["marks"], result["broker_cpu_s"]
    marks["start"], cpu["start"] = time.monotonic(), broker.cpu_s()
    await _fill(broker.port, args.backlog, args.size)
    marks["backlog"], cpu["backlog"] = time.monotonic(), broker.cpu_s()
    result["rss_backlog_bytes"] = broker.rss_bytes()
    # The load's own process keeps out of its own way: what it built so far is not garbage.
    gc.collect()
    gc.freeze()
    # The steady phase starts here: what happens between two phases counts in the next one.
    marks["backlog"], cpu["backlog"] = time.monotonic(), broker.cpu_s()
    result["steady"] = await _steady(broker.port, args.rate, args.seconds, args.size)
    marks["steady"], cpu["steady"] = time.monotonic(), broker.cpu_s()
    result["rss_steady_bytes"] = broker.rss_bytes()
    if args.churn:
        result["churn"] = await _churn(broker.port, args.churn, args.size, broker.rss_bytes)
    marks["churn"], cpu["churn"] = time.monotonic(), broker.cpu_s()
    return result


def _run(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="gc-pauses-") as workdir:
        broker = _Broker(Path(workdir))
        try:
            result = asyncio.run(_measure(args, broker))
        finally:
            probes = broker.stop()
    marks = result.pop("marks")
    result["phases"] = {
        "backlog": _phase_probes(probes, marks["start"], marks["backlog"]),
        "steady": _phase_probes(probes, marks["backlog"], marks["steady"]),
    }
    if args.churn:
        result["phases"]["churn"] = _phase_probes(probes, marks["steady"], marks["churn"])
    result["broker_tracked_objects_at_exit"] = probes["tracked_at_exit"]
    result["broker_gc_callbacks"] = probes["broker_callbacks"]
    result["probe_wakeups"] = probes["wakeups"]
    return result


def _report(args: argparse.Namespace, result: dict[str, Any]) -> None:
    mib = 1 << 20
    print(
        f"backlog: {args.backlog} messages of {args.size} B (every other 1,000 persistent); "
        f"broker RSS {result['rss_backlog_bytes'] / mib:.0f} MiB"
    )
    _print_phase("backlog phase", result["phases"]["backlog"])
    steady = result["steady"]
    receipt, delivered = steady["receipt"], steady["delivered"]
    print(
        f"steady: {steady['messages']} persistent messages at {args.rate:g}/s: receipt "
        f"p50 {receipt['p50_ms']:.2f} p99 {receipt['p99_ms']:.2f} max {receipt['max_ms']:.1f} ms; "
        f"delivered p50 {delivered['p50_ms']:.2f} p99 {delivered['p99_ms']:.2f} "
        f"max {delivered['max_ms']:.1f} ms; broker RSS {result['rss_steady_bytes'] / mib:.0f} MiB"
    )
    cpu = result["broker_cpu_s"]
    print(
        f"broker CPU: backlog {cpu['backlog'] - cpu['start']:.2f} s, "
        f"steady {cpu['steady'] - cpu['backlog']:.2f} s "
        f"({(cpu['steady'] - cpu['backlog']) * 1e6 / steady['messages']:.0f} us per message)"
        + (f", churn {cpu['churn'] - cpu['steady']:.2f} s" if "churn" in result else "")
    )
    _print_phase("steady phase", result["phases"]["steady"])
    if "churn" in result:
        churn = result["churn"]
        samples = churn["rss_samples"]
        rss = [sample[2] for sample in samples]
        tenth = samples[max(0, len(samples) // 10)]
        print(
            f"churn: {churn['messages']} messages in {churn['seconds']:.0f} s; broker RSS MiB "
            f"at 10 % {tenth[2] / mib:.0f}, at the end {rss[-1] / mib:.0f}, "
            f"highest {max(rss) / mib:.0f}, median {statistics.median(rss) / mib:.0f}"
        )
        _print_phase("churn phase", result["phases"]["churn"])
    print(
        f"broker at exit: {result['broker_tracked_objects_at_exit']} objects tracked; "
        f"its gc.callbacks: {result['broker_gc_callbacks']}"
    )


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--serve":
        # The broker side: `--serve PROBES.json -- broker ARGS...`.
        sys.exit(_serve(Path(sys.argv[2]), sys.argv[4:]))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backlog", type=int, default=200_000, help="messages left queued")
    parser.add_argument("--size", type=int, default=256, help="body bytes of every message")
    parser.add_argument("--rate", type=float, default=2000.0, help="steady sends a second")
    parser.add_argument("--seconds", type=float, default=20.0, help="of steady load")
    parser.add_argument("--churn", type=int, default=0, help="messages through a queue after")
    parser.add_argument("--json", type=Path, help="write the results to this file")
    args = parser.parse_args()
    result = _run(args)
    _report(args, result)
    if args.json is not None:
        args.json.write_text(json.dumps({"args": vars(args) | {"json": None}, **result}, indent=1))


if __name__ == "__main__":
    main()
