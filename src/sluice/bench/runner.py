"""The coordinating process: starts worker processes, steps them through a run, gathers results.

A run of the throughput, sync or latency scenario goes:

1. consumer workers start and report `ready` once every subscription is confirmed by a receipt;
2. producer workers start and report `ready` once connected;
3. with a warm-up, producers send it and the run waits until consumers have all of it;
4. `start`: producers send the measured messages; the run ends when consumers have every message,
   when producers are done and consumers made no progress for `idle_timeout_s` (messages lost),
   on the first error, or at the overall deadline;
5. `stop`: every worker acknowledges what it holds, disconnects and sends its result.

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


def split_processes(producers: int, consumers: int, processes: int | None) -> tuple[int, int]:
    """How many worker processes run consumers and how many run producers.

    Producers and consumers never share a process, so one side's work does not delay the other's
    timestamps. `None` (auto) uses one process per client up to the number of CPUs (at least 2).
    """
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
    every_consumer: bool = False  # a topic: each consumer gets every message
    timeout_s: float = 300.0
    idle_timeout_s: float = 10.0
    connect_timeout_s: float = 10.0
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


def run_clients(plan: ClientsPlan) -> ClientsOutcome:
    """Run producers and consumers in worker processes and return their results."""
    deadline = time.monotonic() + plan.timeout_s
    pool = WorkerPool(deadline)
    consumer_procs, producer_procs = split_processes(
        len(plan.producers), len(plan.consumers), plan.processes
    )
    outcome = ClientsOutcome(processes=(consumer_procs, producer_procs))
    base = {
        "kind": "clients",
        "broker": plan.broker,
        "connect_timeout_s": plan.connect_timeout_s,
        "uvloop": plan.uvloop,
        "log_level": plan.log_level,
    }
    try:
        consumer_workers = [
            pool.start(f"consumers-{i}", {**base, "consumers": [c.to_dict() for c in group]})
            for i, group in enumerate(_deal(plan.consumers, consumer_procs))
        ]
        pool.wait_for("subscriptions", lambda: all("ready" in w.events for w in consumer_workers))
        producer_workers = [
            pool.start(f"producers-{i}", {**base, "producers": [p.to_dict() for p in group]})
            for i, group in enumerate(_deal(plan.producers, producer_procs))
        ]
        pool.wait_for("producers", lambda: all("ready" in w.events for w in producer_workers))

        def unique() -> int:
            return sum(int(w.last.get("progress", {}).get("unique", 0)) for w in consumer_workers)

        warm = plan.expected_unique(warmup_only=True)
        if warm:
            pool.broadcast("warmup", producer_workers)
            pool.wait_for(
                "the warm-up",
                lambda: all("warmed" in w.events for w in producer_workers) and unique() >= warm,
            )
        expected = plan.expected_unique(warmup_only=False)
        pool.broadcast("start", producer_workers)
        progress = {"unique": unique(), "at": time.monotonic()}

        def finished() -> bool:
            now = time.monotonic()
            seen = unique()
            if seen >= expected:
                return True
            if seen != progress["unique"]:
                progress["unique"], progress["at"] = seen, now
                return False
            producers_done = all("sent" in w.events for w in producer_workers)
            return producers_done and now - progress["at"] >= plan.idle_timeout_s

        pool.wait_for("the consumers", finished)
        if unique() < expected:
            outcome.reason = (
                f"consumers received no new message for {plan.idle_timeout_s:g} s "
                f"after the producers finished ({unique()} of {expected})"
            )
    except RunAborted as exc:
        outcome.reason = str(exc)
    except KeyboardInterrupt:
        outcome.reason = "interrupted"
    finally:
        pool.finish()
    for worker in pool.workers:
        if worker.result is not None:
            outcome.producers += worker.result.get("producers", [])
            outcome.consumers += worker.result.get("consumers", [])
    outcome.errors = pool.errors()
    return outcome
