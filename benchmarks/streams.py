#!/usr/bin/env python3
"""A large stream through a persistent queue on the journal store: throughput, broker memory, and
what a consumer killed at half costs.

    python benchmarks/streams.py [--size 5GiB] [--chunk-size 1MiB] [--window 16]
                                 [--prefetch-bytes 4MiB] [--dir DIR] [--no-kill] [--json]

In one run:

1. the machine's sequential write rate in DIR (`benchmarks/machine.py`, one fsync at the end);
2. a broker subprocess (`sluice broker --store journal`, default settings, sync=always) in DIR;
3. plain run: a producer process sends a generated stream of SIZE bytes (made on the fly from a
   seeded pool of random bytes, never stored) while a consumer process reads it with the stream
   reader (which checks order and the SHA-256). MB/s is SIZE over the time from the first chunk
   sent to the last byte read, set against the sequential write rate;
4. kill run: the same, with the consumer killed with SIGKILL once it has read half, and a second
   consumer started at once to finish. The second regenerates the first `resumed_at` bytes to
   seed the SHA-256, so the check still covers the whole stream. "Bytes delivered twice" is
   exact: every consumer reports each chunk as it reaches its subscription (`got OFFSET BYTES`),
   and the figure is the bytes of the chunks the first consumer had received at or after the
   second one's `resumed_at`, all of which the second receives again (what sat in socket buffers
   and never reached the first is not counted). The target is at most `--prefetch-bytes`;

and, for both runs, the broker's peak resident memory, sampled from /proc/PID/status (VmRSS)
every 50 ms. The sequential write rate and the broker's peak RSS come from the same run as the
stream figures. The roles run as subprocesses of this script (`--role producer|consumer`).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import random
import re
import resource
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from machine import measure_sequential, parse_size

MIB = 1024 * 1024
POOL_BYTES = 16 * MIB
RSS_SAMPLE_S = 0.05
_LISTENING = re.compile(r"listening on [\d.]+:(\d+)")
QUEUE = "/queue/bench.streams"


# -- the generated stream ---------------------------------------------------------------------


def generate(size: int, chunk: int, seed: int = 7) -> Iterator[bytes]:
    """SIZE bytes in pieces of CHUNK, the same for the same arguments, made on the fly."""
    pool = random.Random(seed).randbytes(POOL_BYTES)
    step = 4093 * 4096  # a prime number of pages: offsets wander over the pool
    offset = 0
    sent = 0
    index = 0
    while sent < size:
        n = min(chunk, size - sent)
        start = (index * step) % (POOL_BYTES - n)
        piece = bytearray(pool[start : start + n])
        piece[:8] = index.to_bytes(8, "little")  # no two chunks alike
        yield bytes(piece)
        sent += n
        offset += n
        index += 1


def prefix_sha256(length: int, chunk: int) -> Any:
    """The SHA-256 object of the first LENGTH bytes of the generated stream."""
    hasher = hashlib.sha256()
    done = 0
    for piece in generate(length, chunk):
        hasher.update(piece)
        done += len(piece)
    assert done == length
    return hasher


# -- roles (subprocesses) ---------------------------------------------------------------------


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return round(usage.ru_utime + usage.ru_stime, 2)


def role_producer(args: argparse.Namespace) -> None:
    from sluice.client import BlockingClient  # noqa: PLC0415

    with BlockingClient(args.broker) as client:
        print(f"begin {time.time()}", flush=True)
        started = time.monotonic()
        sent = client.send_stream(
            QUEUE,
            generate(args.size, args.chunk_size),
            chunk_size=args.chunk_size,
            window=args.window,
            stream_id=args.stream_id,
        )
        elapsed = time.monotonic() - started
    print(
        json.dumps(
            {"sent": sent.length, "sha256": sent.sha256, "seconds": elapsed, "cpu_s": _cpu_s()}
        ),
        flush=True,
    )


class _Lines:
    """Whole lines on stdout from two threads (the client's loop and the reader)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()

    def __call__(self, line: str) -> None:
        with self._lock:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()


def role_consumer(args: argparse.Namespace) -> None:
    """Read one stream. Print `got <offset> <bytes>` for each chunk as it reaches the
    subscription, `pos <bytes read>` as the application reads, then a summary."""
    from sluice.client import BlockingClient  # noqa: PLC0415

    say = _Lines()
    with BlockingClient(args.broker) as client:
        with client.stream_reader(QUEUE, prefetch_bytes=args.prefetch_bytes) as reader:
            subscription = reader.aio.subscription
            assert subscription is not None
            deliver = subscription.deliver

            def arrived(message: Any) -> bool:
                say(f"got {message.headers.get('x-stream-offset', -1)} {len(message.body)}")
                return deliver(message)

            subscription.deliver = arrived  # type: ignore[method-assign]
            say("ready")
            stream = reader.next_stream(timeout=600)
            assert stream is not None
            say(f"start {stream.resumed_at} {time.time()}")
            if stream.resumed_at:
                stream.seed_sha256(prefix_sha256(stream.resumed_at, args.chunk_size))
            received = stream.resumed_at
            for piece in stream:
                received += len(piece)
                say(f"pos {received}")
            verified = stream.verified
        say(
            json.dumps(
                {"received": received, "verified": verified, "end": time.time(), "cpu_s": _cpu_s()}
            )
        )


# -- the driver -------------------------------------------------------------------------------


class Broker:
    """`sluice broker` on the journal store, with its peak RSS sampled."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.proc: subprocess.Popen[str] | None = None
        self.port = 0
        self.peak_rss = 0
        self._sampling = False
        self._sampler = threading.Thread()

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sluice", "broker", "--store", "journal", "--data",
             str(self.data_dir), "--stomp", "127.0.0.1:0"],
            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
        )  # fmt: skip
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            match = _LISTENING.search(line)
            if match:
                self.port = int(match.group(1))
                break
        else:
            raise RuntimeError("the broker did not start")
        threading.Thread(target=self._drain, daemon=True).start()
        self._sampling = True
        self._sampler = threading.Thread(target=self._sample, daemon=True)
        self._sampler.start()

    def _drain(self) -> None:
        assert self.proc is not None
        assert self.proc.stderr is not None
        for _ in self.proc.stderr:
            pass

    def rss(self) -> int:
        assert self.proc is not None
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        return 0

    def _sample(self) -> None:
        while self._sampling:
            self.peak_rss = max(self.peak_rss, self.rss())
            time.sleep(RSS_SAMPLE_S)

    def reset_peak(self) -> None:
        self.peak_rss = self.rss()

    def cpu_s(self) -> float:
        """User and system CPU seconds of the broker so far."""
        assert self.proc is not None
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        self._sampling = False
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _role(
    args: argparse.Namespace, role: str, broker: Broker, **extra: str
) -> subprocess.Popen[str]:
    command = [
        sys.executable, __file__, "--role", role, "--broker", f"127.0.0.1:{broker.port}",
        "--size", str(args.size), "--chunk-size", str(args.chunk_size),
        "--window", str(args.window), "--prefetch-bytes", str(args.prefetch_bytes),
    ]  # fmt: skip
    for name, value in extra.items():
        command += [f"--{name.replace('_', '-')}", value]
    return subprocess.Popen(command, stdout=subprocess.PIPE, text=True)


def _wait_line(proc: subprocess.Popen[str], prefix: str) -> str:
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith(prefix):
            return line
    raise RuntimeError(f"{proc.args[3]} ended before saying {prefix!r}")


def _summary(proc: subprocess.Popen[str]) -> dict[str, Any]:
    assert proc.stdout is not None
    last = ""
    for line in proc.stdout:
        last = line
    if proc.wait() != 0:
        raise RuntimeError(f"{proc.args[3]} failed with exit code {proc.returncode}")
    result: dict[str, Any] = json.loads(last)
    return result


def plain_run(args: argparse.Namespace, broker: Broker) -> dict[str, Any]:
    broker.reset_peak()
    cpu_before = broker.cpu_s()
    consumer = _role(args, "consumer", broker)
    _wait_line(consumer, "ready")
    producer = _role(args, "producer", broker, stream_id="plain")
    started = float(_wait_line(producer, "begin").split()[1])
    produced = _summary(producer)
    consumed = _summary(consumer)
    seconds = consumed["end"] - started
    return {
        "seconds": round(seconds, 2),
        "mb_per_s": round(args.size / seconds / 1e6, 1),
        "producer_seconds": round(produced["seconds"], 2),
        "cpu_s": {
            "broker": round(broker.cpu_s() - cpu_before, 2),
            "producer": produced["cpu_s"],
            "consumer": consumed["cpu_s"],
        },
        "verified": consumed["verified"],
        "broker_peak_rss_mib": round(broker.peak_rss / MIB, 1),
    }


def kill_run(args: argparse.Namespace, broker: Broker) -> dict[str, Any]:
    broker.reset_peak()
    first = _role(args, "consumer", broker)
    _wait_line(first, "ready")
    producer = _role(args, "producer", broker, stream_id="killed")
    started = float(_wait_line(producer, "begin").split()[1])
    # (offset, bytes) of every chunk that reached the first consumer's subscription.
    received: dict[int, int] = {}
    read = 0
    killed = False
    assert first.stdout is not None
    for line in first.stdout:
        if line.startswith("got "):
            _, offset, size = line.split()
            received[int(offset)] = int(size)
        elif line.startswith("pos "):
            read = int(line.split()[1])
            if read >= args.size // 2 and not killed:
                first.send_signal(signal.SIGKILL)
                killed = True
                # Read on to the end of the pipe: what it did before it died.
    first.wait()
    second = _role(args, "consumer", broker)
    assert second.stdout is not None
    resumed_at = -1
    last = ""
    for line in second.stdout:
        if line.startswith("start "):
            resumed_at = int(line.split()[1])
        last = line
    if second.wait() != 0:
        raise RuntimeError("the second consumer failed")
    consumed = json.loads(last)
    _summary(producer)
    seconds = consumed["end"] - started
    # The second consumer receives every chunk from `resumed_at` on: those the first had
    # received too were delivered twice.
    twice = sum(size for offset, size in received.items() if offset >= resumed_at)
    return {
        "seconds": round(seconds, 2),
        "mb_per_s": round(args.size / seconds / 1e6, 1),
        "first_consumer_read": read,
        "first_consumer_received": max((o + n for o, n in received.items()), default=0),
        "resumed_at": resumed_at,
        "delivered_twice_bytes": twice,
        "prefetch_bytes": args.prefetch_bytes,
        "delivered_twice_within_credit": twice <= args.prefetch_bytes,
        "verified": consumed["verified"],
        "broker_peak_rss_mib": round(broker.peak_rss / MIB, 1),
    }


def drive(args: argparse.Namespace) -> dict[str, Any]:
    result: dict[str, Any] = {
        "size": args.size,
        "chunk_size": args.chunk_size,
        "window": args.window,
        "prefetch_bytes": args.prefetch_bytes,
    }
    with contextlib.ExitStack() as stack:
        if args.dir:
            directory = Path(args.dir)
            directory.mkdir(parents=True, exist_ok=True)
        else:
            directory = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="sluice-")))
        print(f"sequential write of {args.seq_bytes // MIB} MiB in {directory}", file=sys.stderr)
        seq = measure_sequential(directory, args.seq_bytes, MIB)
        result["seq_write_mb_per_s"] = seq.mb_per_s
        broker = Broker(directory / "data")
        broker.start()
        stack.callback(broker.stop)
        print(f"plain run: {args.size / MIB:.0f} MiB", file=sys.stderr)
        result["plain"] = plain_run(args, broker)
        result["plain"]["of_seq_write"] = round(result["plain"]["mb_per_s"] / seq.mb_per_s, 2)
        if not args.no_kill:
            print("kill run: consumer killed at half", file=sys.stderr)
            result["kill"] = kill_run(args, broker)
            result["kill"]["of_seq_write"] = round(result["kill"]["mb_per_s"] / seq.mb_per_s, 2)
        result["broker_peak_rss_mib"] = max(
            run["broker_peak_rss_mib"] for run in (result["plain"], result.get("kill", {})) if run
        )
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", type=parse_size, default=parse_size("5GiB"))
    parser.add_argument("--chunk-size", type=parse_size, default=MIB)
    parser.add_argument("--window", type=int, default=16)
    parser.add_argument("--prefetch-bytes", type=parse_size, default=4 * MIB)
    parser.add_argument("--seq-bytes", type=parse_size, default=parse_size("1GiB"))
    parser.add_argument("--dir", default=None, help="where the broker's data goes (default: tmp)")
    parser.add_argument("--no-kill", action="store_true", help="skip the kill run")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--role", choices=["producer", "consumer"], help=argparse.SUPPRESS)
    parser.add_argument("--broker", help=argparse.SUPPRESS)
    parser.add_argument("--stream-id", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role == "producer":
        role_producer(args)
        return 0
    if args.role == "consumer":
        role_consumer(args)
        return 0
    result = drive(args)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for key, value in result.items():
            print(f"{key:20} {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
