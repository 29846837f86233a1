#!/usr/bin/env python3
"""A second load generator, built on stomp.py (a STOMP client this project did not write), to
cross-check `sluice bench` against any STOMP broker.

Each producer is an OS process of its own (multiprocessing, spawn) holding one blocking stomp.py
`Connection12`. Every SEND carries a `receipt` header and the producer waits for that RECEIPT
(a listener sets a `threading.Event` from stomp.py's receiver thread) before its next SEND: the
synchronous publisher of an application. Latency is the time from just before `send()` until the
producer's thread wakes with the receipt, as the application sees it. For throughput runs,
`--receipt-every N` asks for a receipt on every Nth send only (and the last), and `--window K`
lets K of them be unanswered at once, as `sluice bench throughput`'s `--receipt-every` and
`--max-receipts` do; the latency is then timed on stomp.py's receiver thread, and with consumers
the summary also gives `delivered_per_s`, from the first measured send to the last message any
consumer received (how `sluice bench throughput` counts).

A run: consumer processes (optional) subscribe and confirm with a receipt; producer processes
connect and send `--warmup` messages each, unmeasured; then all start together on a signal and
send `--count` messages between them (split evenly), flat out or, with `--rate`, on a timetable
of that many messages per second in total (producer i of N sends at origin + (k + i/N) / (rate/N);
a send whose receipt comes late is sent late, and counted). Throughput is the measured messages
over the time from the first measured send of any producer to the last receipt of any
(`time.monotonic_ns` is one clock for all processes). Consumers count what arrives, check that each
message came exactly once, and acknowledge as `sluice bench` does by default (`client`: one
cumulative ACK per 500 messages, prefetch 1000), or `--consumer-ack auto|client-individual`.

Given `--broker-pid`, the broker's CPU time (user + system, /proc/PID/stat) is read when the
producers start and when the last one reports, and shown per message. The producers' own CPU
(`time.process_time`, receiver thread included) is reported too: on a small machine the
generator competes with the broker for the same cores.

Prints one JSON line, then one human line.

    .venv/bin/python benchmarks/stomppy_load.py --port 61613 --producers 8 --count 20000
    .venv/bin/python benchmarks/stomppy_load.py --port 61613 --producers 1 --count 40000 \\
        --rate 2000 --consumers 1
    .venv/bin/python benchmarks/stomppy_load.py --port 61614 --login guest --passcode guest ...

Stdlib and stomp.py only.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import queue
import sys
import threading
import time
import uuid
from multiprocessing.synchronize import Event as EventType
from pathlib import Path
from typing import Any

import stomp

_NS_PER_US = 1000
_NS_PER_S = 1_000_000_000
_CLOCK_TICKS_PER_S = os.sysconf("SC_CLK_TCK")
# A send this much behind its timetable counts as late.
_LATE_NS = 1_000_000
_START_LEAD_NS = 20_000_000
_POLL_S = 0.05


class LoadError(Exception):
    """A producer or consumer failed; the message says why."""


class _Receipts(stomp.ConnectionListener):  # type: ignore[misc]
    """The RECEIPTs a producer waits for: up to `--window` unanswered at once, each timed from its
    send to its arrival on stomp.py's receiver thread; wakes the producer's thread when one arrives
    (or the link fails)."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.outstanding: dict[str, int] = {}
        self.arrived_us: list[int] = []
        self.last_ns = 0
        self.error: str | None = None

    def sent(self, receipt_id: str, sent_ns: int) -> None:
        with self.cond:
            self.outstanding[receipt_id] = sent_ns

    def wait_below(self, window: int, timeout_s: float) -> None:
        """Return once fewer than `window` receipts are unanswered."""
        with self.cond:
            if not self.cond.wait_for(
                lambda: len(self.outstanding) < window or self.error is not None, timeout_s
            ):
                raise LoadError(f"no RECEIPT for {sorted(self.outstanding)[:3]} in {timeout_s:g} s")
            if self.error is not None:
                raise LoadError(self.error)

    def on_receipt(self, frame: Any) -> None:
        now = time.monotonic_ns()
        with self.cond:
            sent_ns = self.outstanding.pop(frame.headers.get("receipt-id", ""), None)
            if sent_ns is not None:
                self.arrived_us.append((now - sent_ns) // _NS_PER_US)
                self.last_ns = now
                self.cond.notify_all()

    def on_error(self, frame: Any) -> None:
        with self.cond:
            message = frame.headers.get("message", "")
            self.error = f"broker sent ERROR: {message} {frame.body!r:.200}"
            self.cond.notify_all()

    def on_disconnected(self) -> None:
        with self.cond:
            self.error = self.error or "disconnected by the broker"
            self.cond.notify_all()


def _connect(options: dict[str, Any], listener: stomp.ConnectionListener) -> stomp.Connection12:
    conn = stomp.Connection12(
        [(options["host"], options["port"])],
        vhost=options["host_header"],
        heartbeats=(0, 0),
        reconnect_attempts_max=1,
    )
    conn.set_listener("load", listener)
    conn.connect(options["login"], options["passcode"], wait=True)
    return conn


def _body(producer: int, seq: int, size: int) -> bytes:
    head = b"%08d:%012d:" % (producer, seq)
    return head + b"x" * (size - len(head))


def _producer_main(
    index: int,
    options: dict[str, Any],
    start: EventType,
    origin_ns: Any,
    results: Any,
) -> None:
    """One producer process: connect, warm up, wait for `start`, send, report."""
    listener = _Receipts()
    outcome: dict[str, Any] = {"role": "producer", "index": index, "event": "result"}
    conn = None
    try:
        conn = _connect(options, listener)
        headers = {"persistent": "true"} if options["persistent"] else {}
        destination = options["destination"]
        size = options["size"]
        timeout_s = options["timeout_s"]
        tag = f"p{index}-"

        every, window = options["receipt_every"], options["window"]

        def send(seq: int, last: bool) -> int | None:
            """Send one message; with a receipt every `every` (and the last), then wait until
            fewer than `window` are unanswered. The send-to-receipt time as the producer's thread
            sees it when the window is 1, else None (the receiver thread timed it)."""
            sent_ns = time.monotonic_ns()
            if (seq + 1) % every and not last:
                conn.send(destination, _body(index, seq, size), headers=headers)
                return None
            receipt_id = tag + str(seq)
            listener.sent(receipt_id, sent_ns)
            conn.send(destination, _body(index, seq, size), headers=headers, receipt=receipt_id)
            listener.wait_below(window, timeout_s)
            return (time.monotonic_ns() - sent_ns) // _NS_PER_US if window == 1 else None

        warmup, count = options["warmups"][index], options["counts"][index]
        for seq in range(warmup):
            send(seq, seq == warmup - 1)
        listener.wait_below(1, timeout_s)
        listener.arrived_us.clear()
        results.put({"role": "producer", "index": index, "event": "ready"})
        if not start.wait(timeout_s):
            raise LoadError("no start signal")
        latencies: list[int] = []
        late = 0
        cpu_before = time.process_time()
        first_ns = 0
        rate = options["rate"] / options["producers"] if options["rate"] else 0.0
        origin = origin_ns.value
        for k in range(count):
            if rate:
                due_ns = origin + int((k + index / options["producers"]) / rate * _NS_PER_S)
                wait_ns = due_ns - time.monotonic_ns()
                if wait_ns > 0:
                    time.sleep(wait_ns / _NS_PER_S)
                elif -wait_ns > _LATE_NS:
                    late += 1
            if not first_ns:
                first_ns = time.monotonic_ns()
            waited_us = send(warmup + k, k == count - 1)
            if waited_us is not None:
                latencies.append(waited_us)
        listener.wait_below(1, timeout_s)
        last_ns = listener.last_ns
        if window > 1:
            latencies = list(listener.arrived_us)
        outcome.update(
            sent=count,
            first_send_ns=first_ns,
            last_receipt_ns=last_ns,
            latencies_us=latencies,
            late_sends=late,
            cpu_s=time.process_time() - cpu_before,
        )
    except Exception as exc:  # the process's boundary: report it, never hang the coordinator
        outcome["error"] = f"producer {index}: {type(exc).__name__}: {exc}"
    finally:
        results.put(outcome)
        if conn is not None and conn.is_connected():
            conn.disconnect()


class _Counter(stomp.ConnectionListener):  # type: ignore[misc]
    """Counts the messages a consumer receives, and those it receives twice; acknowledges them
    (`client`: cumulatively every `ack_every` messages and at the end; `client-individual`: each
    one)."""

    def __init__(self, conn_box: list[Any], ack: str, ack_every: int) -> None:
        self.conn_box = conn_box
        self.ack = ack
        self.ack_every = ack_every
        self.lock = threading.Lock()
        self.last_ack_id: str | None = None
        self.pending = 0
        self.seen: set[bytes] = set()
        self.received = 0
        self.duplicates = 0
        self.foreign = 0
        self.last_ns = 0
        self.subscribed = threading.Event()
        self.error: str | None = None

    def on_message(self, frame: Any) -> None:
        body = frame.body
        key = body[:22] if isinstance(body, bytes) else body[:22].encode()
        self.received += 1
        self.last_ns = time.monotonic_ns()
        if key.count(b":") != 2:
            self.foreign += 1
        elif key in self.seen:
            self.duplicates += 1
        else:
            self.seen.add(key)
        if self.ack == "client-individual":
            self.conn_box[0].ack(frame.headers["ack"])
        elif self.ack == "client":
            with self.lock:
                self.last_ack_id = frame.headers["ack"]
                self.pending += 1
                if self.pending >= self.ack_every:
                    self.flush()

    def flush(self) -> None:
        """Acknowledge up to the last message received (`client` mode; call with the lock)."""
        if self.pending and self.last_ack_id is not None:
            self.conn_box[0].ack(self.last_ack_id)
        self.pending = 0

    def on_receipt(self, frame: Any) -> None:
        if frame.headers.get("receipt-id") == "subscribed":
            self.subscribed.set()

    def on_error(self, frame: Any) -> None:
        self.error = f"broker sent ERROR: {frame.headers.get('message', '')}"
        self.subscribed.set()


def _consumer_main(
    index: int, options: dict[str, Any], producers_done: EventType, done_ns: Any, results: Any
) -> None:
    """One consumer process: subscribe, count until everything arrived or nothing more does."""
    box: list[Any] = [None]
    counter = _Counter(box, options["consumer_ack"], options["ack_every"])
    outcome: dict[str, Any] = {"role": "consumer", "index": index, "event": "result"}
    conn = None
    try:
        conn = _connect(options, counter)
        box[0] = conn
        prefetch = str(options["prefetch"])
        conn.subscribe(
            options["destination"],
            id=f"c{index}",
            ack=options["consumer_ack"],
            headers={"activemq.prefetchSize": prefetch, "prefetch-count": prefetch},
            receipt="subscribed",
        )
        if not counter.subscribed.wait(options["timeout_s"]) or counter.error:
            raise LoadError(counter.error or "no RECEIPT for SUBSCRIBE")
        results.put({"role": "consumer", "index": index, "event": "ready"})
        expected = options["expected"]
        idle_s = options["idle_timeout_s"]
        deadline = time.monotonic() + options["timeout_s"]
        while len(counter.seen) < expected and time.monotonic() < deadline:
            if counter.error:
                raise LoadError(counter.error)
            if producers_done.is_set():
                idle_ns = time.monotonic_ns() - max(counter.last_ns, done_ns.value)
                if idle_ns > idle_s * _NS_PER_S:
                    break
            time.sleep(_POLL_S)
        with counter.lock:
            counter.flush()
        outcome.update(
            received=counter.received,
            unique=len(counter.seen),
            duplicates=counter.duplicates,
            foreign=counter.foreign,
            last_ns=counter.last_ns,
        )
    except Exception as exc:  # the process's boundary: report it, never hang the coordinator
        outcome["error"] = f"consumer {index}: {type(exc).__name__}: {exc}"
    finally:
        results.put(outcome)
        if conn is not None and conn.is_connected():
            conn.disconnect()


def _read_cpu_s(pid: int | None) -> float | None:
    if pid is None:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS_PER_S
    except (OSError, IndexError, ValueError):
        return None


def _percentile(sorted_values: list[int], p: float) -> float:
    """Nearest rank, in milliseconds (values in microseconds)."""
    if not sorted_values:
        return 0.0
    rank = max(1, math.ceil(p / 100 * len(sorted_values)))
    return sorted_values[rank - 1] / 1000


def _split(total: int, parts: int) -> list[int]:
    share, extra = divmod(total, parts)
    return [share + (1 if i < extra else 0) for i in range(parts)]


class _Run:
    """The coordinating process: starts the others, waits for them with deadlines."""

    def __init__(self, options: dict[str, Any]) -> None:
        self.options = options
        self.context = multiprocessing.get_context("spawn")
        self.results: Any = self.context.Queue()
        self.start = self.context.Event()
        self.producers_done = self.context.Event()
        self.origin_ns = self.context.Value("q", 0)
        self.done_ns = self.context.Value("q", 0)
        self.processes: list[Any] = []
        self.deadline = time.monotonic() + options["timeout_s"] * 2
        self.messages: list[dict[str, Any]] = []

    def spawn(self, target: Any, *args: Any) -> None:
        process = self.context.Process(target=target, args=args, daemon=True)
        process.start()
        self.processes.append(process)

    def collect(self, role: str, event: str, count: int) -> list[dict[str, Any]]:
        """Wait for `count` messages `event` of `role`; an error ends the run."""
        found = [m for m in self.messages if m["role"] == role and m["event"] == event]
        self.messages = [m for m in self.messages if m not in found]
        while len(found) < count:
            remaining = self.deadline - time.monotonic()
            if remaining <= 0:
                raise LoadError(f"timed out waiting for {count} {role}(s) to report {event}")
            try:
                message = self.results.get(timeout=min(remaining, 1.0))
            except queue.Empty:
                if not any(p.is_alive() for p in self.processes):
                    raise LoadError(
                        f"every process ended before {role}s reported {event}"
                    ) from None
                continue
            if message.get("error"):
                raise LoadError(message["error"])
            if message["role"] == role and message["event"] == event:
                found.append(message)
            else:
                self.messages.append(message)
        return found

    def stop(self) -> None:
        for process in self.processes:
            process.join(5)
            if process.is_alive():
                process.terminate()
                process.join(5)


def run(options: dict[str, Any]) -> dict[str, Any]:
    """One run; the results as a JSON-safe dict."""
    producers, consumers = options["producers"], options["consumers"]
    options["counts"] = _split(options["count"], producers)
    options["warmups"] = [options["warmup"]] * producers
    options["expected"] = options["count"] + options["warmup"] * producers
    load = _Run(options)
    try:
        for i in range(consumers):
            load.spawn(_consumer_main, i, options, load.producers_done, load.done_ns, load.results)
        load.collect("consumer", "ready", consumers)
        for i in range(producers):
            load.spawn(_producer_main, i, options, load.start, load.origin_ns, load.results)
        load.collect("producer", "ready", producers)
        broker_cpu_before = _read_cpu_s(options["broker_pid"])
        load.origin_ns.value = time.monotonic_ns() + _START_LEAD_NS
        load.start.set()
        done = load.collect("producer", "result", producers)
        broker_cpu_after = _read_cpu_s(options["broker_pid"])
        load.done_ns.value = time.monotonic_ns()
        load.producers_done.set()
        counted = load.collect("consumer", "result", consumers) if consumers else []
    finally:
        load.producers_done.set()
        load.start.set()
        load.stop()
    return _summary(options, done, counted, broker_cpu_before, broker_cpu_after)


def _summary(
    options: dict[str, Any],
    producers: list[dict[str, Any]],
    consumers: list[dict[str, Any]],
    cpu_before: float | None,
    cpu_after: float | None,
) -> dict[str, Any]:
    latencies = sorted(v for p in producers for v in p["latencies_us"])
    sent = sum(p["sent"] for p in producers)
    first = min(p["first_send_ns"] for p in producers)
    last = max(p["last_receipt_ns"] for p in producers)
    elapsed_s = (last - first) / _NS_PER_S if last > first else 0.0
    summary: dict[str, Any] = {
        "tool": "stomppy_load",
        "stomp_py": stomp.__version__ if hasattr(stomp, "__version__") else None,
        "broker": f"{options['host']}:{options['port']}",
        "destination": options["destination"],
        "producers": options["producers"],
        "consumers": options["consumers"],
        "size_bytes": options["size"],
        "persistent": options["persistent"],
        "rate_per_s": options["rate"] or None,
        "receipt_every": options["receipt_every"],
        "window": options["window"],
        "warmup_per_producer": options["warmup"],
        "messages": sent,
        "elapsed_s": round(elapsed_s, 6),
        "messages_per_s": round(sent / elapsed_s, 1) if elapsed_s else 0.0,
        "per_producer_msg_s": [
            round(p["sent"] / ((p["last_receipt_ns"] - p["first_send_ns"]) / _NS_PER_S), 1)
            for p in sorted(producers, key=lambda p: p["index"])
            if p["last_receipt_ns"] > p["first_send_ns"]
        ],
        "receipt_latency_ms": {
            "count": len(latencies),
            "p50": _percentile(latencies, 50),
            "p90": _percentile(latencies, 90),
            "p99": _percentile(latencies, 99),
            "p99_9": _percentile(latencies, 99.9),
            "max": latencies[-1] / 1000 if latencies else 0.0,
            "mean": round(sum(latencies) / len(latencies) / 1000, 3) if latencies else 0.0,
        },
        "late_sends": sum(p["late_sends"] for p in producers),
        "generator_cpu_s": round(sum(p["cpu_s"] for p in producers), 3),
        "loadavg": [round(x, 2) for x in os.getloadavg()],
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    if cpu_before is not None and cpu_after is not None and sent:
        summary["broker_cpu_us_per_msg"] = round((cpu_after - cpu_before) / sent * 1e6, 1)
    if consumers:
        unique = sum(c["unique"] for c in consumers)
        duplicates = sum(c["duplicates"] for c in consumers)
        summary["consumed"] = {
            "expected": options["expected"],
            "unique": unique,
            "duplicates": duplicates,
            "foreign": sum(c["foreign"] for c in consumers),
        }
        summary["ok"] = unique == options["expected"] and not duplicates
        last_delivery = max(c["last_ns"] for c in consumers)
        if last_delivery > first:
            # As `sluice bench throughput` counts: from the first measured send to the last
            # message any consumer received.
            summary["delivered_per_s"] = round(sent / ((last_delivery - first) / _NS_PER_S), 1)
    else:
        summary["ok"] = sent == options["count"]
    return summary


def human(summary: dict[str, Any]) -> str:
    """The one-line report."""
    lat = summary["receipt_latency_ms"]
    kind = "persistent" if summary["persistent"] else "non-persistent"
    rate = f" at {summary['rate_per_s']:g} msg/s" if summary["rate_per_s"] else ""
    line = (
        f"stomppy_load: {summary['producers']} producer process(es), {summary['messages']} x "
        f"{summary['size_bytes']} B {kind} sync sends{rate} to {summary['broker']}: "
        f"{summary['messages_per_s']:,.0f} msg/s in {summary['elapsed_s']:.3f} s; "
        f"send->receipt ms p50 {lat['p50']:.3f} p90 {lat['p90']:.3f} p99 {lat['p99']:.3f} "
        f"max {lat['max']:.3f}"
    )
    if summary["late_sends"]:
        line += f"; {summary['late_sends']} sends more than 1 ms late"
    if "broker_cpu_us_per_msg" in summary:
        line += f"; broker CPU {summary['broker_cpu_us_per_msg']:.1f} us/msg"
    line += f"; generator CPU {summary['generator_cpu_s']:.2f} s"
    consumed = summary.get("consumed")
    if consumed:
        line += (
            f"; consumers got {consumed['unique']} of {consumed['expected']}, "
            f"{consumed['duplicates']} twice"
        )
    return line


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=61613)
    p.add_argument("--login", default=None)
    p.add_argument("--passcode", default=None)
    p.add_argument(
        "--host-header",
        default=None,
        help="CONNECT host header (RabbitMQ: the virtual host); default: stomp.py's (the host)",
    )
    p.add_argument("--producers", type=int, default=1, help="producer processes")
    p.add_argument("--consumers", type=int, default=0, help="consumer processes")
    p.add_argument("--count", type=int, default=10_000, help="measured messages, in total")
    p.add_argument("--warmup", type=int, default=50, help="unmeasured messages per producer")
    p.add_argument("--size", type=int, default=256, help="body bytes (at least 22)")
    p.add_argument("--non-persistent", action="store_true", help="send without persistent:true")
    p.add_argument(
        "--receipt-every", type=int, default=1, help="a RECEIPT on every Nth send (and the last)"
    )
    p.add_argument("--window", type=int, default=1, help="unanswered receipts a producer allows")
    p.add_argument("--rate", type=float, default=0.0, help="messages per second in total")
    p.add_argument("--destination", default=None, help="default /queue/stomppy.<random>")
    p.add_argument(
        "--consumer-ack", choices=("auto", "client", "client-individual"), default="client"
    )
    p.add_argument("--ack-every", type=int, default=500, help="client mode: messages per ACK")
    p.add_argument("--prefetch", type=int, default=1000)
    p.add_argument("--broker-pid", type=int, default=None, help="read its CPU time from /proc")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds for each wait")
    p.add_argument("--idle-timeout", type=float, default=10.0, help="consumers' patience")
    p.add_argument("--json", type=Path, default=None, help="also write the JSON line here")
    args = p.parse_args(argv)
    if args.producers < 1 or args.count < args.producers or args.size < 22:
        p.error("need --producers >= 1, --count >= --producers and --size >= 22")
    if args.receipt_every < 1 or args.window < 1:
        p.error("need --receipt-every >= 1 and --window >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    options = {
        "host": args.host,
        "port": args.port,
        "login": args.login,
        "passcode": args.passcode,
        "host_header": args.host_header,
        "producers": args.producers,
        "consumers": args.consumers,
        "count": args.count,
        "warmup": args.warmup,
        "size": args.size,
        "persistent": not args.non_persistent,
        "rate": args.rate,
        "receipt_every": args.receipt_every,
        "window": args.window,
        "destination": args.destination or f"/queue/stomppy.{uuid.uuid4().hex[:12]}",
        "consumer_ack": args.consumer_ack,
        "ack_every": max(1, min(args.ack_every, args.prefetch)),
        "prefetch": args.prefetch,
        "broker_pid": args.broker_pid,
        "timeout_s": args.timeout,
        "idle_timeout_s": args.idle_timeout,
    }
    try:
        summary = run(options)
    except LoadError as exc:
        print(f"stomppy_load: {exc}", file=sys.stderr)
        return 1
    summary["command"] = " ".join(
        ["stomppy_load.py", *(argv if argv is not None else sys.argv[1:])]
    )
    line = json.dumps(summary)
    print(line)
    print(human(summary), flush=True)
    if args.json is not None:
        args.json.write_text(line + "\n")
    if not summary["ok"]:
        print("stomppy_load: not every message arrived exactly once", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
