#!/usr/bin/env python3
"""Synchronous persistent sends measured by two load generators side by side, interleaved.

The generators: `bench`, `sluice bench sync` (its default: each producer in a process of its
own); `bench-shared`, `sluice bench sync --no-process-per-producer` (every producer on one shared
event loop, as before; only where there is more than one producer); `stomppy`,
`benchmarks/stomppy_load.py` (stomp.py, a client this project did not write, one blocking
producer process each); and, only when named, `stomppy-no-consumer` (the same without a
consumer). All of them send SIZE-byte `persistent:true` messages, each SEND with a receipt and
the next only after it; each has one consumer acknowledging cumulatively every 500 messages
(prefetch 1000; `--consumer-ack` for another mode); each warms up with 50 messages per
producer; each reports sends per second from the first measured send to the last receipt, and
the send-to-receipt latency.

For each run, each scenario (producer count, or a fixed rate), each broker (in an order that
rotates) and each generator (in an order that rotates), the broker is started fresh on an empty
data directory (`benchmarks/compare/brokers.py`: Sluice on its journal store, the peers through
`benchmarks/peers/*.sh`), the generator runs once, the broker is stopped. The machine's fsync
rate and load average are measured before and after (`benchmarks/machine.py`). Prints every
command, each result, and the medians; writes every record to `--out`.

    .venv/bin/python benchmarks/sync_crosscheck.py --runs 3 --producers 1,8
    .venv/bin/python benchmarks/sync_crosscheck.py --runs 3 --brokers sluice,activemq,rabbitmq
    .venv/bin/python benchmarks/sync_crosscheck.py --runs 3 --producers 1 --rate 2000 \\
        --count 40000     # latency at a fixed rate
    .venv/bin/python benchmarks/sync_crosscheck.py --kind throughput --non-persistent \\
        --producers 4 --size 1024 --count 25000     # 4 producers, 4 consumers, msg/s delivered
    .venv/bin/python benchmarks/sync_crosscheck.py --kind throughput --producers 1 \\
        --size 1048576 --receipt-every 1 --max-receipts 4 --prefetch 8 --count 300
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from compare.brokers import Broker, BrokerError, make_brokers
from compare.procs import TaskCap, run_command

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
GENERATORS = ("bench", "bench-shared", "stomppy")
# Not run unless named: stomp.py producers with no consumer (the queue only grows).
EXTRA_GENERATORS = ("stomppy-no-consumer",)
_MAX_BROKER_TASKS = 16_384
_SLACK_S = 180.0


def _csv(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def _command(
    generator: str, args: argparse.Namespace, producers: int, count: int, broker: Broker
) -> list[str]:
    """The generator's command line, without the broker's port, pid and output file."""
    if args.kind == "throughput":
        return _throughput_command(generator, args, producers, count, broker)
    warmup = 50 * producers
    if generator.startswith("stomppy"):
        consumers = "0" if generator == "stomppy-no-consumer" else "1"
        command = [sys.executable, str(HERE / "stomppy_load.py")]
        command += ["--producers", str(producers), "--consumers", consumers, "--count", str(count)]
        command += ["--warmup", "50", "--size", str(args.size)]
        command += ["--consumer-ack", args.consumer_ack]
        if args.rate:
            command += ["--rate", f"{args.rate:g}"]
        return command + broker.bench_args()
    command = [str(Path(sys.executable).parent / "sluice"), "bench", "sync"]
    command += ["--producers", str(producers), "--consumers", "1", "--persistent"]
    command += ["--size", str(args.size), "--count", str(count), "--warmup", str(warmup)]
    command += ["--ack", args.consumer_ack]
    if args.rate:
        command += ["--rate", f"{args.rate:g}"]
    if generator == "bench-shared":
        command.append("--no-process-per-producer")
    return command + broker.bench_args()


def _throughput_command(
    generator: str, args: argparse.Namespace, producers: int, count: int, broker: Broker
) -> list[str]:
    """`--kind throughput`: as many consumers as producers, a receipt every `--receipt-every`
    sends with at most `--max-receipts` unanswered; the figure is delivered messages per second."""
    persistent = not args.non_persistent
    if generator.startswith("stomppy"):
        command = [sys.executable, str(HERE / "stomppy_load.py")]
        command += ["--producers", str(producers), "--consumers", str(producers)]
        command += ["--count", str(count), "--warmup", "50", "--size", str(args.size)]
        command += ["--receipt-every", str(args.receipt_every)]
        command += ["--window", str(args.max_receipts), "--prefetch", str(args.prefetch)]
        command += ["--consumer-ack", args.consumer_ack]
        if not persistent:
            command.append("--non-persistent")
        return command + broker.bench_args()
    command = [str(Path(sys.executable).parent / "sluice"), "bench", "throughput"]
    command += ["--producers", str(producers), "--consumers", str(producers)]
    command += ["--size", str(args.size), "--count", str(count), "--warmup", str(50 * producers)]
    command += ["--receipt-every", str(args.receipt_every)]
    command += ["--max-receipts", str(args.max_receipts), "--prefetch", str(args.prefetch)]
    command += ["--ack", args.consumer_ack]
    if persistent:
        command.append("--persistent")
    if generator == "bench-shared":
        command.append("--no-process-per-producer")
    else:
        command.append("--process-per-producer")
    return command + broker.bench_args()


def _figures(generator: str, path: Path) -> dict[str, Any] | None:
    """Sends/s, receipt p50/p99/max ms, and broker and generator CPU µs/msg from a generator's
    JSON (the generator's: `sluice bench`, all its processes; stomppy_load.py, its producers)."""
    try:
        document = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if generator.startswith("stomppy"):
        latency = document["receipt_latency_ms"]
        return {
            "ok": bool(document.get("ok")),
            "sends_per_s": document.get("delivered_per_s", document["messages_per_s"])
            if document.get("receipt_every", 1) > 1 or document.get("window", 1) > 1
            else document["messages_per_s"],
            "p50_ms": latency["p50"],
            "p99_ms": latency["p99"],
            "max_ms": latency["max"],
            "late_sends": document.get("late_sends", 0),
            "broker_cpu_us": document.get("broker_cpu_us_per_msg"),
            "generator_cpu_us": round(
                document["generator_cpu_s"] / max(1, document["messages"]) * 1e6, 1
            ),
        }
    results = document["results"]
    latency = results["receipt_latency_ms"]
    measured = (results.get("cpu") or {}).get("measured") or {}
    broker_cpu = measured.get("broker") or {}
    generator_cpu = measured.get("generator") or {}
    return {
        "ok": bool(results.get("ok")),
        "sends_per_s": results["messages_per_s"]
        if results.get("scenario") == "throughput"
        else results["sends_per_s"],
        "p50_ms": latency["p50"],
        "p99_ms": latency["p99"],
        "max_ms": latency["max"],
        "late_sends": results.get("late_sends", 0),
        "broker_cpu_us": broker_cpu.get("us_per_msg"),
        "generator_cpu_us": generator_cpu.get("us_per_msg"),
    }


def _attempt(
    args: argparse.Namespace,
    work: Path,
    broker: Broker,
    generator: str,
    producers: int,
    count: int,
    label: str,
) -> dict[str, Any]:
    """Start the broker fresh, run one generator against it, stop it."""
    directory = work / label
    directory.mkdir(parents=True)
    record: dict[str, Any] = {"label": label, "broker": broker.name, "generator": generator}
    record["producers"] = producers
    record["loadavg_before"] = [round(x, 2) for x in os.getloadavg()]
    cap = TaskCap(f"sluice-crosscheck-{os.getpid()}-{label}", _MAX_BROKER_TASKS)
    try:
        running = broker.start(directory / "data", cap)
    except BrokerError as exc:
        record["failure"] = f"broker did not start: {exc}"
        cap.remove()
        return record
    try:
        out = directory / "result.json"
        command = _command(generator, args, producers, count, broker)
        if generator.startswith("stomppy"):
            command += ["--port", str(running.port), "--broker-pid", str(running.pid)]
        else:
            command += ["--broker", f"127.0.0.1:{running.port}", "--broker-pid", str(running.pid)]
        command += ["--json", str(out)]
        record["command"] = " ".join(command)
        done = run_command(command, timeout_s=args.timeout + _SLACK_S, output=directory / "log")
        record["exit_code"] = done.returncode
        record["figures"] = _figures(generator, out)
        if done.timed_out or record["figures"] is None or not record["figures"]["ok"]:
            tail = (directory / "log").read_text(errors="replace").splitlines()[-3:]
            record["failure"] = " | ".join(tail)
    finally:
        broker.stop()
        cap.remove()
        shutil.rmtree(directory / "data", ignore_errors=True)
        os.sync()
    record["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    return record


def _machine() -> dict[str, Any]:
    """fsync and fdatasync rates (3 s each) and the load average, from machine.py."""
    done = subprocess.run(
        [sys.executable, str(HERE / "machine.py"), "--json", "--seq-bytes", "0"],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    try:
        document = json.loads(done.stdout)
    except ValueError:
        return {"error": done.stderr[-500:]}
    return {
        "time": document["timestamp"],
        "loadavg": document["machine"]["loadavg"],
        "cpu": f"{document['machine']['cpu_model']}, {document['machine']['cpu_count']} CPUs",
        "kernel": document["machine"]["kernel"],
        "sync": {
            s["call"]: {"per_s": s["syncs_per_s"], "p50_ms": s["p50_ms"], "p99_ms": s["p99_ms"]}
            for s in document["sync"]
        },
    }


def _median_table(records: list[dict[str, Any]]) -> list[str]:
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for record in records:
        figures = record.get("figures")
        if figures and figures["ok"] and not record.get("failure"):
            key = (record["scenario"], record["broker"], record["generator"])
            groups.setdefault(key, []).append(figures)
    lines = [
        "| scenario | broker | generator | runs | sends/s | p50 ms | p99 ms | max ms "
        "| broker CPU µs/msg | generator CPU µs/msg |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (scenario, broker, generator), items in sorted(groups.items()):

        def median(key: str, items: list[dict[str, Any]] = items) -> float | None:
            values = [i[key] for i in items if i.get(key) is not None]
            return statistics.median(values) if values else None

        def show(value: float | None, fmt: str) -> str:
            return "-" if value is None else format(value, fmt)

        runs = ", ".join(f"{i['sends_per_s']:,.0f}" for i in items)
        lines.append(
            f"| {scenario} | {broker} | {generator} | {runs} "
            f"| **{show(median('sends_per_s'), ',.0f')}** | {show(median('p50_ms'), '.2f')} "
            f"| {show(median('p99_ms'), '.2f')} | {show(median('max_ms'), '.1f')} "
            f"| {show(median('broker_cpu_us'), ',.0f')} "
            f"| {show(median('generator_cpu_us'), ',.0f')} |"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--brokers", type=_csv, default=["sluice"])
    parser.add_argument("--producers", type=_csv, default=["1", "8"], help="one scenario each")
    parser.add_argument("--generators", type=_csv, default=list(GENERATORS))
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--count", type=int, default=2500, help="measured sends per producer")
    parser.add_argument("--rate", type=float, default=0.0, help="msg/s in all (latency runs)")
    parser.add_argument(
        "--consumer-ack",
        choices=("auto", "client", "client-individual"),
        default="client",
        help="the consumer's ack mode (client: cumulatively every 500 messages)",
    )
    parser.add_argument(
        "--kind",
        choices=("sync", "throughput"),
        default="sync",
        help="throughput: N producers and N consumers, windows of receipts, delivered msg/s",
    )
    parser.add_argument("--non-persistent", action="store_true", help="throughput runs only")
    parser.add_argument("--receipt-every", type=int, default=100, help="throughput runs only")
    parser.add_argument("--max-receipts", type=int, default=4, help="throughput runs only")
    parser.add_argument("--prefetch", type=int, default=1000, help="throughput runs only")
    parser.add_argument("--timeout", type=float, default=400.0)
    parser.add_argument("--out", type=Path, default=Path("sync-crosscheck.json"))
    args = parser.parse_args(argv)
    # The Sluice broker started here runs this checkout, as the generators do.
    os.environ["PYTHONPATH"] = str(REPO / "src")
    known = GENERATORS + EXTRA_GENERATORS
    unknown = [g for g in args.generators if g not in known]
    if unknown:
        parser.error(f"unknown generator(s) {unknown}; known: {', '.join(known)}")
    brokers = make_brokers(args.brokers, REPO)
    for broker in brokers:
        print(broker.install(Path(tempfile.gettempdir()) / f"crosscheck-{broker.name}.log"))
    session: dict[str, Any] = {"argv": sys.argv, "machine_before": _machine(), "records": []}
    print("machine:", json.dumps(session["machine_before"]), flush=True)
    work = Path(tempfile.mkdtemp(prefix="sluice-crosscheck-"))
    try:
        for run in range(1, args.runs + 1):
            for s_index, producers_text in enumerate(args.producers):
                producers = int(producers_text)
                count = args.count if args.rate else args.count * producers
                if args.kind == "throughput":
                    persistence = "np" if args.non_persistent else "p"
                    scenario = f"{persistence}-{producers}x{producers}-{args.size}B"
                else:
                    scenario = f"sync-{producers}" + (f"@{args.rate:g}" if args.rate else "")
                shift = run - 1 + s_index
                order = brokers[shift % len(brokers) :] + brokers[: shift % len(brokers)]
                for b_index, broker in enumerate(order):
                    gens = [g for g in args.generators if producers > 1 or g != "bench-shared"]
                    g_shift = (shift + b_index) % len(gens)
                    for generator in gens[g_shift:] + gens[:g_shift]:
                        label = f"run{run}-{scenario}-{broker.name}-{generator}"
                        record = _attempt(args, work, broker, generator, producers, count, label)
                        record.update(run=run, scenario=scenario)
                        session["records"].append(record)
                        figures = record.get("figures") or {}
                        print(
                            f"{label}: {figures.get('sends_per_s', 0):,.0f} sends/s, "
                            f"p50 {figures.get('p50_ms', 0):.2f} p99 {figures.get('p99_ms', 0):.2f}"
                            f" max {figures.get('max_ms', 0):.1f} ms, load "
                            f"{record['loadavg_before'][0]:.2f}"
                            + (f"  FAILED: {record['failure']}" if record.get("failure") else ""),
                            flush=True,
                        )
                        print(f"    {record.get('command', '')}", flush=True)
                        args.out.write_text(json.dumps(session, indent=1) + "\n")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    session["machine_after"] = _machine()
    print("machine:", json.dumps(session["machine_after"]))
    args.out.write_text(json.dumps(session, indent=1) + "\n")
    for line in _median_table(session["records"]):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
