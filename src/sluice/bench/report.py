"""Turning worker results into the numbers a run reports, as text and as JSON.

Throughput is measured messages received divided by the time from the first measured send to the
last measured receive, across all processes (`time.monotonic_ns` is one clock machine-wide).
Latencies are in milliseconds. CPU figures (`cpu`) are per window: `measured` (the measured
messages) and `run` (everything from the first worker to `stop`), each with its wall time, the
broker's CPU seconds, utilisation and microseconds per message (given `--broker-pid`), and the
same for the load generator's processes, each by name and summed.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from sluice import __version__
from sluice.bench.procstat import CpuMeter
from sluice.bench.runner import ClientsOutcome, ClientsPlan
from sluice.bench.stats import LatencyHistogram, SeenTracker, Verification, verify

__all__ = [
    "cpu_report",
    "format_clients",
    "format_cpu",
    "format_latency",
    "latency_summary",
    "merge_histograms",
    "summarize_clients",
    "write_json",
]

_PERCENTILES = (("p50", 50.0), ("p90", 90.0), ("p99", 99.0), ("p99_9", 99.9))
_US_PER_MS = 1000.0
_NS_PER_S = 1e9
_BYTES_PER_MB = 1e6


def merge_histograms(items: Iterable[dict[str, Any]]) -> LatencyHistogram:
    """One histogram from the `to_dict` forms of many."""
    merged = LatencyHistogram()
    for item in items:
        merged.merge(LatencyHistogram.from_dict(item))
    return merged


def latency_summary(histogram: LatencyHistogram) -> dict[str, Any]:
    """Percentiles, mean and maximum in milliseconds (values were recorded in microseconds)."""
    summary: dict[str, Any] = {"count": histogram.total}
    for name, p in _PERCENTILES:
        summary[name] = round(histogram.percentile(p) / _US_PER_MS, 3)
    summary["max"] = round(histogram.max_value / _US_PER_MS, 3)
    summary["mean"] = round(histogram.mean / _US_PER_MS, 3)
    return summary


def format_latency(label: str, summary: dict[str, Any]) -> str:
    """One line of latency percentiles."""
    if not summary.get("count"):
        return f"{label}: no samples"
    return (
        f"{label} ms: p50 {summary['p50']:.3f}  p90 {summary['p90']:.3f}  "
        f"p99 {summary['p99']:.3f}  p99.9 {summary['p99_9']:.3f}  max {summary['max']:.3f}  "
        f"(mean {summary['mean']:.3f}, n={summary['count']})"
    )


def _merge_trackers(trackers: list[SeenTracker], per_producer: list[int]) -> SeenTracker:
    """One tracker of what several checks drained (a message found twice is a duplicate)."""
    if len(trackers) == 1:
        return trackers[0]
    merged = SeenTracker(per_producer)
    for tracker in trackers:
        for producer, marks in enumerate(tracker.seen):
            mine = merged.seen[producer]
            both = int.from_bytes(mine, "little") & int.from_bytes(marks, "little")
            merged.duplicates += both.bit_count()
            merged.seen[producer] = bytearray(a | b for a, b in zip(mine, marks, strict=True))
        merged.duplicates += tracker.duplicates
        merged.unexpected += tracker.unexpected
        merged.corrupt += tracker.corrupt
    return merged


def _verification(plan: ClientsPlan, outcome: ClientsOutcome) -> Verification:
    per_producer = [0] * len(plan.producers)
    for spec in plan.producers:
        per_producer[spec.producer_id] = spec.warmup + spec.count
    trackers = [SeenTracker.from_dict(c["tracker"]) for c in outcome.consumers]
    missing_consumers = len(plan.consumers) - len(trackers)
    if missing_consumers > 0:
        # A consumer that returned nothing counts as having received nothing.
        trackers += [SeenTracker(per_producer) for _ in range(missing_consumers)]
    # A producer that reported nothing is taken to have sent everything.
    sent = list(per_producer)
    for producer in outcome.producers:
        sent[int(producer["producer_id"])] = int(producer["sent"])
    leftover = None
    check_failure = None
    if outcome.checks is not None:
        drained = [SeenTracker.from_dict(c["tracker"]) for c in outcome.checks if "tracker" in c]
        leftover = _merge_trackers(drained, per_producer) if drained else None
        check_failure = next((c["failure"] for c in outcome.checks if c.get("failure")), None)
    result = verify(
        trackers,
        per_producer,
        every_consumer=plan.every_consumer,
        sent=sent,
        leftover=leftover,
    )
    if not plan.every_consumer:
        # An end marker that reached two consumers of a queue was delivered twice.
        markers = [c.get("markers", []) for c in outcome.consumers]
        extra = sum(len(m) for m in markers) - len(set().union(*map(set, markers)))
        result.duplicates += extra
        result.late_duplicates += extra
    if outcome.checks is not None:
        result.queue_checked = check_failure is None
        result.check_failure = check_failure
    return result


def cpu_report(
    meter: CpuMeter, broker_pid: int | None, generator: dict[str, int], messages: int
) -> dict[str, Any] | None:
    """The figures of one window (see `CpuMeter.report`), None if it was not measured."""
    return meter.report(broker_pid, generator, messages) if meter.stopped else None


def _cpu_line(who: str, figures: dict[str, Any]) -> str:
    line = f"{who}: {figures['cpu_s']:.2f} s"
    if figures.get("utilization") is not None:
        line += f", {figures['utilization'] * 100:.0f}% of one core"
    if figures.get("us_per_msg") is not None:
        line += f", {figures['us_per_msg']:.1f} us per message"
    return line


def format_cpu(label: str, window: dict[str, Any] | None) -> list[str]:
    """Lines on the broker's and the generator's CPU use in one window."""
    if window is None:
        return [f"CPU ({label}): not measured"]
    lines = []
    broker = window.get("broker")
    if broker is not None:
        lines.append(_cpu_line(f"broker CPU ({label}, {window['wall_s']:.2f} s)", broker))
    generator = window["generator"]
    if generator["cpu_s"] is not None:
        count = len(generator["processes"])
        lines.append(_cpu_line(f"generator CPU ({label}, {count} processes)", generator))
    return lines


def _failures(outcome: ClientsOutcome, verification: Verification) -> list[str]:
    """Why a run failed, if it did: the reason it was cut short or its first error, and what
    the verification found (unless the run was cut short before anything arrived)."""
    failures = []
    if outcome.reason:
        failures.append(outcome.reason)
    elif outcome.errors:
        failures.append(outcome.errors[0])
    if not verification.ok and (verification.received or not outcome.reason):
        failures.append(_verification_line(verification))
    return failures


def summarize_clients(
    scenario: str, plan: ClientsPlan, outcome: ClientsOutcome, size: int
) -> dict[str, Any]:
    """The results of a throughput, sync or latency run, JSON-safe."""
    verification = _verification(plan, outcome)
    measured = sum(int(c["measured"]) for c in outcome.consumers)
    first_send = min(
        (int(p["first_send_ns"]) for p in outcome.producers if p["first_send_ns"]), default=0
    )
    last_receive = max((int(c["last_ns"]) for c in outcome.consumers), default=0)
    last_receipt = max((int(p["last_receipt_ns"]) for p in outcome.producers), default=0)
    sent = sum(int(p["sent"]) for p in outcome.producers) - sum(s.warmup for s in plan.producers)
    elapsed_s = (last_receive - first_send) / _NS_PER_S if first_send and last_receive else 0.0
    send_s = (last_receipt - first_send) / _NS_PER_S if first_send and last_receipt else 0.0
    results: dict[str, Any] = {
        "scenario": scenario,
        "messages": measured,
        "size_bytes": size,
        "elapsed_s": round(elapsed_s, 6),
        "messages_per_s": round(measured / elapsed_s, 1) if elapsed_s > 0 else 0.0,
        "mb_per_s": round(measured * size / elapsed_s / _BYTES_PER_MB, 3) if elapsed_s > 0 else 0.0,
        "sent": max(sent, 0),
        "send_elapsed_s": round(send_s, 6),
        "sends_per_s": round(max(sent, 0) / send_s, 1) if send_s > 0 else 0.0,
        "latency_ms": latency_summary(merge_histograms(c["latency"] for c in outcome.consumers)),
        "receipt_latency_ms": latency_summary(
            merge_histograms(p["receipt_latency"] for p in outcome.producers)
        ),
        "verification": verification.to_dict(),
        "receipt_every": plan.producers[0].receipt_every if plan.producers else None,
        "max_receipts": plan.producers[0].max_receipts if plan.producers else None,
        "drain_grace_s": plan.drain_grace_s,
        "queue_checks": outcome.checks,
        # Arrived after the consumers' last ACK: left to the broker, found by the queue check.
        "unacknowledged_at_stop": sum(int(c.get("unacknowledged", 0)) for c in outcome.consumers),
        "processes": {"consumers": outcome.processes[0], "producers": outcome.processes[1]},
        "process_per_producer": plan.process_per_producer,
        "rate_per_s": sum(p.rate_per_s for p in plan.producers),
        "late_sends": sum(int(p.get("late_sends", 0)) for p in outcome.producers),
        "cpu": {
            "measured": cpu_report(
                outcome.measured_cpu, plan.broker_pid, outcome.generator_pids, measured
            ),
            "run": cpu_report(
                outcome.run_cpu,
                plan.broker_pid,
                outcome.generator_pids,
                verification.received,
            ),
        },
        "errors": outcome.errors,
        "reason": outcome.reason,
    }
    send_latency = merge_histograms(c["send_latency"] for c in outcome.consumers)
    if send_latency.total:
        results["send_latency_ms"] = latency_summary(send_latency)
    failures = _failures(outcome, verification)
    results["ok"] = not failures
    results["failure"] = "; ".join(failures) if failures else None
    return results


def _verification_line(v: Verification) -> str:
    line = (
        f"verification FAILED: {v.received} of {v.expected} received, {v.missing} missing, "
        f"{v.duplicates} duplicates ({v.late_duplicates} late), {v.unexpected} unexpected, "
        f"{v.corrupt} corrupt"
    )
    if v.left_queued:
        line += f", {v.left_queued} left in the queue"
    if v.unsent:
        line += f", {v.unsent} never sent"
    if v.check_failure:
        line += f"; {v.check_failure}"
    if v.missing_examples:
        first = sorted(v.missing_examples.items())[:3]
        line += "; missing e.g. " + ", ".join(f"producer {p}: {seqs[:5]}" for p, seqs in first)
    return line


def format_clients(results: dict[str, Any]) -> list[str]:
    """The human-readable report of a throughput, sync or latency run."""
    received = (
        f"received {results['messages']} messages of {results['size_bytes']} bytes "
        f"in {results['elapsed_s']:.3f} s: {results['messages_per_s']:,.0f} msg/s, "
        f"{results['mb_per_s']:.2f} MB/s"
    )
    sent = (
        f"sent {results['sent']} messages in {results['send_elapsed_s']:.3f} s from the first "
        f"send to the last receipt: {results['sends_per_s']:,.0f} msg/s"
    )
    # What a synchronous publisher sees comes first in its own scenario.
    lines = [sent, received] if results["scenario"] == "sync" else [received, sent]
    lines.append(format_latency("end-to-end latency", results["latency_ms"]))
    if "send_latency_ms" in results:
        lines.append(format_latency("latency from actual send", results["send_latency_ms"]))
    lines.append(format_latency("receipt latency", results["receipt_latency_ms"]))
    v = results["verification"]
    if v["ok"]:
        after = f", then {results['drain_grace_s']:g} s more received nothing twice"
        if v.get("queue_checked"):
            after += ", and the queue was empty afterwards"
        lines.append(f"verified: all {v['expected']} messages arrived exactly once{after}")
    else:
        lines.append(_verification_line(Verification.from_dict(v)))
    if v.get("reordered"):
        lines.append(f"{v['reordered']} messages arrived after a later one of the same producer")
    lines.append(
        f"receipts: one per {results['receipt_every']} message(s), "
        f"at most {results['max_receipts']} unanswered per producer"
    )
    if results.get("rate_per_s"):
        lines.append(
            f"timetable: {results['rate_per_s']:g} msg/s in all, "
            f"{results['late_sends']} send(s) more than 1 ms late"
        )
    lines += format_cpu("measured", results["cpu"]["measured"])
    for error in results["errors"][:5]:
        lines.append(f"error: {error}")
    return lines


def write_json(path: Path, scenario: str, options: dict[str, Any], results: dict[str, Any]) -> None:
    """Write one run's options and results, with the command line and the machine, as JSON."""
    document = {
        "tool": f"sluice bench {__version__}",
        # The command line, when this process was started as `sluice bench ...`.
        "command": " ".join(["sluice", *sys.argv[1:]]) if "bench" in sys.argv[1:3] else None,
        "scenario": scenario,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
        "options": options,
        "results": results,
    }
    path.write_text(json.dumps(document, indent=2, sort_keys=False) + "\n")
