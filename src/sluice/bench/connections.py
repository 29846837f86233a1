"""The connections scenario: many connections held open, each round-tripping a few messages.

Connection i subscribes to its own queue `/queue/bench.conn.<run>.<i>` (ack=auto, with a receipt)
and sends to it at `--rate-per-connection`; the run holds every connection for `--duration`
seconds and reports how many were established and held, messages round-tripped, and errors.
When the hold ends, each connection sends an end marker to its queue and the run waits for it to
come back (up to `--marker-timeout`), then `--drain-grace` more, before counting: a late message
is counted as delivered, a late duplicate as a duplicate (see `connections_worker`).
Connections are spread over worker processes (`--per-process`, 2,500 by default) whose open-files
limit is raised to the hard limit. With `--broker-pid` the broker's resident memory is read from
/proc before any connection, once all are established, and every second of the hold, to report
memory per connection, and its CPU time while connecting and while holding.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections import Counter
from typing import Any

from sluice.bench.payload import HEAD_STRUCT
from sluice.bench.procstat import CpuMeter, read_rss_kib
from sluice.bench.report import (
    cpu_report,
    format_cpu,
    format_latency,
    latency_summary,
    merge_histograms,
    write_json,
)
from sluice.bench.runner import RunAborted, WorkerPool
from sluice.bench.worker import raise_open_files_limit

__all__ = ["add_connections_parser", "read_rss_kib", "run_connections"]

_DEFAULT_MARKER_TIMEOUT_S = 30.0
# How long workers may take to disconnect their share after sending their results.
_DISCONNECT_GRACE_S = 60.0
# Time for results beyond the markers and the grace period.
_RESULT_SLACK_S = 15.0
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
    p.add_argument(
        "--marker-timeout",
        type=float,
        default=_DEFAULT_MARKER_TIMEOUT_S,
        metavar="S",
        help="how long to wait for every connection's end marker to come back "
        "(default %(default)g)",
    )


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
        "marker_timeout_s": args.marker_timeout,
        "drain_grace_s": args.drain_grace,
        "uvloop": not args.no_uvloop,
    }
    shares = [
        args.connections // processes + (1 if i < args.connections % processes else 0)
        for i in range(processes)
    ]
    reason: str | None = None
    rss_established = rss_peak = None
    connect_s = 0.0
    connect_cpu, hold_cpu = CpuMeter(), CpuMeter()

    def pids() -> list[int]:
        own = [*pool.pids().values(), os.getpid()]
        return [pid, *own] if pid is not None else own

    try:
        first = 0
        started = time.monotonic()
        connect_cpu.start(pids())
        for i, share in enumerate(shares):
            pool.start(f"connections-{i}", {**base, "first": first, "count": share})
            first += share
        pool.wait_for("connections", lambda: all("ready" in w.events for w in pool.workers))
        connect_cpu.stop(pids())
        connect_s = time.monotonic() - started
        if pid is not None:
            rss_established = read_rss_kib(pid)
        hold_cpu.start(pids())
        pool.broadcast("start")
        rss_peak = _hold(pool, args.duration, pid)
        hold_cpu.stop(pids())
    except RunAborted as exc:
        reason = str(exc)
    except KeyboardInterrupt:
        reason = "interrupted"
    finally:
        generator = {**pool.pids(), "coordinator": os.getpid()}
        pool.finish(
            grace_s=args.marker_timeout + args.drain_grace + _RESULT_SLACK_S,
            join_s=_DISCONNECT_GRACE_S,
        )
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
        "late_duplicates": sum(int(r.get("late_duplicates", 0)) for r in results),
        "reordered": sum(int(r.get("reordered", 0)) for r in results),
        "unexpected": sum(int(r.get("unexpected", 0)) for r in results),
        "markers_missing": sum(int(r.get("markers_missing", 0)) for r in results),
        "marker_timeout_s": args.marker_timeout,
        "drain_grace_s": args.drain_grace,
        "latency_ms": latency_summary(merge_histograms(r["latency"] for r in results)),
        "disconnect_s": _disconnect_s(pool),
        "errors": pool.errors(),
        "reason": reason,
    }
    summary["missing"] = summary["sent"] - summary["received"]
    summary["cpu"] = {
        "connect": cpu_report(connect_cpu, pid, generator, 0),
        "measured": cpu_report(hold_cpu, pid, generator, summary["received"]),
    }
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
            f"{summary['missing']} messages missing, {summary['duplicates']} duplicated "
            f"({summary['late_duplicates']} late), {summary['unexpected']} unexpected"
        )
    if summary["markers_missing"]:
        failures.append(
            f"{summary['markers_missing']} end markers did not come back within "
            f"{args.marker_timeout:g} s"
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
        f"({summary['duplicates']} duplicates, {summary['late_duplicates']} of them late; "
        f"{summary['reordered']} out of order; {summary['unexpected']} unexpected); "
        f"{summary['markers_missing']} end markers missing after "
        f"{summary['marker_timeout_s']:g} s, then {summary['drain_grace_s']:g} s drained",
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
    lines += format_cpu("connecting", summary["cpu"]["connect"])
    lines += format_cpu("held", summary["cpu"]["measured"])
    for error in summary["errors"][:5]:
        lines.append(f"error: {error}")
    return lines
