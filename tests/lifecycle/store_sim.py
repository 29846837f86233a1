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

import contextlib
import enum
import os
import re
import shutil
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from unittest import mock

import lmdb

from sluice.config import MiB, StoreConfig
from sluice.errors import StoreError
from sluice.store.api import (
    DEDUP_HEADER,
    RecoveredSubscription,
    Recovery,
    StoredMessage,
    WriteHandle,
    WriteState,
)
from sluice.store.journal import tools
from sluice.store.journal.files import list_files
from sluice.store.journal.gc import GcResult
from sluice.store.journal.index import Index
from sluice.store.journal.store import JournalStore
from sluice.store.memory import MemoryStore

from .faultfs import CrashPlan, Fault, FaultFS, FaultKind, Target
from .sim_events import (
    ALL_DESTS,
    DESTS,
    DLQS,
    FAULT_SPAN_EVENTS,
    FAULTS,
    JOURNAL_ONLY,
    OPT_DEDUP,
    OPT_EXPIRES,
    OPT_NOT_PERSISTENT,
    OPT_POWER,
    OPT_TORN,
    QUEUES,
    SUBS,
    TOPICS,
    Event,
    Kind,
    Life,
    generate,
)
from .sim_model import Mismatch, Model, TxAdd, fields_of

WAIT_S = 20.0  # a step's handles must all complete within this
FULL_DISK_WAIT_S = 0.5  # a writer waiting for space on a full disk gets it back after this
HOLD_S = 60.0  # the sink never holds the writer longer than this
DISK_BOUND_FILES = 2  # data files left once everything is consumed and collected
COMPACT_MAX_ROUNDS = 20  # `sluice store compact` collects until nothing changes; it must end
_LOAD_PAGE = 7
FULL_CHECK_EVERY = 8  # between restarts, all destinations are read back every this many events
SWITCH_INTERVAL_S = 0.0002  # the main thread and the writer hand over constantly: switch fast
DLQ_REASON = "x-dlq-reason"
DLQ_SLOT = -1  # the model's transaction slot of a transacted move to a DLQ
STEP_KINDS = frozenset(
    {
        Kind.SEND,
        Kind.SEND_ACK,
        Kind.ACK,
        Kind.ACK_RANGE,
        Kind.DLQ,
        Kind.STREAM,
        Kind.MARK,
        Kind.TX_BEGIN,
        Kind.TX_SEND,
        Kind.TX_ACK,
        Kind.TX_COMMIT,
        Kind.TX_ABORT,
        Kind.SUB_PUT,
        Kind.SUB_CURSOR,
        Kind.SUB_DELETE,
        Kind.DELETE_DEST,
    }
)


class Known(enum.Enum):
    """Store bugs this simulation found that are not fixed yet. By default a life steps around
    each (or tolerates it, counting the times in `LifeResult.known`) so that it can still find
    others; `test_store_lifecycle.py` keeps a strict xfail test that runs without it."""

    # `tools.rebuild_index` keeps 10,000 dedup ids whatever the store's window, and an open
    # reports (and keeps pinned) what the index holds without trimming it to the window.
    # Tolerated: only the newest `dedup_window` ids of a recovered window are compared.
    LONG_DEDUP_WINDOW = "long-dedup-window"
    # `HeadFile.rollover` closes the head descriptor, then fails to start the next file and
    # keeps the closed number. `close()` closes it again, and when the failure did not fail the
    # writer (a rollover in compaction or in a requested checkpoint), the next batch is written
    # to it: by then the number may be another file's. Tolerated: the fault layer refuses every
    # use of a descriptor the store does not hold (EBADF), so the store then fails.
    ROLLOVER_CLOSES_TWICE = "rollover-closes-twice"
    # `mark_dispatched(dest, 0)` pins its file for ever: compaction re-asserts the destination
    # (DEST_STATE) but a zero mark does not move the pin, so every collection rewrites it and
    # `sluice store compact` never ends. Stepped around: marks are at least 1, as the core's.
    ZERO_MARK_PINS = "zero-mark-pins"
    # `recover()` rebuilding the index does not close it when the replay fails (the path that
    # uses the index does): its LMDB environment and write transaction are left to the garbage
    # collector, which frees them in any order, later, inside some other LMDB call (we saw
    # segfaults). Tolerated: the harness closes what the failed call's frames hold at once.
    INDEX_LEFT_OPEN = "index-left-open"


ALL_KNOWN = frozenset(Known)
# How the fault layer names a use of the head file's stale descriptor.
_HEAD_MISUSE = re.compile(r"files\.py:\d+ in (close|rollover|sync|write_all|_zero_fill): ")


class StoreKind(enum.Enum):
    """The store a life runs against."""

    MEMORY = "memory"
    JOURNAL = "journal"


def _barrier_mark(_handle: WriteHandle) -> None:
    """The `on_complete` of barrier handles (never called: it marks them for the sink)."""


class Sink:
    """The completion sink: records deliveries, lets the main thread wait for handles, and (for
    the journal) holds the writer thread after it delivers a barrier until `release()`."""

    def __init__(self, *, hold: bool) -> None:
        self._cond = threading.Condition()
        self._delivered: list[WriteHandle] = []
        self._hold = hold
        self._holding = False
        self._go = False

    def __call__(self, handles: Sequence[WriteHandle]) -> None:
        with self._cond:
            self._delivered.extend(handles)
            self._cond.notify_all()
            if not self._hold or not any(h.on_complete is _barrier_mark for h in handles):
                return
            self._holding = True
            self._cond.wait_for(lambda: self._go, HOLD_S)
            self._go = False
            self._holding = False

    def release(self) -> None:
        """Let a held writer go on."""
        with self._cond:
            if self._holding:
                self._go = True
                self._cond.notify_all()

    def wait(self, handles: Sequence[WriteHandle], timeout: float) -> bool:
        """Wait until every handle has been delivered."""
        wanted = {id(h) for h in handles}
        with self._cond:
            return self._cond.wait_for(lambda: wanted <= {id(h) for h in self._delivered}, timeout)

    def take(self) -> list[WriteHandle]:
        """The handles delivered since the last call."""
        with self._cond:
            out, self._delivered = self._delivered, []
            return out


@dataclass
class _Op:
    """A store call of a step: its handle and what its outcome does to the model. `writes`:
    False for calls that write nothing (the barrier, the commit of an empty transaction), which
    complete WRITTEN even on a store that has failed."""

    handle: WriteHandle
    effect: Callable[[WriteState], None]
    writes: bool = True


@dataclass
class LifeResult:
    """What one life did and whether a check failed."""

    seed: int
    kind: StoreKind
    events: int = 0
    steps: int = 0
    opens: int = 0
    crashes: int = 0
    faults: Counter[str] = field(default_factory=Counter)
    leaked_fds: int = 0  # descriptors the store never closed (closed by the harness)
    known: Counter[str] = field(default_factory=Counter)  # known issues met and tolerated
    failure: Mismatch | None = None
    failed_at: int = -1  # index of the event that failed (len(events): the final checks)
    trace: list[str] = field(default_factory=list)


def _store_frame(exc: BaseException) -> str:
    """Where in the store an exception was raised: `module.py:line in function`."""
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        if "/sluice/store/" in frame.filename:
            return f"{Path(frame.filename).name}:{frame.lineno} in {frame.name}"
    return "outside the store"


def _indexes_left_open(exc: BaseException) -> list[Index]:
    """The LMDB indexes still open in the frames of a call that raised `exc` (and of the
    exceptions it was raised from)."""
    found: dict[int, Index] = {}
    seen: set[int] = set()
    pending: list[BaseException | None] = [exc]
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        pending += [current.__context__, current.__cause__]
        tb = current.__traceback__
        while tb is not None:
            for value in tb.tb_frame.f_locals.values():
                state = getattr(value, "state", None)
                for candidate in (
                    value,
                    getattr(value, "index", None),
                    getattr(state, "index", None),
                ):
                    if isinstance(candidate, Index) and _env_open(candidate):
                        found[id(candidate)] = candidate
            tb = tb.tb_next
    return list(found.values())


def _env_open(index: Index) -> bool:
    try:
        index.env.flags()
    except lmdb.Error:
        return False
    return True


def _close_indexes_left_open(exc: BaseException) -> int:
    """Close (aborting its write transaction) every index a failed call left open."""
    indexes = _indexes_left_open(exc)
    for index in indexes:
        with contextlib.suppress(Exception):
            index.abort()
        index.env.close()
    return len(indexes)


def _release(store: MemoryStore | JournalStore) -> bool:
    """After a close (or open) that raised: close the index the store still holds, if it does,
    and say so. LMDB must never have one environment open twice in a process (a leaked one,
    closed later by the garbage collector, drops the locks of the one opened after it), so the
    harness reaches into the store here, and only here."""
    if not isinstance(store, JournalStore):
        return False
    index = store._index
    if store._writer is None or index is None:
        return False
    with contextlib.suppress(Exception):
        index.close(clean=False)
    store._writer = None
    return True


def _noop(_state: WriteState) -> None:
    """An outcome that changes nothing in the model."""


def _message(
    ev: Event, i: int, dest: str, seq: int, extra: dict[str, str] | None = None
) -> StoredMessage:
    """The i-th message of an event: it depends on the event alone."""
    headers = {"k": f"v{ev.uid}.{i}"}
    if ev.opt & OPT_DEDUP:
        headers[DEDUP_HEADER] = f"d{ev.uid}.{i}"
    if extra:
        headers.update(extra)
    size = ev.size + 17 * i
    stamp = f"{ev.uid}.{i}:".encode()
    body = (stamp * (size // len(stamp) + 1))[:size]
    return StoredMessage(
        dest,
        seq,
        f"m{ev.uid}.{i}",
        1_000_000 + ev.uid * 10 + i,
        headers,
        body,
        expires_ms=2_000_000 + ev.uid if ev.opt & OPT_EXPIRES else 0,
        priority=(ev.uid + i) % 10,
        persistent=not ev.opt & OPT_NOT_PERSISTENT,
    )


def _fault_of(ev: Event) -> Fault:
    kind, target = FAULTS[ev.opt % len(FAULTS)]
    return Fault(FaultKind(kind), Target(target), ev.after, max(0.05, ev.pick))


class _Runner:
    """Plays one life."""

    def __init__(
        self,
        kind: StoreKind,
        life: Life,
        events: Sequence[Event],
        workdir: Path,
        *,
        trace: bool,
        known: frozenset[Known],
        make_memory: Callable[[int], MemoryStore],
    ) -> None:
        self.kind = kind
        self.life = life
        self.known = known
        self.make_memory = make_memory
        self.events = events
        self.root = workdir / "data"
        self.journal = kind is StoreKind.JOURNAL
        self.fs = FaultFS(self.root, workdir / "image")
        self.model = Model(life.config.dedup_window, trim_windows=Known.LONG_DEDUP_WINDOW in known)
        self.sink = Sink(hold=self.journal)
        self.store: MemoryStore | JournalStore | None = None
        self.memory: MemoryStore | None = None
        self.result = LifeResult(life.seed, kind)
        self.tracing = trace
        self.index = -1
        self.crash_next = False
        self.fault_span = 0
        self.failed_events = 0
        self.faults_since_open = 0
        self.barriers = 0
        self.handles_seen: dict[int, WriteHandle] = {}
        self.touched: set[str] = set()

    # -- the life --------------------------------------------------------------------------------

    def run(self) -> LifeResult:
        """Play every event, then drain, collect and check the final state."""
        ctx = self.fs.installed() if self.journal else contextlib.nullcontext()
        try:
            with ctx:
                try:
                    self.open_store(exact=True)
                    for index, ev in enumerate(self.events):
                        self.index = index
                        self.note(f"{index:3} {ev}  [{self.fs.stats.gated_calls} calls]")
                        self.run_event(ev)
                        self.result.events += 1
                    self.index = len(self.events)
                    self.finish()
                except Mismatch as failure:
                    self.fail(failure)
                except Exception as exc:  # a life's boundary: anything unexpected is a failure
                    where = _store_frame(exc)
                    self.fail(Mismatch("exception", f"{type(exc).__name__}: {exc} ({where})"))
                finally:
                    self.abandon()
        finally:
            self.result.faults.update(self.fs.stats.injected)
            self.result.crashes = self.fs.stats.crashes
            self.result.leaked_fds = self.fs.leaked_fds
            if self.model.trimmed:
                self.result.known[Known.LONG_DEDUP_WINDOW.value] += self.model.trimmed
        return self.result

    def closed_left_open(self, exc: BaseException) -> None:
        """A store call failed: close any index it left open (`Known.INDEX_LEFT_OPEN`)."""
        closed = _close_indexes_left_open(exc)
        if not closed:
            return
        if Known.INDEX_LEFT_OPEN not in self.known:
            raise Mismatch(
                "index-left-open",
                f"{type(exc).__name__}: {exc} ({_store_frame(exc)}) left {closed} index open",
            ) from exc
        self.result.known[Known.INDEX_LEFT_OPEN.value] += closed

    def fail(self, failure: Mismatch) -> None:
        """Record the failed check; the life ends."""
        self.result.failure = failure
        self.result.failed_at = self.index
        self.note(f"FAILED {failure}")

    def note(self, line: str) -> None:
        """Add to the trace (kept only when asked for; the work directory reads `<dir>`)."""
        if self.tracing:
            self.result.trace.append(line.replace(str(self.root.parent), "<dir>"))

    def run_event(self, ev: Event) -> None:
        """One event, its fault bookkeeping, and the checks after it."""
        if ev.kind in JOURNAL_ONLY and not self.journal:
            return
        handler = getattr(self, "_ev_" + ev.kind.name.lower())
        fired_before = self.fs.stats.injected.total()
        try:
            handler(ev)
        except Mismatch:
            raise
        except Exception as exc:
            if not self.excused(fired_before):
                where = _store_frame(exc)
                raise Mismatch("exception", f"{ev}: {type(exc).__name__}: {exc} ({where})") from exc
            self.note(f"    excused {type(exc).__name__}: {exc}")
        misuses = self.fs.take_misuses()
        if misuses and Known.ROLLOVER_CLOSES_TWICE in self.known:
            rollover = [m for m in misuses if _HEAD_MISUSE.match(m)]
            self.result.known[Known.ROLLOVER_CLOSES_TWICE.value] += len(rollover)
            misuses = [m for m in misuses if m not in rollover]
        if misuses:
            raise Mismatch("fd-misuse", f"{ev}: {misuses[0]}")
        fired = self.fs.take_fired()
        self.faults_since_open += len(fired)
        if fired:
            self.note(f"    faults {[(k.value, call, Path(p).name) for k, call, p in fired]}")
        if self.crash_next and ev.kind is not Kind.CRASH:
            self.crash_next = False
            if not self.fs.crashed():
                self.fs.crash_now()
        if self.fs.crashed():
            self.crash_restart()
            return
        if self.fault_span:
            self.fault_span -= 1
            if not self.fault_span:
                self.fs.disarm_fault()
        if self.store is None:
            return
        if ev.kind in STEP_KINDS:
            self.check_fault_outcome(fired)
        if self.failed():
            self.failed_events += 1
            if self.failed_events >= 2:
                self.note("    the store failed: restart")
                self.restart(free_disk=True)
            return
        full = self.index % FULL_CHECK_EVERY == 0 or ev.kind in (Kind.GC, Kind.CHECKPOINT)
        self.live_check(ALL_DESTS if full else sorted(self.touched))
        self.touched.clear()

    def excused(self, fired_before: int) -> bool:
        """Whether an exception may come from a store call: the process crashed, a fault fired,
        the disk is full, or the store had already failed."""
        return (
            self.fs.crashed()
            or self.fs.stats.injected.total() > fired_before
            or self.fs.capacity_bytes is not None
            or self.failed()
        )

    def check_fault_outcome(self, fired: list[tuple[FaultKind, str, str]]) -> None:
        """An injected error in a step's writes must fail the store; a short write must not."""
        if not self.journal or self.store is None:
            return
        hard = [
            (kind, call, path)
            for kind, call, path in fired
            if kind is not FaultKind.SHORT
            and call != "pread"
            # The preallocator's failures are swallowed (rollover then makes the file itself).
            and not (path.endswith(".spare") and call != "rename")
        ]
        if hard and not self.failed():
            kind, call, path = hard[0]
            raise Mismatch(
                "unreported", f"{kind.value} injected into {call} of {path}, store not failed"
            )
        only_short = fired and all(kind is FaultKind.SHORT for kind, _, _ in fired)
        if (
            only_short
            and self.failed()
            and self.failed_events == 0
            and self.fs.capacity_bytes is None
        ):
            raise Mismatch("short-write", f"a short write failed the store: {fired}")

    # -- steps -----------------------------------------------------------------------------------

    @property
    def s(self) -> MemoryStore | JournalStore:
        """The open store."""
        assert self.store is not None
        return self.store

    def failed(self) -> bool:
        """Whether the open store reports a write error (it then refuses writes)."""
        return self.store is not None and self.store.stats().write_errors > 0

    def step(self, submit: Callable[[list[_Op]], None], *, settle: bool = True) -> None:
        """Submit a step's operations (one batch), wait for them, check their handles, and apply
        their outcomes to the model. `settle=False`: the batch says nothing of what is in doubt
        (the barrier that holds the writer of a store just opened, before the model is checked)."""
        store = self.s
        failed_before = self.failed()
        ops: list[_Op] = []
        try:
            submit(ops)
        finally:
            self.barriers += 1
            barrier = store.commit(f"sim-barrier-{self.barriers}", [], _barrier_mark)
            ops.append(_Op(barrier, _noop, writes=False))
            self.sink.release()
        self.result.steps += 1
        handles = [op.handle for op in ops]
        if self.fs.capacity_bytes is not None and not self.sink.wait(handles, FULL_DISK_WAIT_S):
            # A writer that waits for space rather than failing: free the disk, as an operator
            # would, and it must go on.
            self.note("    the writer waits on the full disk: disk freed")
            self.fs.capacity_bytes = None
        if not self.sink.wait(handles, WAIT_S):
            pending = [h for h in handles if h not in self.sink.take()]
            raise Mismatch("hang", f"handles not completed within {WAIT_S} s: {pending[:5]}")
        self.check_handles(ops, failed_before)
        for op in ops:
            op.effect(op.handle.state)
        if settle and not self.failed() and not self.fs.crashed():
            self.model.settle()
        if self.tracing and len(ops) > 1:
            self.note("    " + " ".join(op.handle.state.name for op in ops[:-1]))

    def check_handles(self, ops: list[_Op], failed_before: bool) -> None:
        """Every handle delivered once, complete, with an error iff FAILED; nothing written once
        the store has failed."""
        delivered = self.sink.take()
        counts = Counter(id(h) for h in delivered)
        mine = {id(op.handle) for op in ops}
        for h in delivered:
            if id(h) not in mine and id(h) in self.handles_seen:
                raise Mismatch("delivery", f"{h} delivered again in a later batch")
        for op in ops:
            h = op.handle
            self.handles_seen[id(h)] = h
            if counts[id(h)] != 1:
                raise Mismatch("delivery", f"{h} delivered {counts[id(h)]} times")
            if not h.done:
                raise Mismatch("handle", f"{h} delivered but not done")
            if (h.state is WriteState.FAILED) != isinstance(h.error, StoreError):
                raise Mismatch("handle", f"{h} with error {h.error!r}")
            if failed_before and op.writes and h.state is WriteState.WRITTEN:
                raise Mismatch("refused", f"{h}: a write completed after the store failed")

    def writer_call(self, fn: Callable[[], object]) -> object:
        """Run a call that waits for the writer (gc, checkpoint), then hold the writer again."""
        self.sink.release()
        try:
            return fn()
        finally:
            if self.store is not None and not self.fs.crashed():
                self.step(lambda ops: None)

    def load_all(self, dests: Sequence[str] = ALL_DESTS) -> dict[str, list[StoredMessage]]:
        """Every message of these destinations, read in pages."""
        out: dict[str, list[StoredMessage]] = {}
        for dest in dests:
            messages: list[StoredMessage] = []
            after = 0
            while True:
                page = self.s.load(dest, after, _LOAD_PAGE, 64 * 1024)
                if not page:
                    break
                messages.extend(page)
                after = page[-1].seq
            out[dest] = messages
        return out

    def live_check(self, dests: Sequence[str]) -> None:
        """What the running store serves from these destinations against the model."""
        fired_before = self.fs.stats.injected.total()
        try:
            loaded = self.load_all(dests)
        except StoreError as exc:
            if self.fs.stats.injected.total() > fired_before:
                self.fs.take_fired()
                self.note(f"    load failed on an injected read error: {exc}")
                return
            raise Mismatch("load", f"{type(exc).__name__}: {exc}") from exc
        self.model.check_messages(loaded)
        for dest in dests:
            want = loaded[dest][0].seq if loaded[dest] else 0
            got = self.s.first_seq(dest)
            if got != want:
                raise Mismatch("first-seq", f"{dest}: first_seq {got}, load starts at {want}")

    # -- opening and closing ---------------------------------------------------------------------

    def config(self, *, repair: bool = False) -> StoreConfig:
        """The journal settings of this life."""
        c = self.life.config
        return StoreConfig(
            data_dir=self.root,
            journal_file_bytes=c.file_bytes,
            sync=c.sync,
            checkpoint_interval_s=3600.0,
            index_write_batch=c.index_write_batch,
            archive=c.archive,
            compaction_live_ratio=c.compaction_live_ratio,
            gc_interval_s=3600.0,
            repair=repair,
            verify_journal=c.verify_journal,
            lmdb_map_bytes=64 * MiB,
        )

    def open_store(self, *, exact: bool, repair: bool = False, retry: bool = True) -> None:
        """Open (recovering), hold the writer, and check what is stored against the model."""
        store: MemoryStore | JournalStore
        if self.journal:
            self.fs.forget_unsynced()
            store = JournalStore(
                self.config(repair=repair), dedup_window=self.life.config.dedup_window
            )
        else:
            if self.memory is None:
                self.memory = self.make_memory(self.life.config.dedup_window)
            store = self.memory
        fired_before = self.fs.stats.injected.total()
        try:
            recovery = store.open(self.sink)
        except Exception as exc:
            _release(store)
            self.closed_left_open(exc)
            if self.fs.crashed():
                return
            if retry and (
                self.fs.stats.injected.total() > fired_before or self.fs.capacity_bytes is not None
            ):
                self.note(f"    open failed under a fault or a full disk: {exc}; retried")
                self.fs.capacity_bytes = None
                self.fs.disarm_fault()
                self.open_store(exact=False, repair=repair, retry=False)
                return
            raise Mismatch("open", f"{type(exc).__name__}: {exc}") from exc
        self.store = store
        self.failed_events = 0
        self.faults_since_open = 0
        self.result.opens += 1
        if self.fs.crashed():
            return
        self.step(lambda ops: None, settle=False)
        self.check_recovery(recovery, exact=exact)

    def check_recovery(self, recovery: Recovery, *, exact: bool) -> None:
        """What the open found against the model; then the model takes it as exact."""
        loaded = self.load_all()
        if self.tracing and recovery.report:
            self.note("    recovery: " + " | ".join(recovery.report))
        for line in recovery.report:
            if "already open in this process" in line:
                raise Mismatch("close-leak", f"a store closed earlier left its index open: {line}")
        self.model.check_recovery(recovery, loaded, exact=exact)
        self.model.resolve(recovery, loaded)

    def close_store(self) -> bool:
        """Close; returns whether it was clean after a healthy run (nothing then in doubt)."""
        store = self.store
        if store is None:
            return False
        healthy = not self.failed() and self.faults_since_open == 0
        if not self.journal:
            for tx in self.model.txs.values():
                store.abort(tx.txid)  # the core aborts them when their connections go
        fired_before = self.fs.stats.injected.total()
        self.sink.release()
        self.store = None
        try:
            store.close()
        except Exception as exc:
            if _release(store) and not self.fs.crashed():
                raise Mismatch(
                    "close-leak",
                    f"close() raised {type(exc).__name__}: {exc} ({_store_frame(exc)}) before "
                    "closing the index",
                ) from exc
            if not (
                self.fs.crashed() or self.fs.stats.injected.total() > fired_before or not healthy
            ):
                raise Mismatch("close", f"{type(exc).__name__}: {exc}") from exc
            self.note(f"    close failed: {type(exc).__name__}: {exc}")
            healthy = False
        self.model.drop_txs()
        return healthy and not self.fs.crashed() and self.fs.stats.injected.total() == fired_before

    def restart(self, *, free_disk: bool = False, repair: bool = False) -> None:
        """Close and open again."""
        exact = self.close_store()
        if self.fs.crashed():
            return
        if free_disk:
            self.fs.capacity_bytes = None
            self.fs.disarm_fault()
        self.open_store(exact=exact, repair=repair)

    def crash_restart(self) -> None:
        """The process died: drop the dead store, put the crash image in place, open it."""
        self.note("    crashed: restart from the crash image")
        self.fs.revive()
        store, self.store = self.store, None
        if store is not None:
            self.sink.release()
            try:
                store.close()
            except Exception:  # the process is dead: whatever it held is released
                _release(store)
        shutil.rmtree(self.root, ignore_errors=True)
        os.rename(self.fs.image, self.root)
        self.crash_next = False
        self.fault_span = 0
        self.model.drop_txs()
        self.open_store(exact=False)

    def abandon(self) -> None:
        """After a failure or at the end: release whatever is still open."""
        store, self.store = self.store, None
        if store is not None:
            self.fs.revive()
            self.sink.release()
            try:
                store.close()
            except Exception:
                _release(store)

    def finish(self) -> None:
        """Consumers drain everything; GC brings the disk back under its bound; a clean close,
        verify and open find exactly what the model holds."""
        if self.crash_next or self.fs.crashed():
            if not self.fs.crashed():
                self.fs.crash_now()
            self.crash_restart()
        self.fs.capacity_bytes = None
        self.fs.disarm_fault()
        self.fault_span = 0
        if self.store is None or self.failed():
            self.restart(free_disk=True)
        self.note("--- drain")
        for slot, tx in list(self.model.txs.items()):
            self.s.abort(tx.txid)
            self.model.abort(slot)

        def drain(ops: list[_Op]) -> None:
            for dest, dm in self.model.dests.items():
                if dm.msgs:
                    handle = self.s.remove_range(dest, max(dm.msgs))
                    ops.append(_Op(handle, partial(self.model.remove_range, dest, max(dm.msgs))))

        self.step(drain)
        if self.model.message_count():
            raise Mismatch("drain", f"{self.model.message_count()} messages left after draining")
        if isinstance(self.store, JournalStore):
            store = self.store
            results = [self.writer_call(store.gc) for _ in range(3)]
            self.check_disk(results)
        exact = self.close_store()
        if self.journal:
            self.verify(exact=exact)
        self.open_store(exact=exact)
        self.close_store()

    def check_disk(self, results: list[object]) -> None:
        """After draining and collecting, the journal is back to a few files."""
        if self.life.config.compaction_live_ratio <= 0:
            return  # without compaction, state records keep old files (as KahaDB)
        files = list_files(self.root / "journal")
        if len(files) > DISK_BOUND_FILES:
            raise Mismatch(
                "disk",
                f"{len(files)} data files left after draining and three collections: "
                f"{files} ({results})",
            )

    def verify(self, *, exact: bool) -> None:
        """`sluice store verify` on the closed store: clean after a clean close, at most a torn
        tail after a failure."""
        report = tools.verify(self.root, self.config())
        problems = [p for p in report.problems if exact or "torn tail" not in p]
        if problems:
            raise Mismatch("verify", "; ".join(problems))

    # -- events ----------------------------------------------------------------------------------

    def add(self, ops: list[_Op], m: StoredMessage) -> None:
        """A non-transacted add in a step."""
        fields = fields_of(m)
        dedup = m.headers.get(DEDUP_HEADER)
        self.touched.add(m.destination)
        handle = self.s.add(m, None)
        ops.append(_Op(handle, partial(self.model.add, m.destination, m.seq, fields, dedup)))

    def remove(self, ops: list[_Op], dest: str, seq: int) -> None:
        """A non-transacted remove in a step."""
        self.touched.add(dest)
        ops.append(_Op(self.s.remove(dest, seq), partial(self.model.remove, dest, seq)))

    def pick(self, dest: str, ev: Event, count: int = 1) -> list[int]:
        """`count` surely stored messages of `dest`, chosen by the event's fraction."""
        seqs = self.model.sure_seqs(dest)
        if not seqs:
            return []
        start = int(ev.pick * len(seqs))
        return sorted({seqs[(start + k) % len(seqs)] for k in range(min(count, len(seqs)))})

    def _ev_send(self, ev: Event) -> None:
        dest = DESTS[ev.d]

        def submit(ops: list[_Op]) -> None:
            for i in range(ev.n):
                self.add(ops, _message(ev, i, dest, self.model.next_seq(dest)))

        self.step(submit)

    def _ev_send_ack(self, ev: Event) -> None:
        dest = DESTS[ev.d]

        def submit(ops: list[_Op]) -> None:
            seqs = []
            for i in range(ev.n):
                seqs.append(self.model.next_seq(dest))
                self.add(ops, _message(ev, i, dest, seqs[-1]))
            for i, seq in enumerate(seqs):
                if (i + ev.uid) % 2 == 0:
                    self.remove(ops, dest, seq)

        self.step(submit)

    def _ev_ack(self, ev: Event) -> None:
        dest = DESTS[ev.d]
        victims = self.pick(dest, ev, ev.n)
        if not victims:
            return

        def submit(ops: list[_Op]) -> None:
            for seq in victims:
                self.remove(ops, dest, seq)

        self.step(submit)

    def _ev_ack_range(self, ev: Event) -> None:
        dest = DESTS[ev.d]
        upto = self.pick(dest, ev)
        if not upto:
            return

        def submit(ops: list[_Op]) -> None:
            self.touched.add(dest)
            handle = self.s.remove_range(dest, upto[0])
            ops.append(_Op(handle, partial(self.model.remove_range, dest, upto[0])))

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

        def submit(ops: list[_Op]) -> None:
            if not transacted:
                self.add(ops, original.message(dlq, self.model.next_seq(dlq), {DLQ_REASON: reason}))
                self.remove(ops, dest, seq)
                return
            copy = original.message(dlq, 0, {DLQ_REASON: reason})
            self.touched.update((dest, dlq))
            txid = f"dlq.{ev.uid}"
            self.s.begin(txid)
            tx = self.model.begin(DLQ_SLOT, txid)
            ops.append(_Op(self.s.add(copy, None, txid), _noop))
            tx.adds.append(TxAdd(dlq, fields_of(copy), copy.headers.get(DEDUP_HEADER)))
            ops.append(_Op(self.s.remove(dest, seq, None, txid), _noop))
            tx.removes.append((dest, seq))
            seqs = [self.model.next_seq(dlq)]
            commit = self.s.commit(txid, seqs, None)
            ops.append(_Op(commit, partial(self.model.commit, DLQ_SLOT, seqs)))

        self.step(submit)

    def _ev_stream(self, ev: Event) -> None:
        dest = DESTS[ev.d]

        def submit(ops: list[_Op]) -> None:
            offset = 0
            for i in range(ev.n):
                extra = {
                    "x-stream-id": f"s{ev.uid}",
                    "x-stream-seq": str(i),
                    "x-stream-offset": str(offset),
                }
                if i == ev.n - 1:
                    extra["x-stream-end"] = "true"
                m = _message(ev, i, dest, self.model.next_seq(dest), extra)
                offset += len(m.body)
                self.add(ops, m)

        self.step(submit)

    def _ev_mark(self, ev: Event) -> None:
        dest = DESTS[ev.d]
        seq = int(ev.pick * self.model.dests[dest].high)
        if Known.ZERO_MARK_PINS in self.known and seq == 0:
            seq = 1
            self.result.known[Known.ZERO_MARK_PINS.value] += 1

        def submit(ops: list[_Op]) -> None:
            ops.append(_Op(self.s.mark_dispatched(dest, seq), partial(self.model.mark, dest, seq)))

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

        def submit(ops: list[_Op]) -> None:
            for i in range(ev.n):
                m = _message(ev, i, dest, 0)
                tx.adds.append(TxAdd(dest, fields_of(m), m.headers.get(DEDUP_HEADER)))
                ops.append(_Op(self.s.add(m, None, txid), _noop))

        self.step(submit)

    def _ev_tx_ack(self, ev: Event) -> None:
        dest = DESTS[ev.d]
        victim = self.pick(dest, ev)
        if not victim:
            return
        txid = self.tx(ev)
        self.model.txs[ev.slot].removes.append((dest, victim[0]))
        self.step(lambda ops: ops.append(_Op(self.s.remove(dest, victim[0], None, txid), _noop)))

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
        self.step(lambda ops: ops.append(_Op(handle_of(), effect, writes=writes)))

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

        def submit(ops: list[_Op]) -> None:
            handle = self.s.put_subscription(RecoveredSubscription(*key, dest, selector, cursor))
            record = RecoveredSubscription(*key, dest, selector, cursor)
            ops.append(_Op(handle, partial(self.model.sub_put, key, record)))

        self.step(submit)

    def _ev_sub_cursor(self, ev: Event) -> None:
        key = SUBS[ev.slot]
        sub = self.model.subs.get(key)
        cursor = (sub.latest[2] if sub is not None else 0) + ev.n + 1

        def submit(_ops: list[_Op]) -> None:
            self.s.set_cursor(*key, cursor)
            self.model.sub_cursor(key, cursor)

        self.step(submit)

    def _ev_sub_delete(self, ev: Event) -> None:
        key = SUBS[ev.slot]
        self.step(
            lambda ops: ops.append(
                _Op(self.s.delete_subscription(*key), partial(self.model.sub_delete, key))
            )
        )

    def _ev_delete_dest(self, ev: Event) -> None:
        dest = DESTS[ev.d]
        self.touched.add(dest)
        self.step(
            lambda ops: ops.append(
                _Op(self.s.delete_destination(dest), partial(self.model.delete_dest, dest))
            )
        )

    def _ev_gc(self, _ev: Event) -> None:
        store = self.s
        assert isinstance(store, JournalStore)
        result = self.writer_call(store.gc)
        self.note(f"    {result}")

    def _ev_checkpoint(self, _ev: Event) -> None:
        store = self.s
        assert isinstance(store, JournalStore)
        self.writer_call(store.checkpoint)

    def _ev_restart(self, _ev: Event) -> None:
        self.restart()

    def _ev_crash(self, ev: Event) -> None:
        torn = ((ev.uid * 37) % 100) / 100 if ev.opt & OPT_TORN else None
        self.fs.arm_crash(CrashPlan(ev.after, torn, bool(ev.opt & OPT_POWER)))
        self.crash_next = True

    def _ev_fault(self, ev: Event) -> None:
        self.fs.arm_fault(_fault_of(ev))
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


def _memory_store(dedup_window: int) -> MemoryStore:
    return MemoryStore(dedup_window=dedup_window)


@contextlib.contextmanager
def _workdir() -> Iterator[Path]:
    base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    path = Path(tempfile.mkdtemp(prefix="sluice-sim-", dir=base))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def run_life(
    kind: StoreKind,
    life: Life,
    events: Sequence[Event] | None = None,
    *,
    trace: bool = False,
    known: frozenset[Known] = ALL_KNOWN,
    make_memory: Callable[[int], MemoryStore] = _memory_store,
) -> LifeResult:
    """Play `life` (or the given events with its configuration) against a fresh store, stepping
    around the `known` issues. `make_memory` builds the memory store from the dedup window
    (tests plant faulty ones to see the checks fail)."""
    switch = sys.getswitchinterval()
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    try:
        with _workdir() as workdir:
            events = life.events if events is None else events
            runner = _Runner(
                kind, life, events, workdir, trace=trace, known=known, make_memory=make_memory
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
    make_memory: Callable[[int], MemoryStore] = _memory_store,
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
        result = run_life(kind, life, candidate, known=known, make_memory=make_memory)
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
) -> Report:
    """Run `seed`'s life; when it fails, shrink it and format the report."""
    life = generate(seed)
    result = run_life(kind, life, trace=trace, known=known)
    if result.failure is None:
        return Report(result)
    started = time.monotonic()
    shrunk, runs = shrink(kind, life, result, shrink_s, known)
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
