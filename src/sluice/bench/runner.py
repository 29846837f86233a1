"""The coordinating process: starts worker processes, steps them through a run, gathers results.

A run of the throughput, sync or latency scenario goes:

1. consumer workers start and report `ready` once every subscription is confirmed by a receipt;
2. producer workers start and report `ready` once connected;
3. with a warm-up, producers send it and the run waits until consumers have all of it;
4. `start`: producers send the measured messages; the load ends when consumers have every message
   and every producer has the receipts of all of its own, when producers are done and consumers
   made no progress for `idle_timeout_s` (messages lost), on the first error, or at the overall
   deadline;
5. `mark`: each producer sends an end marker; the run waits (up to `idle_timeout_s`) until every
   marker reached a consumer (on a topic: every consumer), so nothing the broker holds is ahead of
   them, then keeps receiving for `drain_grace_s` to count late duplicates;
6. `stop`: every worker acknowledges what it holds, disconnects (with a receipt) and sends its
   result;
7. on a queue, the emptiness check (`check`) drains what the broker still holds for it up to a
   marker of its own: a late duplicate, or a message never delivered.

CPU time is read from /proc for the broker (given its pid) and every worker process, over the
measured window (from `start` to the moment the last expected message and the last producer's
`sent` were reported, within the 100 ms of a progress report) and over the whole run.

The coordinator never blocks on a worker without a deadline, and terminates workers that do not
answer in time, so a run always ends.
"""

from __future__ import annotations

import json
import multiprocessing
import multiprocessing.connection
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.context import SpawnProcess
from typing import Any

from sluice.bench.procstat import CpuMeter
from sluice.bench.roles import ConsumerSpec, ProducerSpec
from sluice.bench.worker import worker_main

__all__ = [
    "ClientsOutcome",
    "ClientsPlan",
    "RunAborted",
    "WorkerPool",
    "WorkerProcess",
    "run_clients",
    "split_processes",
]

_POLL_S = 0.05
_RESULT_GRACE_S = 15.0
_JOIN_S = 2.0


class RunAborted(Exception):
    """The run cannot go on; the message is the one-line reason."""


class WorkerProcess:
    """One spawned worker and what it has reported."""

    def __init__(self, name: str, spec: dict[str, Any]) -> None:
        context = multiprocessing.get_context("spawn")
        parent, child = context.Pipe()
        self.name = name
        self.conn = parent
        self.process: SpawnProcess = context.Process(
            target=worker_main, args=(child, json.dumps(spec)), name=name, daemon=True
        )
        self.process.start()
        child.close()
        self.events: set[str] = set()
        self.last: dict[str, dict[str, Any]] = {}
        self.result: dict[str, Any] | None = None
        self.errors: list[str] = []
        self.gone = False

    def send(self, command: str) -> None:
        """Send a command; ignored if the worker has gone."""
        if self.gone:
            return
        try:
            self.conn.send_bytes(json.dumps({"cmd": command}).encode())
        except (OSError, ValueError):
            self.gone = True

    def _handle(self, message: dict[str, Any]) -> None:
        event = str(message.get("event"))
        self.events.add(event)
        self.last[event] = message
        if event == "error":
            self.errors.append(f"{self.name}: {message.get('reason')}")
        elif event == "result":
            self.result = message

    def read_available(self) -> None:
        """Handle every message waiting on the pipe."""
        try:
            while not self.gone and self.conn.poll():
                self._handle(json.loads(self.conn.recv_bytes()))
        except (EOFError, OSError):
            self.gone = True
            if self.result is None:
                self.errors.append(f"{self.name}: worker exited without a result")

    def stop(self, timeout_s: float) -> None:
        """Join the process, terminating it if it does not end in time."""
        self.process.join(timeout_s)
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(_JOIN_S)
            if self.process.is_alive():
                self.process.kill()
                self.process.join(_JOIN_S)
        self.conn.close()


class WorkerPool:
    """Worker processes watched together; every wait has a deadline."""

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline
        self.workers: list[WorkerProcess] = []

    def start(self, name: str, spec: dict[str, Any]) -> WorkerProcess:
        """Spawn one worker."""
        worker = WorkerProcess(name, spec)
        self.workers.append(worker)
        return worker

    def pump(self, timeout_s: float) -> None:
        """Wait up to `timeout_s` for messages and handle them."""
        live = [w for w in self.workers if not w.gone]
        if not live:
            return
        waitables: list[Any] = [w.conn for w in live]
        multiprocessing.connection.wait(waitables, timeout_s)
        for worker in live:
            worker.read_available()

    def errors(self) -> list[str]:
        """Every error any worker reported."""
        return [e for w in self.workers for e in w.errors]

    def pids(self) -> dict[str, int]:
        """Every worker's pid by name."""
        return {w.name: w.process.pid for w in self.workers if w.process.pid is not None}

    def wait_for(
        self, what: str, done: Callable[[], bool], *, tick: Callable[[], None] | None = None
    ) -> None:
        """Pump until `done()`; raise `RunAborted` on a worker error or at the deadline."""
        while not done():
            errors = self.errors()
            if errors:
                raise RunAborted(errors[0])
            if time.monotonic() >= self.deadline:
                raise RunAborted(f"timed out waiting for {what}")
            self.pump(min(_POLL_S, max(0.0, self.deadline - time.monotonic())))
            if tick is not None:
                tick()

    def broadcast(self, command: str, workers: Sequence[WorkerProcess] | None = None) -> None:
        """Send a command to some or all workers."""
        for worker in self.workers if workers is None else workers:
            worker.send(command)

    def finish(self, grace_s: float = _RESULT_GRACE_S, join_s: float = _JOIN_S) -> None:
        """Tell every worker to stop, collect results for up to `grace_s`, and end the processes.

        Workers may go on after their result (closing connections) for up to `join_s`, and their
        messages are still read meanwhile.
        """
        self.broadcast("stop")
        end = time.monotonic() + grace_s
        while time.monotonic() < end and any(w.result is None and not w.gone for w in self.workers):
            self.pump(_POLL_S)
        for worker in self.workers:
            if worker.result is None and not worker.gone:
                worker.errors.append(f"{worker.name}: no result within {grace_s:g} s of stop")
        end = time.monotonic() + join_s
        while time.monotonic() < end and any(w.process.is_alive() for w in self.workers):
            self.pump(_POLL_S)
        for worker in self.workers:
            worker.stop(_JOIN_S)


def split_processes(
    producers: int, consumers: int, processes: int | None, *, process_per_producer: bool = False
) -> tuple[int, int]:
    """How many worker processes run consumers and how many run producers.

    Producers and consumers never share a process, so one side's work does not delay the other's
    timestamps. `None` (auto) uses one process per client up to the number of CPUs (at least 2).
    With `process_per_producer`, every producer has a process of its own, as the producers of
    separate applications do, and the consumers get one process each up to the CPUs (auto) or
    what `processes` leaves them (at least one).
    """
    if process_per_producer:
        if processes is None:
            consumer_procs = min(consumers, max(1, os.cpu_count() or 1))
        else:
            consumer_procs = max(1, min(consumers, processes - producers))
        return consumer_procs, producers
    clients = producers + consumers
    total = min(clients, max(2, os.cpu_count() or 2)) if processes is None else processes
    total = max(2, min(total, clients))
    consumer_procs = round(total * consumers / clients)
    consumer_procs = max(1, min(consumer_procs, total - 1, consumers))
    producer_procs = max(1, min(total - consumer_procs, producers))
    return consumer_procs, producer_procs


def _deal(items: Sequence[Any], groups: int) -> list[list[Any]]:
    return [list(items[i::groups]) for i in range(groups)]


@dataclass(frozen=True)
class ClientsPlan:
    """Everything a throughput, sync or latency run needs."""

    broker: dict[str, Any]
    producers: list[ProducerSpec]
    consumers: list[ConsumerSpec]
    processes: int | None = None
    # Each producer in a worker process of its own (see `split_processes`).
    process_per_producer: bool = False
    every_consumer: bool = False  # a topic: each consumer gets every message
    timeout_s: float = 300.0
    idle_timeout_s: float = 10.0
    connect_timeout_s: float = 10.0
    # After the end markers, how long consumers go on receiving to count late duplicates.
    drain_grace_s: float = 1.0
    # The broker's process, whose CPU time is read from /proc.
    broker_pid: int | None = None
    uvloop: bool = True
    log_level: int = 30

    def expected_unique(self, *, warmup_only: bool) -> int:
        """Distinct messages all consumers together must receive (in the warm-up, or in all)."""
        total = sum(p.warmup + (0 if warmup_only else p.count) for p in self.producers)
        return total * len(self.consumers) if self.every_consumer else total


@dataclass
class ClientsOutcome:
    """What came back from the workers."""

    producers: list[dict[str, Any]] = field(default_factory=list)
    consumers: list[dict[str, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    reason: str | None = None  # why the run was cut short, if it was
    processes: tuple[int, int] = (0, 0)
    # The emptiness check of each queue (None for a topic, or when the run was cut short).
    checks: list[dict[str, Any]] | None = None
    # CPU readings over the measured window and the whole run (see CpuMeter).
    measured_cpu: CpuMeter = field(default_factory=CpuMeter)
    run_cpu: CpuMeter = field(default_factory=CpuMeter)
    generator_pids: dict[str, int] = field(default_factory=dict)


def _base_spec(plan: ClientsPlan, kind: str) -> dict[str, Any]:
    return {
        "kind": kind,
        "broker": plan.broker,
        "connect_timeout_s": plan.connect_timeout_s,
        "uvloop": plan.uvloop,
        "log_level": plan.log_level,
    }


def _own_pids(pool: WorkerPool, plan: ClientsPlan) -> list[int]:
    pids = [*pool.pids().values(), os.getpid()]
    return [plan.broker_pid, *pids] if plan.broker_pid is not None else pids


def _settle(
    pool: WorkerPool,
    plan: ClientsPlan,
    producer_workers: list[WorkerProcess],
    consumer_workers: list[WorkerProcess],
) -> str | None:
    """Send the end markers, wait for them, drain for the grace period; a failure, if any."""
    pool.broadcast("mark", producer_workers)
    wanted = len(plan.producers)

    def arrived() -> bool:
        progress = [w.last.get("progress", {}) for w in consumer_workers]
        if plan.every_consumer:
            return all(int(p.get("markers_min", 0)) >= wanted for p in progress)
        union: set[int] = set()
        for item in progress:
            union.update(item.get("markers", []))
        return len(union) >= wanted

    end = time.monotonic() + plan.idle_timeout_s
    pool.wait_for("the end markers", lambda: arrived() or time.monotonic() >= end)
    failure = None
    if not arrived():
        failure = (
            f"the producers' end markers did not all reach the consumers within "
            f"{plan.idle_timeout_s:g} s"
        )
    end = time.monotonic() + plan.drain_grace_s
    pool.wait_for("the drain", lambda: time.monotonic() >= end)
    return failure


def _check_one(plan: ClientsPlan, spec: dict[str, Any]) -> dict[str, Any]:
    """One queue's emptiness check in a worker of its own."""
    pool = WorkerPool(time.monotonic() + plan.timeout_s)
    worker = pool.start(f"check {spec['destination']}", spec)
    try:
        pool.wait_for("the queue check", lambda: worker.result is not None or worker.gone)
    except RunAborted as exc:
        return {"destination": spec["destination"], "failure": f"queue check: {exc}"}
    finally:
        pool.finish()
    result: dict[str, Any] | None = (worker.result or {}).get("check")
    if result is None:
        return {"destination": spec["destination"], "failure": "queue check sent no result"}
    return result


def _check_queues(plan: ClientsPlan) -> list[dict[str, Any]]:
    """The emptiness check of every queue the consumers read, in turn."""
    per_producer = [0] * len(plan.producers)
    for producer in plan.producers:
        per_producer[producer.producer_id] = producer.warmup + producer.count
    first = plan.producers[0] if plan.producers else None
    checks: list[dict[str, Any]] = []
    for destination in sorted({c.destination for c in plan.consumers}):
        consumer = next(c for c in plan.consumers if c.destination == destination)
        spec = {
            **_base_spec(plan, "check"),
            "destination": destination,
            "size": consumer.size,
            "per_producer": per_producer,
            # As the producers sent: RabbitMQ ties a queue's durability to `persistent`.
            "persistent": first.persistent if first else False,
            "send_headers": dict(first.headers) if first else {},
            "subscribe_headers": dict(consumer.headers),
            "idle_timeout_s": plan.idle_timeout_s,
        }
        checks.append(_check_one(plan, spec))
    return checks


def _start_workers(
    pool: WorkerPool, plan: ClientsPlan, consumer_procs: int, producer_procs: int
) -> tuple[list[WorkerProcess], list[WorkerProcess]]:
    """Start the consumer workers, wait for their subscriptions, then the producer workers."""
    consumer_workers = [
        pool.start(
            f"consumers-{i}",
            {**_base_spec(plan, "clients"), "consumers": [c.to_dict() for c in group]},
        )
        for i, group in enumerate(_deal(plan.consumers, consumer_procs))
    ]
    pool.wait_for("subscriptions", lambda: all("ready" in w.events for w in consumer_workers))
    producer_workers = [
        pool.start(
            f"producers-{i}",
            {**_base_spec(plan, "clients"), "producers": [p.to_dict() for p in group]},
        )
        for i, group in enumerate(_deal(plan.producers, producer_procs))
    ]
    pool.wait_for("producers", lambda: all("ready" in w.events for w in producer_workers))
    return consumer_workers, producer_workers


def _unique(consumer_workers: list[WorkerProcess]) -> int:
    """Distinct messages the consumers reported so far."""
    return sum(int(w.last.get("progress", {}).get("unique", 0)) for w in consumer_workers)


def _warm_up(
    pool: WorkerPool,
    plan: ClientsPlan,
    producer_workers: list[WorkerProcess],
    consumer_workers: list[WorkerProcess],
) -> None:
    """Send the unmeasured messages, if any, and wait until the consumers have them all."""
    warm = plan.expected_unique(warmup_only=True)
    if not warm:
        return
    pool.broadcast("warmup", producer_workers)
    pool.wait_for(
        "the warm-up",
        lambda: (
            all("warmed" in w.events for w in producer_workers)
            and _unique(consumer_workers) >= warm
        ),
    )


def _measure(
    pool: WorkerPool,
    plan: ClientsPlan,
    outcome: ClientsOutcome,
    producer_workers: list[WorkerProcess],
    consumer_workers: list[WorkerProcess],
) -> None:
    """The measured load: until the consumers have every message, or stop making progress."""
    expected = plan.expected_unique(warmup_only=False)
    outcome.measured_cpu.start(_own_pids(pool, plan))
    pool.broadcast("start", producer_workers)
    progress = {"unique": _unique(consumer_workers), "at": time.monotonic()}

    def finished() -> bool:
        now = time.monotonic()
        seen = _unique(consumer_workers)
        # Sent: every producer has the receipts of all its messages (a consumer may have a
        # message before its producer has the receipt, with concurrent store and dispatch).
        producers_done = all("sent" in w.events for w in producer_workers)
        if seen >= expected:
            return producers_done
        if seen != progress["unique"]:
            progress["unique"], progress["at"] = seen, now
            return False
        return producers_done and now - progress["at"] >= plan.idle_timeout_s

    pool.wait_for("the consumers and the last receipts", finished)
    outcome.measured_cpu.stop(_own_pids(pool, plan))
    received = _unique(consumer_workers)
    if received < expected:
        outcome.reason = (
            f"consumers received no new message for {plan.idle_timeout_s:g} s "
            f"after the producers finished ({received} of {expected})"
        )


def _collect(pool: WorkerPool, outcome: ClientsOutcome) -> None:
    """Gather what the workers sent back, and every error they reported."""
    for worker in pool.workers:
        if worker.result is not None:
            outcome.producers += worker.result.get("producers", [])
            outcome.consumers += worker.result.get("consumers", [])
    outcome.errors = pool.errors()


def run_clients(plan: ClientsPlan) -> ClientsOutcome:
    """Run producers and consumers in worker processes and return their results."""
    pool = WorkerPool(time.monotonic() + plan.timeout_s)
    consumer_procs, producer_procs = split_processes(
        len(plan.producers),
        len(plan.consumers),
        plan.processes,
        process_per_producer=plan.process_per_producer,
    )
    outcome = ClientsOutcome(processes=(consumer_procs, producer_procs))
    outcome.run_cpu.start(_own_pids(pool, plan))
    aborted = False
    try:
        consumers, producers = _start_workers(pool, plan, consumer_procs, producer_procs)
        _warm_up(pool, plan, producers, consumers)
        _measure(pool, plan, outcome, producers, consumers)
        failure = _settle(pool, plan, producers, consumers)
        outcome.reason = outcome.reason or failure
    except RunAborted as exc:
        outcome.reason = str(exc)
        aborted = True
    except KeyboardInterrupt:
        outcome.reason = "interrupted"
        aborted = True
    finally:
        # Read before `stop`: the workers exit once they sent their results.
        outcome.run_cpu.stop(_own_pids(pool, plan))
        outcome.generator_pids = {**pool.pids(), "coordinator": os.getpid()}
        pool.finish()
    _collect(pool, outcome)
    if not aborted and not plan.every_consumer and not outcome.errors:
        try:
            outcome.checks = _check_queues(plan)
        except KeyboardInterrupt:
            outcome.reason = outcome.reason or "interrupted"
    return outcome
