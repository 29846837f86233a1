"""`sluice bench`: its arguments, the plan they make for `sluice.bench`, the report it prints.

    sluice bench throughput --producers P --consumers C --size BYTES --count N [--persistent]
    sluice bench sync --producers P --size BYTES --count N [--persistent] [--rate R]
    sluice bench latency --rate R --duration S --size BYTES
    sluice bench connections --connections N --duration S --rate-per-connection R [--broker-pid PID]

Every scenario takes `--broker HOST:PORT --login --passcode --host-header` (the CONNECT `host`
header, RabbitMQ's virtual host), `--tls --ca FILE --cert FILE --key FILE` (a TLS listener),
`--json FILE`, `--warmup N`, `--timeout S`, `--processes`, `--drain-grace S` and
`--broker-pid PID` (to read the broker's CPU time and memory from /proc).
`throughput` and `sync` take `--process-per-producer` (the default of `sync`, where each producer
is a synchronous publisher in a process of its own, as an application's would be) or
`--no-process-per-producer` (producers share worker processes and their event loops).
Exit codes (`ExitCode`): 0 when the run completed and every message arrived exactly once, 1
otherwise (with a one-line reason on stderr), 2 for a usage error.
"""

from __future__ import annotations

import argparse
import logging
import secrets
import sys
import time
from pathlib import Path
from typing import Any

from sluice.bench.connections import (
    DEFAULT_MARKER_TIMEOUT_S,
    ConnectionsPlan,
    format_connections,
    run_connections,
)
from sluice.bench.payload import HEAD_BYTES, HEAD_STRUCT
from sluice.bench.report import format_clients, summarize_clients, write_json
from sluice.bench.roles import ACK_MODES, ConsumerSpec, ProducerSpec, receipt_window
from sluice.bench.runner import ClientsPlan, run_clients
from sluice.cli.common import DEFAULT_BROKER, Runner, add_tls_args, tls_options
from sluice.cli.exitcodes import ExitCode

__all__ = ["add_parsers", "parse_broker", "run_bench", "split_count"]

DEFAULT_TIMEOUT_S = 300.0
DEFAULT_SIZE_BYTES = 1024
DEFAULT_DRAIN_GRACE_S = 1.0
# A connections run without --timeout ends this long after its hold time.
_CONNECTIONS_SETUP_SLACK_S = 300.0
_MAX_PORT = 65535


def parse_broker(value: str) -> tuple[str, int]:
    """HOST:PORT (of a comma-separated list, the first: a benchmark does not fail over)."""
    first = value.split(",", maxsplit=1)[0].strip()
    host, sep, port = first.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) <= _MAX_PORT:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {value!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


def _positive_int(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {value!r}") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"expected at least 1, got {number}")
    return number


def _count(value: str) -> int:
    return _positive_int(value) if value != "0" else 0


def _positive_float(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {value!r}") from None
    if not number > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {value!r}")
    return number


def _non_negative_float(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {value!r}") from None
    if not number >= 0:
        raise argparse.ArgumentTypeError(f"expected a number of at least 0, got {value!r}")
    return number


def _size(value: str) -> int:
    number = _positive_int(value)
    if number < HEAD_BYTES:
        raise argparse.ArgumentTypeError(f"messages need at least {HEAD_BYTES} bytes")
    return number


def _processes(value: str) -> int | None:
    if value == "auto":
        return None
    return _positive_int(value)


def _header(value: str) -> tuple[str, str]:
    name, sep, text = value.partition(":")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME:VALUE, got {value!r}")
    return name, text


def _destination(value: str) -> str:
    if not value.startswith(("/queue/", "/topic/")):
        raise argparse.ArgumentTypeError("the destination must start with /queue/ or /topic/")
    return value


def split_count(total: int, parts: int) -> list[int]:
    """Split `total` into `parts` shares that differ by at most one, larger ones first."""
    share, extra = divmod(total, parts)
    return [share + (1 if i < extra else 0) for i in range(parts)]


def _common(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("broker and run")
    g.add_argument(
        "--broker",
        type=parse_broker,
        default=DEFAULT_BROKER,
        help="HOST:PORT of the broker (default %(default)s)",
    )
    g.add_argument("--login", default=None)
    g.add_argument("--passcode", default=None)
    add_tls_args(p)
    g.add_argument(
        "--host-header",
        default="/",
        metavar="HOST",
        help="CONNECT host header; RabbitMQ reads it as the virtual host (default %(default)s)",
    )
    g.add_argument("--json", type=Path, metavar="FILE", help="also write the results as JSON")
    g.add_argument(
        "--warmup", type=_count, default=0, metavar="N", help="unmeasured messages first"
    )
    g.add_argument(
        "--timeout",
        type=_positive_float,
        default=None,
        metavar="S",
        help=f"end the run after S seconds, exit 1 (default {DEFAULT_TIMEOUT_S:g})",
    )
    g.add_argument(
        "--processes",
        type=_processes,
        default=None,
        metavar="auto|K",
        help="worker processes (default auto: one per client, up to the CPUs, at least 2; "
        "with --process-per-producer, one per producer and what is left for the consumers)",
    )
    g.add_argument("--connect-timeout", type=_positive_float, default=10.0, metavar="S")
    g.add_argument(
        "--drain-grace",
        type=_non_negative_float,
        default=DEFAULT_DRAIN_GRACE_S,
        metavar="S",
        help="after the last expected message and the end markers, go on receiving for S s "
        "to count late duplicates (default %(default)g)",
    )
    g.add_argument(
        "--broker-pid",
        type=_positive_int,
        default=None,
        metavar="PID",
        help="the broker's process: its CPU time (and for connections its memory) is read "
        "from /proc",
    )
    g.add_argument("--no-uvloop", action="store_true", help="use the default asyncio loop")


def _messaging(p: argparse.ArgumentParser, destination: str, *, count: int | None) -> None:
    g = p.add_argument_group("messages")
    g.add_argument("--size", type=_size, default=DEFAULT_SIZE_BYTES, help="body bytes")
    if count is not None:
        g.add_argument("--count", type=_positive_int, default=count, help="measured messages")
    g.add_argument("--persistent", action="store_true", help="send with persistent:true")
    g.add_argument(
        "--destination",
        type=_destination,
        default=destination,
        help="a unique suffix is added per run (default %(default)s)",
    )
    g.add_argument("--ack", choices=ACK_MODES, default="client", help="consumer ack mode")
    g.add_argument("--prefetch", type=_positive_int, default=1000, help="consumer credit")
    g.add_argument(
        "--ack-every", type=_positive_int, default=None, metavar="N", help="default prefetch/2"
    )
    g.add_argument(
        "--idle-timeout",
        type=_positive_float,
        default=10.0,
        metavar="S",
        help="give up on missing messages after S s without progress",
    )
    g.add_argument(
        "-H",
        "--send-header",
        type=_header,
        action="append",
        default=[],
        metavar="NAME:VALUE",
        help="extra SEND header",
    )
    g.add_argument(
        "--subscribe-header",
        type=_header,
        action="append",
        default=[],
        metavar="NAME:VALUE",
        help="extra SUBSCRIBE header",
    )


def _layout(p: argparse.ArgumentParser, *, per_producer: bool) -> None:
    p.add_argument(
        "--process-per-producer",
        action=argparse.BooleanOptionalAction,
        default=per_producer,
        help="run each producer in a worker process of its own (default: %(default)s); "
        "otherwise producers share processes (see --processes) and their event loops",
    )


def _flow(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--receipt-every",
        type=_positive_int,
        default=None,
        metavar="W",
        help="messages per receipt (default 100, fewer for large messages so that a window "
        "stays near 1 MiB)",
    )
    p.add_argument(
        "--max-receipts", type=_positive_int, default=8, metavar="K", help="unanswered windows"
    )


def add_parsers(sub: Any) -> dict[str, Runner]:
    """Add `bench` and its scenarios to the subcommand parsers; return its runner by name."""
    bench = sub.add_parser(
        "bench",
        help="load-test a STOMP broker",
        description="Load-test any STOMP 1.2 broker; every message is verified to arrive once.",
    )
    scenarios = bench.add_subparsers(dest="scenario", required=True)

    t = scenarios.add_parser("throughput", help="producers and consumers flat out")
    t.add_argument("--producers", type=_positive_int, default=1, help="producer connections")
    t.add_argument("--consumers", type=_positive_int, default=1, help="consumer connections")
    _messaging(t, "/queue/bench.throughput", count=100_000)
    _flow(t)
    _layout(t, per_producer=False)
    _common(t)

    s = scenarios.add_parser(
        "sync",
        help="each send waits for its receipt",
        description="Synchronous publishers: every SEND carries a receipt and the next SEND "
        "waits for it. Each producer runs in a process of its own unless "
        "--no-process-per-producer. Throughput is the measured sends over the time from the "
        "first measured send to the last receipt.",
    )
    s.add_argument("--producers", type=_positive_int, default=1, help="producer connections")
    s.add_argument("--consumers", type=_positive_int, default=1, help="consumers that drain")
    s.add_argument(
        "--rate",
        type=_non_negative_float,
        default=0.0,
        metavar="R",
        help="messages per second of all producers together, on a timetable (default 0: "
        "each sends as soon as its previous receipt arrived)",
    )
    _messaging(s, "/queue/bench.sync", count=10_000)
    _layout(s, per_producer=True)
    _common(s)

    lat = scenarios.add_parser("latency", help="one producer at a fixed rate, one consumer")
    lat.add_argument("--rate", type=_positive_float, default=1000.0, help="messages per second")
    lat.add_argument("--duration", type=_positive_float, default=10.0, help="seconds")
    _messaging(lat, "/queue/bench.latency", count=None)
    _flow(lat)
    _common(lat)

    c = scenarios.add_parser("connections", help="many connections held open at a low rate")
    _connections_args(c)
    _common(c)
    return {"bench": run_bench}


def _connections_args(p: argparse.ArgumentParser) -> None:
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
    p.add_argument(
        "--marker-timeout",
        type=float,
        default=DEFAULT_MARKER_TIMEOUT_S,
        metavar="S",
        help="how long to wait for every connection's end marker to come back "
        "(default %(default)g)",
    )


def new_run_id() -> str:
    """A suffix that makes this run's destination names unique."""
    return f"{time.strftime('%Y%m%d%H%M%S')}-{secrets.token_hex(3)}"


def _broker(args: argparse.Namespace) -> dict[str, Any]:
    host, port = args.broker
    return {
        "host": host,
        "port": port,
        "login": args.login,
        "passcode": args.passcode,
        "host_header": args.host_header,
        **tls_options(args),
    }


def _flow_control(args: argparse.Namespace) -> tuple[int, int]:
    """Messages per receipt and unanswered windows: one and one for `sync`."""
    if args.scenario == "sync":
        return 1, 1
    return receipt_window(args.size, args.receipt_every), args.max_receipts


def _clients_plan(args: argparse.Namespace, destination: str) -> ClientsPlan:
    if args.scenario == "latency":
        producers, consumers = 1, 1
        count = max(1, round(args.rate * args.duration))
        rate = args.rate
    else:
        producers, consumers = args.producers, args.consumers
        count = args.count
        rate = getattr(args, "rate", 0.0)
    receipt_every, max_receipts = _flow_control(args)
    counts = split_count(count, producers)
    warmups = split_count(args.warmup, producers)
    send_headers = dict(args.send_header)
    producer_specs = [
        ProducerSpec(
            producer_id=i,
            destination=destination,
            size=args.size,
            count=counts[i],
            warmup=warmups[i],
            persistent=args.persistent,
            receipt_every=receipt_every,
            max_receipts=max_receipts,
            # Each producer sends its share of the rate; their timetables interleave evenly.
            rate_per_s=rate / producers,
            start_offset_s=i / rate if rate else 0.0,
            headers=send_headers,
        )
        for i in range(producers)
    ]
    per_producer = [counts[i] + warmups[i] for i in range(producers)]
    ack_every = args.ack_every or max(1, args.prefetch // 2)
    consumer_specs = [
        ConsumerSpec(
            consumer_id=i,
            destination=destination,
            size=args.size,
            per_producer=per_producer,
            warmup=warmups,
            ack=args.ack,
            prefetch=args.prefetch,
            ack_every=min(ack_every, args.prefetch),
            headers=dict(args.subscribe_header),
        )
        for i in range(consumers)
    ]
    return ClientsPlan(
        broker=_broker(args),
        producers=producer_specs,
        consumers=consumer_specs,
        processes=args.processes,
        process_per_producer=getattr(args, "process_per_producer", False),
        every_consumer=destination.startswith("/topic/"),
        timeout_s=args.timeout or DEFAULT_TIMEOUT_S,
        idle_timeout_s=args.idle_timeout,
        connect_timeout_s=args.connect_timeout,
        drain_grace_s=args.drain_grace,
        broker_pid=args.broker_pid,
        uvloop=not args.no_uvloop,
        log_level=logging.getLogger().getEffectiveLevel(),
    )


def options_of(args: argparse.Namespace) -> dict[str, Any]:
    """The parsed options as JSON-safe values, without the passcode."""
    options: dict[str, Any] = {}
    for key, value in sorted(vars(args).items()):
        if key in ("passcode", "command", "verbose"):
            continue
        options[key] = str(value) if isinstance(value, Path) else value
    return options


def _describe(args: argparse.Namespace, destination: str, plan: ClientsPlan) -> str:
    persistence = "persistent" if args.persistent else "non-persistent"
    host, port = args.broker
    if args.scenario == "latency":
        who = f"1 producer at {args.rate:g} msg/s for {args.duration:g} s, 1 consumer"
    else:
        who = f"{args.producers} producer(s), {args.consumers} consumer(s)"
        if getattr(args, "rate", 0.0):
            who += f", {args.rate:g} msg/s in all"
    total = sum(p.count for p in plan.producers)
    return (
        f"sluice bench {args.scenario}: {who}, {total} x {args.size} B {persistence}, "
        f"ack={args.ack}, to {destination} on {host}:{port}"
    )


def _run_clients(args: argparse.Namespace) -> int:
    destination = f"{args.destination}.{new_run_id()}"
    plan = _clients_plan(args, destination)
    print(_describe(args, destination, plan), flush=True)
    outcome = run_clients(plan)
    results = summarize_clients(args.scenario, plan, outcome, args.size)
    results["destination"] = destination
    c_procs, p_procs = outcome.processes
    print(f"worker processes: {c_procs} for consumers, {p_procs} for producers")
    for line in format_clients(results):
        print(line)
    if args.json is not None:
        write_json(args.json, args.scenario, options_of(args), results)
    if not results["ok"]:
        print(f"sluice bench {args.scenario}: {results['failure']}", file=sys.stderr)
        return ExitCode.FAILURE
    return ExitCode.OK


def _connections_plan(args: argparse.Namespace) -> ConnectionsPlan:
    processes = ConnectionsPlan.processes_for(args.connections, args.per_process, args.processes)
    return ConnectionsPlan(
        broker=_broker(args),
        connections=args.connections,
        processes=processes,
        destination_prefix=f"/queue/bench.conn.{new_run_id()}",
        duration_s=args.duration,
        rate_per_connection=args.rate_per_connection,
        size=args.size,
        connect_concurrency=args.connect_concurrency,
        connect_timeout_s=args.connect_timeout,
        marker_timeout_s=args.marker_timeout,
        drain_grace_s=args.drain_grace,
        timeout_s=args.timeout or args.duration + _CONNECTIONS_SETUP_SLACK_S,
        broker_pid=args.broker_pid,
        uvloop=not args.no_uvloop,
    )


def _run_connections(args: argparse.Namespace) -> int:
    if args.connections < 1 or args.per_process < 1 or args.size < HEAD_STRUCT.size:
        print(
            "sluice bench connections: --connections and --per-process must be positive and "
            f"--size at least {HEAD_STRUCT.size}",
            file=sys.stderr,
        )
        return ExitCode.USAGE
    plan = _connections_plan(args)
    host, port = args.broker
    print(
        f"sluice bench connections: {plan.connections} connections to {host}:{port} in "
        f"{plan.processes} process(es), held {plan.duration_s:g} s, "
        f"{plan.rate_per_connection:g} msg/s each to {plan.destination_prefix}.<i>",
        flush=True,
    )
    summary = run_connections(plan)
    for line in format_connections(summary):
        print(line)
    if args.json is not None:
        write_json(args.json, "connections", options_of(args), summary)
    if not summary["ok"]:
        print(f"sluice bench connections: {summary['failure']}", file=sys.stderr)
        return ExitCode.FAILURE
    return ExitCode.OK


def run_bench(args: argparse.Namespace) -> int:
    """Run the scenario the arguments name; return the exit code."""
    if args.scenario == "connections":
        return _run_connections(args)
    return _run_clients(args)
