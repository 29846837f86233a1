"""Seeded lives of a message store, run in process against the store interface and checked
against a model (`sim_model`) after every step and every restart.

A life (`sim_events.generate(seed)`) is a store configuration and a list of events: sends, acks,
transactions, durable subscriptions, destination deletes, GC, checkpoints, clean restarts,
crashes at any gated file call, injected faults, a filling disk, and the offline tools between
runs. `run_life` plays it against a `MemoryStore` (where the journal-only events do nothing) or a
`JournalStore` whose file I/O goes through `faultfs.FaultFS`; `simulate` also shrinks a failing
life to a short event list and formats the report.

Reproducibility. The journal's writer thread would batch a step's operations as timing allows, so
the completion sink holds the writer once it has delivered a step's last handle (a barrier: the
commit of a transaction never begun, which writes nothing) until the next step's operations are
all queued; the writer then takes them as one batch. Timers are out of play (GC and time-based
checkpoints every hour; the index batch is counted in records) and the preallocator works inline,
so a seed's sequence of file calls, and with it where a crash or a fault lands, is the same at
every run.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from unittest import mock

from sluice.errors import StoreError
from sluice.store.api import (
    DEDUP_HEADER,
    RecoveredSubscription,
    StoredMessage,
)
from sluice.store.journal import tools
from sluice.store.journal.gc import GcResult
from sluice.store.journal.store import JournalStore
from sluice.store.memory import MemoryStore

from .faultfs import CrashPlan
from .sim_events import (
    DESTS,
    DLQS,
    FAULT_SPAN_EVENTS,
    OPT_POWER,
    OPT_TORN,
    QUEUES,
    SUBS,
    TOPICS,
    Event,
    Life,
    generate,
)
from .sim_harness import (
    ALL_KNOWN,
    SWITCH_INTERVAL_S,
    Known,
    LifeResult,
    Op,
    StoreKind,
    fault_of,
    make_message,
    memory_store,
    noop,
    workdir,
)
from .sim_model import Mismatch, TxAdd, fields_of
from .sim_postgres import Cut, PgTarget
from .sim_runner import COMPACT_MAX_ROUNDS, Runner

DLQ_REASON = "x-dlq-reason"
DLQ_SLOT = -1  # the model's transaction slot of a transacted move to a DLQ


class LifePlayer(Runner):
    """Plays a life's events against the store and the model."""

    # -- events ----------------------------------------------------------------------------------

    def add(self, ops: list[Op], m: StoredMessage) -> None:
        """A non-transacted add in a step."""
        fields = fields_of(m)
        dedup = m.headers.get(DEDUP_HEADER)
        self.touched.add(m.destination)
        handle = self.s.add(m, None)
        effect = partial(self.model.add, m.destination, m.seq, fields, dedup)
        ops.append(Op(handle, effect, refusable=True))

    def remove(self, ops: list[Op], dest: str, seq: int) -> None:
        """A non-transacted remove in a step."""
        self.touched.add(dest)
        lazy = self.lazy_acks
        effect = partial(self.model.remove, dest, seq, lazy=lazy)
        ops.append(Op(self.s.remove(dest, seq), effect, refusable=True, lazy=lazy))

    def pick(self, dest: str, ev: Event, count: int = 1) -> list[int]:
        """`count` surely stored messages of `dest`, chosen by the event's fraction."""
        seqs = self.model.sure_seqs(dest)
        if not seqs:
            return []
        start = int(ev.pick * len(seqs))
        return sorted({seqs[(start + k) % len(seqs)] for k in range(min(count, len(seqs)))})

    def _ev_send(self, ev: Event) -> None:
        dest = DESTS[ev.d]

        def submit(ops: list[Op]) -> None:
            for i in range(ev.n):
                self.add(ops, make_message(ev, i, dest, self.model.next_seq(dest)))

        self.step(submit)

    def _ev_send_ack(self, ev: Event) -> None:
        dest = DESTS[ev.d]

        def submit(ops: list[Op]) -> None:
            seqs = []
            for i in range(ev.n):
                seqs.append(self.model.next_seq(dest))
                self.add(ops, make_message(ev, i, dest, seqs[-1]))
            for i, seq in enumerate(seqs):
                if (i + ev.uid) % 2 == 0:
                    self.remove(ops, dest, seq)

        self.step(submit)

    def _ev_ack(self, ev: Event) -> None:
        dest = DESTS[ev.d]
        victims = self.pick(dest, ev, ev.n)
        if not victims:
            return

        def submit(ops: list[Op]) -> None:
            for seq in victims:
                self.remove(ops, dest, seq)

        self.step(submit)

    def _ev_ack_range(self, ev: Event) -> None:
        dest = DESTS[ev.d]
        upto = self.pick(dest, ev)
        if not upto:
            return

        def submit(ops: list[Op]) -> None:
            self.touched.add(dest)
            handle = self.s.remove_range(dest, upto[0])
            ops.append(Op(handle, partial(self.model.remove_range, dest, upto[0])))

        self.step(submit)

    def _ev_dlq(self, ev: Event) -> None:
        dest = QUEUES[ev.d % len(QUEUES)]
        dlq = DLQS[ev.d % len(DLQS)]
        victim = self.pick(dest, ev)
        if not victim:
            return
        seq = victim[0]
        original = self.model.dests[dest].msgs[seq].fields
        reason = "expired" if original.expires_ms else "max redeliveries"
        transacted = bool(ev.opt & 1)

        def submit(ops: list[Op]) -> None:
            if not transacted:
                self.add(ops, original.message(dlq, self.model.next_seq(dlq), {DLQ_REASON: reason}))
                self.remove(ops, dest, seq)
                return
            copy = original.message(dlq, 0, {DLQ_REASON: reason})
            self.touched.update((dest, dlq))
            txid = f"dlq.{ev.uid}"
            self.s.begin(txid)
            tx = self.model.begin(DLQ_SLOT, txid)
            ops.append(Op(self.s.add(copy, None, txid), noop))
            tx.adds.append(TxAdd(dlq, fields_of(copy), copy.headers.get(DEDUP_HEADER)))
            ops.append(Op(self.s.remove(dest, seq, None, txid), noop, writes=self.tx_removes_write))
            tx.removes.append((dest, seq))
            seqs = [self.model.next_seq(dlq)]
            commit = self.s.commit(txid, seqs, None)
            ops.append(Op(commit, partial(self.model.commit, DLQ_SLOT, seqs)))

        self.step(submit)

    def _ev_stream(self, ev: Event) -> None:
        dest = DESTS[ev.d]

        def submit(ops: list[Op]) -> None:
            offset = 0
            for i in range(ev.n):
                extra = {
                    "x-stream-id": f"s{ev.uid}",
                    "x-stream-seq": str(i),
                    "x-stream-offset": str(offset),
                }
                if i == ev.n - 1:
                    extra["x-stream-end"] = "true"
                m = make_message(ev, i, dest, self.model.next_seq(dest), extra)
                offset += len(m.body)
                self.add(ops, m)

        self.step(submit)

    def _ev_mark(self, ev: Event) -> None:
        dest = DESTS[ev.d]
        seq = int(ev.pick * self.model.dests[dest].high)
        if Known.ZERO_MARK_PINS in self.known and seq == 0:
            seq = 1
            self.result.known[Known.ZERO_MARK_PINS.value] += 1

        def submit(ops: list[Op]) -> None:
            ops.append(Op(self.s.mark_dispatched(dest, seq), partial(self.model.mark, dest, seq)))

        self.step(submit)

    def tx(self, ev: Event) -> str:
        """The transaction in the event's slot, begun if there is none."""
        tx = self.model.txs.get(ev.slot)
        if tx is None:
            tx = self.model.begin(ev.slot, f"tx{ev.slot}.{ev.uid}")
            self.s.begin(tx.txid)
        return tx.txid

    def _ev_tx_begin(self, ev: Event) -> None:
        self.tx(ev)

    def _ev_tx_send(self, ev: Event) -> None:
        dest = DESTS[ev.d]
        txid = self.tx(ev)
        tx = self.model.txs[ev.slot]

        def submit(ops: list[Op]) -> None:
            for i in range(ev.n):
                m = make_message(ev, i, dest, 0)
                tx.adds.append(TxAdd(dest, fields_of(m), m.headers.get(DEDUP_HEADER)))
                ops.append(Op(self.s.add(m, None, txid), noop))

        self.step(submit)

    def _ev_tx_ack(self, ev: Event) -> None:
        dest = DESTS[ev.d]
        victim = self.pick(dest, ev)
        if not victim:
            return
        txid = self.tx(ev)
        self.model.txs[ev.slot].removes.append((dest, victim[0]))
        self.step(
            lambda ops: ops.append(
                Op(self.s.remove(dest, victim[0], None, txid), noop, writes=self.tx_removes_write)
            )
        )

    @property
    def tx_removes_write(self) -> bool:
        """Whether a transacted remove writes anything before its commit: the journal writes its
        REMOVE record, the PostgreSQL store keeps it for the commit (so its batch syncs
        nothing, and removes nobody waited for before it stay unsynced)."""
        return not self.postgres

    def _ev_tx_commit(self, ev: Event) -> None:
        tx = self.model.txs.get(ev.slot)
        if tx is None:
            return
        seqs = [self.model.next_seq(a.destination) for a in tx.adds]
        self.touched.update(a.destination for a in tx.adds)
        self.touched.update(dest for dest, _ in tx.removes)
        handle_of = partial(self.s.commit, tx.txid, seqs, None)
        effect = partial(self.model.commit, ev.slot, seqs)
        writes = bool(tx.adds or tx.removes)
        self.step(lambda ops: ops.append(Op(handle_of(), effect, writes=writes)))

    def _ev_tx_abort(self, ev: Event) -> None:
        tx = self.model.txs.get(ev.slot)
        if tx is None:
            return
        self.model.abort(ev.slot)
        self.step(lambda ops: self.s.abort(tx.txid))

    def _ev_sub_put(self, ev: Event) -> None:
        key = SUBS[ev.slot]
        sub = self.model.subs.get(key)
        cursor = sub.latest[2] if sub is not None else ev.n
        selector = None if ev.n % 2 == 0 else f"n > {ev.n}"
        dest = TOPICS[ev.d % len(TOPICS)]

        def submit(ops: list[Op]) -> None:
            handle = self.s.put_subscription(RecoveredSubscription(*key, dest, selector, cursor))
            record = RecoveredSubscription(*key, dest, selector, cursor)
            ops.append(Op(handle, partial(self.model.sub_put, key, record)))

        self.step(submit)

    def _ev_sub_cursor(self, ev: Event) -> None:
        key = SUBS[ev.slot]
        sub = self.model.subs.get(key)
        cursor = (sub.latest[2] if sub is not None else 0) + ev.n + 1

        def submit(_ops: list[Op]) -> None:
            self.s.set_cursor(*key, cursor)
            self.model.sub_cursor(key, cursor)

        self.step(submit)

    def _ev_sub_delete(self, ev: Event) -> None:
        key = SUBS[ev.slot]
        self.step(
            lambda ops: ops.append(
                Op(self.s.delete_subscription(*key), partial(self.model.sub_delete, key))
            )
        )

    def _ev_delete_dest(self, ev: Event) -> None:
        dest = DESTS[ev.d]
        self.touched.add(dest)
        self.step(
            lambda ops: ops.append(
                Op(self.s.delete_destination(dest), partial(self.model.delete_dest, dest))
            )
        )

    def _ev_gc(self, _ev: Event) -> None:
        store = self.s
        assert isinstance(store, JournalStore)
        result = self.request(store.gc)
        self.note(f"    {result}")

    def _ev_checkpoint(self, _ev: Event) -> None:
        store = self.s
        assert isinstance(store, JournalStore)
        self.request(store.checkpoint)

    def _ev_restart(self, _ev: Event) -> None:
        self.restart()

    def _ev_crash(self, ev: Event) -> None:
        if self.postgres:
            self.pg_crash = ev.opt
            self.crash_next = True
            return
        torn = ((ev.uid * 37) % 100) / 100 if ev.opt & OPT_TORN else None
        self.fs.arm_crash(CrashPlan(ev.after, torn, bool(ev.opt & OPT_POWER)))
        self.crash_next = True

    def _ev_pg_cut(self, ev: Event) -> None:
        self.pg_cut = list(Cut)[1 + ev.opt % 3]

    def _ev_fault(self, ev: Event) -> None:
        self.fs.arm_fault(fault_of(ev))
        self.fault_span = FAULT_SPAN_EVENTS

    def _ev_disk_full(self, ev: Event) -> None:
        self.fs.capacity_bytes = self.fs.used_bytes() + ev.n * self.life.config.file_bytes // 4

    def _ev_disk_free(self, _ev: Event) -> None:
        self.fs.capacity_bytes = None

    def _offline(self, tool: Callable[[], object] | None, *, repair: bool = False) -> None:
        """Close, run an offline tool on the directory, open again."""
        exact = self.close_store()
        if self.fs.crashed():
            return
        if self.journal and tool is not None:
            fired_before = self.fs.stats.injected.total()
            try:
                tool()
            except Mismatch:
                raise
            except Exception as exc:
                self.closed_left_open(exc)
                if self.fs.crashed():
                    return
                if (
                    self.fs.stats.injected.total() == fired_before
                    and self.fs.capacity_bytes is None
                ):
                    raise Mismatch("tool", f"{type(exc).__name__}: {exc}") from exc
                self.note(f"    tool failed under a fault: {exc}")
                exact = False
        self.open_store(exact=exact, repair=repair)

    def _ev_verify(self, _ev: Event) -> None:
        exact = self.close_store()
        if self.fs.crashed():
            return
        if self.journal:
            fired_before = self.fs.stats.injected.total()
            try:
                self.verify(exact=exact)
            except StoreError as exc:
                if self.fs.stats.injected.total() == fired_before:
                    raise Mismatch("verify", f"{type(exc).__name__}: {exc}") from exc
        self.open_store(exact=exact)

    def _ev_rebuild(self, _ev: Event) -> None:
        self._offline(lambda: tools.rebuild_index(self.root, self.config()))

    def _ev_repair(self, _ev: Event) -> None:
        self._offline(None, repair=True)

    def _ev_compact(self, _ev: Event) -> None:
        self._offline(self.compact)

    def compact(self) -> None:
        """`sluice store compact`, stopped with a failure if its collections never settle."""
        rounds = 0
        real_gc = JournalStore.gc

        def counted_gc(store: JournalStore) -> GcResult:
            nonlocal rounds
            rounds += 1
            if rounds > COMPACT_MAX_ROUNDS:
                raise Mismatch("compact-loop", f"{rounds} collections and still compacting")
            return real_gc(store)

        with mock.patch.object(JournalStore, "gc", counted_gc):
            tools.compact(self.root, self.config())


def run_life(
    kind: StoreKind,
    life: Life,
    events: Sequence[Event] | None = None,
    *,
    trace: bool = False,
    known: frozenset[Known] = ALL_KNOWN,
    make_memory: Callable[[int], MemoryStore] = memory_store,
    pg: PgTarget | None = None,
) -> LifeResult:
    """Play `life` (or the given events with its configuration) against a fresh store, stepping
    around the `known` issues. `make_memory` builds the memory store from the dedup window
    (tests plant faulty ones to see the checks fail)."""
    switch = sys.getswitchinterval()
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    try:
        with workdir() as path:
            events = life.events if events is None else events
            runner = LifePlayer(
                kind, life, events, path, trace=trace, known=known, make_memory=make_memory, pg=pg
            )
            return runner.run()
    finally:
        sys.setswitchinterval(switch)


def shrink(
    kind: StoreKind,
    life: Life,
    failure: LifeResult,
    budget_s: float,
    known: frozenset[Known] = ALL_KNOWN,
    make_memory: Callable[[int], MemoryStore] = memory_store,
    pg: PgTarget | None = None,
) -> tuple[list[Event], int]:
    """A shorter event list that fails the same check (delta debugging: drop chunks, then single
    events, while the failure reproduces), within `budget_s`. Returns it and the runs made."""
    assert failure.failure is not None
    check = failure.failure.check
    events = list(life.events[: max(0, failure.failed_at + 1)])
    deadline = time.monotonic() + budget_s
    runs = 0

    def fails(candidate: list[Event]) -> bool:
        nonlocal runs
        runs += 1
        result = run_life(kind, life, candidate, known=known, make_memory=make_memory, pg=pg)
        return result.failure is not None and result.failure.check == check

    chunks = 2
    while len(events) >= 2 and time.monotonic() < deadline:
        size = -(-len(events) // chunks)
        for start in range(0, len(events), size):
            candidate = events[:start] + events[start + size :]
            if time.monotonic() >= deadline:
                break
            if fails(candidate):
                events = candidate
                chunks = max(2, chunks - 1)
                break
        else:
            if size == 1:
                break
            chunks = min(len(events), chunks * 2)
    return events, runs


@dataclass
class Report:
    """One seed run against one store, with the shrunk events and the text to print when it
    failed."""

    result: LifeResult
    shrunk: list[Event] | None = None
    text: str = ""

    @property
    def failed(self) -> bool:
        """Whether a check failed."""
        return self.result.failure is not None


def simulate(
    kind: StoreKind,
    seed: int,
    *,
    shrink_s: float = 30.0,
    trace: bool = False,
    known: frozenset[Known] = ALL_KNOWN,
    pg: PgTarget | None = None,
) -> Report:
    """Run `seed`'s life; when it fails, shrink it and format the report."""
    life = generate(seed)
    result = run_life(kind, life, trace=trace, known=known, pg=pg)
    if result.failure is None:
        return Report(result)
    started = time.monotonic()
    shrunk, runs = shrink(kind, life, result, shrink_s, known, pg=pg)
    took = time.monotonic() - started
    if result.failed_at < 0:
        at = "the first open"
    elif result.failed_at < len(life.events):
        at = f"event {result.failed_at} of {len(life.events)}: {life.events[result.failed_at]}"
    else:
        at = "the final drain and checks"
    lines = [
        f"store lifecycle failure: {kind.value} store, seed {seed} ({life.config})",
        f"check {result.failure}",
        f"at {at}",
        f"shrunk to {len(shrunk)} events ({runs} runs, {took:.1f} s):",
        *(f"    {ev}" for ev in shrunk),
        f"replay: pytest tests/lifecycle/test_store_lifecycle.py --seed {seed}",
    ]
    return Report(result, shrunk, "\n".join(lines))
