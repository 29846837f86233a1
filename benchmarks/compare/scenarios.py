"""The scenarios: their `sluice bench` arguments (full and quick), the numbers read, the targets.

Every scenario is one `sluice bench` run against one freshly started broker, given the broker's
pid so that it reads the broker's CPU time from /proc. The numbers are read from the `results`
object of the JSON that `sluice bench --json FILE` writes; a metric names its path there. The
first metric of a scenario is its primary one: the one its chart shows first and, when the
scenario has a ratio target, the one the ratio is taken of. Every scenario ends with the CPU
metrics of its measured window (for the connection scenarios, the hold): the broker's CPU
microseconds per message and its utilisation (CPU seconds per wall second, in % of one core), and
the load generator's utilisation, which says whether the generator rather than the broker was the
limit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

_X = "\u00d7"  # multiplication sign

__all__ = ["SCENARIOS", "Metric", "Scenario", "Target", "by_name", "metric_value"]


@dataclass(frozen=True)
class Metric:
    """One number of a scenario's results."""

    key: str
    label: str
    path: tuple[str, ...]
    higher_is_better: bool
    fmt: str  # a format() spec for the value after `scale`
    scale: float = 1.0
    # Counted from failed runs too (e.g. how many connections were held before it failed).
    from_failed_runs: bool = False
    # False for a figure that explains the others (CPU utilisation) rather than ranks brokers:
    # no best peer, no ratio.
    compared: bool = True


@dataclass(frozen=True)
class Target:
    """What Sluice must reach, as a ratio of its median to the best peer's median."""

    text: str
    metric: str
    min_ratio: float | None = None  # higher is better: ratio >= min_ratio
    max_ratio: float | None = None  # lower is better: ratio <= max_ratio
    # Instead of a ratio: every Sluice run completed (all connections held, all messages once).
    every_run_ok: bool = False


@dataclass(frozen=True)
class Scenario:
    """One benchmark scenario."""

    name: str
    title: str
    args: tuple[str, ...]
    quick_args: tuple[str, ...]
    timeout_s: float
    metrics: tuple[Metric, ...]
    chart: tuple[str, ...]  # metric keys drawn, each in its own panel
    summary: tuple[str, ...]  # metric keys in the summary table
    target: Target | None = None

    def bench_args(self, *, quick: bool) -> tuple[str, ...]:
        """The `sluice bench` arguments, without the broker address."""
        return self.quick_args if quick else self.args

    def metric(self, key: str) -> Metric:
        """The metric with this key."""
        for metric in self.metrics:
            if metric.key == key:
                return metric
        raise KeyError(f"{self.name} has no metric {key!r}")


def metric_value(results: dict[str, Any] | None, metric: Metric) -> float | None:
    """The metric's value in a `sluice bench` results object, None if absent."""
    value: Any = results
    for part in metric.path:
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) * metric.scale


_MSG_S = Metric("msg_s", "msg/s", ("messages_per_s",), True, ",.0f")
_MB_S = Metric("mb_s", "MB/s", ("mb_per_s",), True, ",.1f")
_SENDS_S = Metric("sends_s", "sends/s", ("sends_per_s",), True, ",.0f")
_E2E_P50 = Metric("p50_ms", "p50 ms", ("latency_ms", "p50"), False, ",.2f")
_E2E_P99 = Metric("p99_ms", "p99 ms", ("latency_ms", "p99"), False, ",.2f")
_E2E_MAX = Metric("max_ms", "max ms", ("latency_ms", "max"), False, ",.1f")
_RECEIPT_P50 = Metric(
    "receipt_p50_ms", "receipt p50 ms", ("receipt_latency_ms", "p50"), False, ",.2f"
)
_RECEIPT_P99 = Metric(
    "receipt_p99_ms", "receipt p99 ms", ("receipt_latency_ms", "p99"), False, ",.2f"
)
_HELD = Metric("held", "held", ("held",), True, ",.0f", from_failed_runs=True)
_PER_CONN = Metric(
    "kib_per_conn", "KiB/conn", ("broker_bytes_per_connection",), False, ",.1f", 1 / 1024
)
_RSS_PEAK = Metric(
    "rss_peak_mib", "peak RSS MiB", ("broker_rss_kib", "peak_during_hold"), False, ",.0f", 1 / 1024
)
_CONNECT_S = Metric("connect_s", "connect s", ("connect_s",), False, ",.1f")
_RTT_P99 = Metric("rtt_p99_ms", "round trip p99 ms", ("latency_ms", "p99"), False, ",.1f")
_BROKER_CPU_US = Metric(
    "broker_cpu_us", "broker CPU µs/msg", ("cpu", "measured", "broker", "us_per_msg"), False, ",.1f"
)
_BROKER_CPU_PCT = Metric(
    "broker_cpu_pct",
    "broker CPU %",
    ("cpu", "measured", "broker", "utilization"),
    False,
    ",.0f",
    scale=100,
    compared=False,
)
_GENERATOR_CPU_PCT = Metric(
    "generator_cpu_pct",
    "generator CPU %",
    ("cpu", "measured", "generator", "utilization"),
    False,
    ",.0f",
    scale=100,
    compared=False,
)
_CPU = (_BROKER_CPU_US, _BROKER_CPU_PCT, _GENERATOR_CPU_PCT)

_KIB = "1024"
_MIB = "1048576"


def _throughput(name: str, clients: int) -> Scenario:
    common = ("--producers", str(clients), "--consumers", str(clients), "--size", _KIB)
    return Scenario(
        name=name,
        title=f"Non-persistent 1 KiB messages, {clients} producer(s) and {clients} consumer(s)",
        args=("throughput", *common, "--count", "100000", "--warmup", "5000"),
        quick_args=("throughput", *common, "--count", "5000", "--warmup", "500"),
        timeout_s=300,
        metrics=(_MSG_S, _MB_S, _E2E_P99, *_CPU),
        chart=("msg_s", "broker_cpu_us"),
        summary=("msg_s",),
        target=Target(f"≥ 1.5 {_X} best peer", "msg_s", min_ratio=1.5),
    )


def _sync(name: str, producers: int, count: int, target: Target) -> Scenario:
    common: tuple[str, ...] = ("sync", "--producers", str(producers), "--consumers", "1")
    common += ("--persistent", "--size", _KIB)
    return Scenario(
        name=name,
        title=f"Persistent 1 KiB sends, each waiting for its receipt, {producers} producer(s)",
        args=(*common, "--count", str(count), "--warmup", str(producers * 50)),
        quick_args=(*common, "--count", str(count // 20), "--warmup", str(producers * 5)),
        timeout_s=400,
        metrics=(_SENDS_S, _RECEIPT_P50, _RECEIPT_P99, *_CPU),
        chart=("sends_s", "receipt_p99_ms"),
        summary=("sends_s",),
        target=target,
    )


def _connections(
    name: str, count: int, quick_count: int, summary: tuple[str, ...], target: Target | None
) -> Scenario:
    rate = ("--rate-per-connection", "0.1", "--size", "128")
    return Scenario(
        name=name,
        title=(
            f"{count:,} connections, each with its own queue, held 60 s while each sends itself "
            "a message every 10 s"
        ),
        args=("connections", "--connections", str(count), "--duration", "60", *rate),
        quick_args=("connections", "--connections", str(quick_count), "--duration", "5", *rate),
        timeout_s=900,
        metrics=(_HELD, _PER_CONN, _RSS_PEAK, _CONNECT_S, _RTT_P99, *_CPU),
        chart=("held", "kib_per_conn"),
        summary=summary,
        target=target,
    )


SCENARIOS: tuple[Scenario, ...] = (
    _throughput("throughput-1x1", 1),
    _throughput("throughput-4x4", 4),
    _sync("sync-1", 1, 5000, Target(f"≥ 1 {_X} best peer", "sends_s", min_ratio=1.0)),
    _sync("sync-8", 8, 20000, Target(f"≥ 3 {_X} best peer", "sends_s", min_ratio=3.0)),
    Scenario(
        name="latency",
        title="Non-persistent 1 KiB messages at a fixed 2,000 msg/s for 20 s, 1 producer, "
        "1 consumer: end-to-end latency",
        args=("latency", "--rate", "2000", "--duration", "20", "--size", _KIB, "--warmup", "1000"),
        quick_args=("latency", "--rate", "2000", "--duration", "3", "--size", _KIB),
        timeout_s=200,
        metrics=(_E2E_P99, _E2E_P50, _E2E_MAX, _MSG_S, *_CPU),
        chart=("p50_ms", "p99_ms", "max_ms"),
        summary=("p99_ms", "p50_ms", "max_ms"),
        target=Target("p99 ≤ best peer", "p99_ms", max_ratio=1.0),
    ),
    # A receipt for every message, at most 4 unanswered: each receipt says that one 1 MiB message
    # is stored, as a publisher would wait for it, while 4 MiB in flight lets a broker write
    # several messages per sync. Every broker gets exactly these frames.
    Scenario(
        name="large-1mib",
        title="Persistent 1 MiB messages, 1 producer (a receipt for every message, at most 4 "
        "unanswered), 1 consumer (prefetch 8)",
        args=(
            "throughput",
            *("--producers", "1", "--consumers", "1", "--persistent", "--size", _MIB),
            *("--count", "500", "--warmup", "10"),
            *("--prefetch", "8", "--receipt-every", "1", "--max-receipts", "4"),
        ),
        quick_args=(
            "throughput",
            *("--producers", "1", "--consumers", "1", "--persistent", "--size", _MIB),
            *("--count", "30", "--warmup", "2"),
            *("--prefetch", "8", "--receipt-every", "1", "--max-receipts", "4"),
        ),
        timeout_s=400,
        metrics=(_MB_S, _E2E_P99, *_CPU),
        chart=("mb_s",),
        summary=("mb_s",),
        target=Target(f"≥ 1 {_X} best peer", "mb_s", min_ratio=1.0),
    ),
    _connections("connections-1000", 1000, 200, ("kib_per_conn", "rtt_p99_ms"), None),
    _connections(
        "connections-10000",
        10000,
        500,
        ("held", "kib_per_conn", "rtt_p99_ms"),
        Target("all 10,000 held", "held", every_run_ok=True),
    ),
)


def by_name(names: list[str] | None) -> list[Scenario]:
    """The scenarios named, in the canonical order; all of them for None."""
    if not names:
        return list(SCENARIOS)
    known = {s.name: s for s in SCENARIOS}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown scenario(s) {', '.join(unknown)}; known: {', '.join(known)}")
    return [s for s in SCENARIOS if s.name in names]
