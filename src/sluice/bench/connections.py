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

import math
import os
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

from sluice.bench.limits import raise_open_files_limit
from sluice.bench.procstat import CpuMeter, read_rss_kib
from sluice.bench.report import (
    cpu_report,
    format_cpu,
    format_latency,
    latency_summary,
    merge_histograms,
)
from sluice.bench.runner import RunAborted, WorkerPool

__all__ = ["ConnectionsPlan", "format_connections", "run_connections"]

DEFAULT_MARKER_TIMEOUT_S = 30.0
# How long workers may take to disconnect their share after sending their results.
_DISCONNECT_GRACE_S = 60.0
# Time for results beyond the markers and the grace period.
_RESULT_SLACK_S = 15.0
_KIB = 1024


@dataclass(frozen=True)
class ConnectionsPlan:
    """Everything a connections run needs, decided before it starts."""

    # host, port, login, passcode, host_header: JSON-safe, as sent to the workers.
    broker: dict[str, Any]
    connections: int
    processes: int
    # Connection i uses `<destination_prefix>.<i>`.
    destination_prefix: str
    duration_s: float
    rate_per_connection: float
    size: int
    connect_concurrency: int
    connect_timeout_s: float
    marker_timeout_s: float
    drain_grace_s: float
    timeout_s: float
    broker_pid: int | None = None
    uvloop: bool = True

    @staticmethod
    def processes_for(connections: int, per_process: int, processes: int | None) -> int:
        """Worker processes: enough for `per_process` connections each, unless given."""
        if processes is not None:
            return max(1, min(processes, connections))
        return math.ceil(connections / per_process)

    def shares(self) -> list[int]:
        """Connections per worker process, differing by at most one."""
        share, extra = divmod(self.connections, self.processes)
        return [share + (1 if i < extra else 0) for i in range(self.processes)]

    def worker_spec(self) -> dict[str, Any]:
        """What every worker is told (each also gets its `first` connection and `count`)."""
        return {
            "kind": "connections",
            "broker": self.broker,
            "destination_prefix": self.destination_prefix,
            "size": self.size,
            "rate_per_connection": self.rate_per_connection,
            "connect_concurrency": self.connect_concurrency,
            "connect_timeout_s": self.connect_timeout_s,
            "marker_timeout_s": self.marker_timeout_s,
            "drain_grace_s": self.drain_grace_s,
            "uvloop": self.uvloop,
        }


class _Measured:
    """What the coordinator measures around the workers: time, CPU and the broker's memory."""

    def __init__(self, pool: WorkerPool, broker_pid: int | None) -> None:
        self.pool = pool
        self.broker_pid = broker_pid
        self.rss_before = read_rss_kib(broker_pid) if broker_pid is not None else None
        self.rss_established: int | None = None
        self.rss_peak: int | None = None
        self.connect_s = 0.0
        self.connect_cpu = CpuMeter()
        self.hold_cpu = CpuMeter()
        self.reason: str | None = None
        self.generator: dict[str, int] = {}

    def pids(self) -> list[int]:
        """The processes whose CPU time is read: the broker's, the workers' and our own."""
        own = [*self.pool.pids().values(), os.getpid()]
        return [self.broker_pid, *own] if self.broker_pid is not None else own


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


def _connect_and_hold(plan: ConnectionsPlan, measured: _Measured) -> None:
    """Start the workers, wait until every connection is up, then hold them for the duration."""
    pool = measured.pool
    first = 0
    started = time.monotonic()
    measured.connect_cpu.start(measured.pids())
    base = plan.worker_spec()
    for i, share in enumerate(plan.shares()):
        pool.start(f"connections-{i}", {**base, "first": first, "count": share})
        first += share
    pool.wait_for("connections", lambda: all("ready" in w.events for w in pool.workers))
    measured.connect_cpu.stop(measured.pids())
    measured.connect_s = time.monotonic() - started
    if plan.broker_pid is not None:
        measured.rss_established = read_rss_kib(plan.broker_pid)
    measured.hold_cpu.start(measured.pids())
    pool.broadcast("start")
    measured.rss_peak = _hold(pool, plan.duration_s, plan.broker_pid)
    measured.hold_cpu.stop(measured.pids())


def _summary(plan: ConnectionsPlan, measured: _Measured) -> dict[str, Any]:
    """What the workers and the coordinator measured, JSON-safe."""
    pool = measured.pool
    results = [w.result for w in pool.workers if w.result is not None]

    def total(key: str) -> int:
        return sum(int(r.get(key, 0)) for r in results)

    summary: dict[str, Any] = {
        "scenario": "connections",
        "connections": plan.connections,
        "processes": plan.processes,
        "connect_s": round(measured.connect_s, 3),
        "established": total("established"),
        "failed": total("failed"),
        "connect_errors": _merge_counts([r.get("connect_errors", {}) for r in results]),
        "held": total("held"),
        "lost": total("lost"),
        "lost_reasons": _merge_counts([r.get("lost_reasons", {}) for r in results]),
        "sent": total("sent"),
        "received": total("received"),
        "duplicates": total("duplicates"),
        "late_duplicates": total("late_duplicates"),
        "reordered": total("reordered"),
        "unexpected": total("unexpected"),
        "markers_missing": total("markers_missing"),
        "marker_timeout_s": plan.marker_timeout_s,
        "drain_grace_s": plan.drain_grace_s,
        "latency_ms": latency_summary(merge_histograms(r["latency"] for r in results)),
        "disconnect_s": _disconnect_s(pool),
        "errors": pool.errors(),
        "reason": measured.reason,
    }
    summary["missing"] = summary["sent"] - summary["received"]
    pid, generator = plan.broker_pid, measured.generator
    summary["cpu"] = {
        "connect": cpu_report(measured.connect_cpu, pid, generator, 0),
        "measured": cpu_report(measured.hold_cpu, pid, generator, summary["received"]),
    }
    if pid is not None:
        _add_broker_memory(summary, measured)
    return summary


def _add_broker_memory(summary: dict[str, Any], measured: _Measured) -> None:
    before, established = measured.rss_before, measured.rss_established
    summary["broker_rss_kib"] = {
        "before": before,
        "established": established,
        "peak_during_hold": measured.rss_peak,
    }
    if before is not None and established is not None and summary["established"]:
        per = (established - before) * _KIB / summary["established"]
        summary["broker_bytes_per_connection"] = round(per)


def _failures(plan: ConnectionsPlan, summary: dict[str, Any]) -> list[str]:
    """Why the run failed, if it did: each reason one short phrase."""
    reason = summary["reason"]
    failures = [reason] if reason else summary["errors"][:1]
    if summary["established"] < plan.connections:
        failures.append(f"{summary['established']} of {plan.connections} connections established")
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
            f"{plan.marker_timeout_s:g} s"
        )
    return failures


def run_connections(plan: ConnectionsPlan) -> dict[str, Any]:
    """Run the connections scenario; return its summary (JSON-safe, `ok` and `failure` set)."""
    raise_open_files_limit()
    pool = WorkerPool(time.monotonic() + plan.timeout_s)
    measured = _Measured(pool, plan.broker_pid)
    try:
        _connect_and_hold(plan, measured)
    except RunAborted as exc:
        measured.reason = str(exc)
    except KeyboardInterrupt:
        measured.reason = "interrupted"
    finally:
        measured.generator = {**pool.pids(), "coordinator": os.getpid()}
        pool.finish(
            grace_s=plan.marker_timeout_s + plan.drain_grace_s + _RESULT_SLACK_S,
            join_s=_DISCONNECT_GRACE_S,
        )
    summary = _summary(plan, measured)
    failures = _failures(plan, summary)
    summary["ok"] = not failures
    summary["failure"] = "; ".join(failures) if failures else None
    return summary


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
