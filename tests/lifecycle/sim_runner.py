"""The machinery of a simulated store life: opening, closing and crashing the store, running a
step (one batch) and checking its handles, reading back and checking against the model after
every step and restart, and the final drain. `store_sim.LifePlayer` adds what each event does."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections import Counter
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path

from sluice.config import MiB, StoreConfig, SyncPolicy
from sluice.errors import DiskFullError, StoreError, StoreIOError
from sluice.store.api import (
    Recovery,
    StoredMessage,
    WriteHandle,
    WriteState,
)
from sluice.store.journal import tools
from sluice.store.journal.files import list_files
from sluice.store.journal.store import JournalStore
from sluice.store.memory import MemoryStore
from sluice.store.postgres.store import PostgresStore

from .faultfs import FaultFS, FaultKind
from .sim_events import (
    ALL_DESTS,
    JOURNAL_ONLY,
    OPT_POWER,
    OPT_TORN,
    Event,
    Kind,
    Life,
)
from .sim_harness import (
    Known,
    LifeResult,
    Op,
    Sink,
    StoreKind,
    barrier_mark,
    close_indexes_left_open,
    noop,
    release_store,
    store_frame,
)
from .sim_model import Mismatch, Model, Outcome
from .sim_postgres import PgTarget, drop_schema, life_schema, terminate_backend

WAIT_S = 20.0  # a step's handles must all complete within this
FULL_DISK_WAIT_S = 0.5  # a writer waiting for space on a full disk gets it back after this
DISK_BOUND_FILES = 2  # data files left once everything is consumed and collected
COMPACT_MAX_ROUNDS = 20  # `sluice store compact` collects until nothing changes; it must end
_LOAD_PAGE = 7
FULL_CHECK_EVERY = 8  # between restarts, all destinations are read back every this many events
_HEAD_WRITES = frozenset({"pwritev", "pwrite", "write"})
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


class Runner:
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
        pg: PgTarget | None = None,
    ) -> None:
        self.kind = kind
        self.life = life
        self.known = known
        self.make_memory = make_memory
        self.events = events
        self.root = workdir / "data"
        self.journal = kind is StoreKind.JOURNAL
        self.postgres = kind is StoreKind.POSTGRES
        self.pg = pg
        self.schema = life_schema(life.seed) if self.postgres else ""
        # The `opt` of a crash armed for the next event of a PostgreSQL life.
        self.pg_crash = 0
        # Removes nobody waits for and cursor moves are written without a sync of their own.
        self.lazy_acks = (
            self.journal and life.config.sync is SyncPolicy.ALWAYS and not life.config.sync_acks
        ) or (self.postgres and not life.config.sync_acks)
        self.fs = FaultFS(self.root, workdir / "image")
        self.model = Model(life.config.dedup_window, trim_windows=Known.LONG_DEDUP_WINDOW in known)
        self.sink = Sink(hold=self.journal or self.postgres)
        self.store: MemoryStore | JournalStore | PostgresStore | None = None
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
        self.event_outcomes: list[tuple[Op, Outcome]] = []

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
                    where = store_frame(exc)
                    self.fail(Mismatch("exception", f"{type(exc).__name__}: {exc} ({where})"))
                finally:
                    self.abandon()
                    if self.postgres and self.pg is not None:
                        drop_schema(self.pg.url, self.schema)
        finally:
            self.result.faults.update(self.fs.stats.injected)
            self.result.crashes = self.fs.stats.crashes
            self.result.leaked_fds = self.fs.leaked_fds
            if self.model.trimmed:
                self.result.known[Known.LONG_DEDUP_WINDOW.value] += self.model.trimmed
        return self.result

    def closed_left_open(self, exc: BaseException) -> None:
        """A store call failed: close any index it left open (`Known.INDEX_LEFT_OPEN`; after a
        crash nothing is a leak: the process is gone)."""
        closed = close_indexes_left_open(exc)
        if not closed or self.fs.crashed():
            return
        if Known.INDEX_LEFT_OPEN not in self.known:
            raise Mismatch(
                "index-left-open",
                f"{type(exc).__name__}: {exc} ({store_frame(exc)}) left {closed} index open",
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
        # A PostgreSQL life crashes too (`sim_postgres`); the file-level events are the journal's.
        pg_crash = self.postgres and ev.kind is Kind.CRASH
        if ev.kind in JOURNAL_ONLY and not self.journal and not pg_crash:
            return
        handler = getattr(self, "_ev_" + ev.kind.name.lower())
        fired_before = self.fs.stats.injected.total()
        self.event_outcomes = []
        try:
            handler(ev)
        except Mismatch:
            raise
        except Exception as exc:
            if not self.excused(fired_before):
                where = store_frame(exc)
                raise Mismatch("exception", f"{ev}: {type(exc).__name__}: {exc} ({where})") from exc
            self.note(f"    excused {type(exc).__name__}: {exc}")
        misuses = self.fs.take_misuses()
        if misuses:
            raise Mismatch("fd-misuse", f"{ev}: {misuses[0]}")
        fired = self.fs.take_fired()
        self.faults_since_open += len(fired)
        if fired:
            self.note(f"    faults {[(k.value, call, Path(p).name) for k, call, p in fired]}")
        if self.crash_next and ev.kind is not Kind.CRASH and self.postgres:
            self.crash_next = False
            self.pg_crash_restart()
            return
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
        """An I/O error in a step's writes or syncs, or a lack of room in the middle of writing
        the head file, must fail the store; a short write must not. (A lack of room before any
        byte of a batch may be absorbed: the batch refused, a checkpoint put off. The model then
        checks that nothing refused happened and nothing written is lost.)"""
        if not self.journal or self.store is None:
            return
        hard = [
            (kind, call, path)
            for kind, call, path in fired
            if kind is not FaultKind.SHORT
            and call != "pread"
            # A spare made ahead may fail (it is made again when needed); only taking it matters.
            and not (path.endswith(".spare") and call != "rename")
            and (kind is FaultKind.EIO or (call in _HEAD_WRITES and not path.endswith(".spare")))
        ]
        if hard and not self.failed():
            kind, call, path = hard[0]
            raise Mismatch(
                "unreported", f"{kind.value} injected into {call} of {path}: the store goes on"
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
    def s(self) -> MemoryStore | JournalStore | PostgresStore:
        """The open store."""
        assert self.store is not None
        return self.store

    def failed(self) -> bool:
        """Whether the open store reports a write error (it then refuses writes)."""
        return self.store is not None and self.store.stats().write_errors > 0

    def step(self, submit: Callable[[list[Op]], None], *, settle: bool = True) -> None:
        """Submit a step's operations (one batch), wait for them, check their handles, and apply
        their outcomes to the model. `settle=False`: the batch says nothing of what is in doubt
        (the barrier that holds the writer of a store just opened, before the model is checked)."""
        store = self.s
        failed_before = self.failed()
        refused_before = store.stats().no_space_errors
        ops: list[Op] = []
        try:
            submit(ops)
        finally:
            self.barriers += 1
            barrier = store.commit(f"sim-barrier-{self.barriers}", [], barrier_mark)
            ops.append(Op(barrier, noop, writes=False))
            if self.crash_next and self.pg_crash & OPT_TORN and isinstance(store, PostgresStore):
                # The batch is queued and the writer held: the server ends its connections.
                assert self.pg is not None
                for pid in store.writer_backend_pids:
                    terminate_backend(self.pg.url, pid)
                self.note("    every writer connection terminated by the server")
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
        outcomes = [self.outcome(op) for op in ops]
        self.event_outcomes += zip(ops, outcomes, strict=True)
        synced = False
        for op, outcome in zip(ops, outcomes, strict=True):
            op.effect(outcome)
            if outcome is Outcome.WRITTEN and op.writes and not op.lazy:
                # Its batch was synced after every record before it was written.
                self.model.synced()
                synced = True
        # A refused batch puts its cursor moves back for a later one: nothing to settle then.
        # Lazy cursor moves (written with the step's first batch) are on disk once a batch of
        # the step was synced.
        refused = store.stats().no_space_errors > refused_before
        if (
            settle
            and (synced or not self.lazy_acks)
            and not refused
            and not self.failed()
            and not self.fs.crashed()
        ):
            self.model.settle()
        if self.tracing and len(ops) > 1:
            self.note("    " + " ".join(o.name for o in outcomes[:-1]))

    def outcome(self, op: Op) -> Outcome:
        """How the model sees an op's end: a write refused for lack of room (DiskFullError with
        the store going on) never happened; any other failure is in doubt."""
        h = op.handle
        if h.state is WriteState.WRITTEN:
            return Outcome.WRITTEN
        if h.state is WriteState.CANCELLED:
            return Outcome.CANCELLED
        if isinstance(h.error, DiskFullError) and not self.failed():
            if op.writes and not op.refusable:
                raise Mismatch(
                    "refused", f"{h}: refused for lack of room, yet its record cannot be refused"
                )
            return Outcome.REFUSED
        return Outcome.FAILED

    def check_handles(self, ops: list[Op], failed_before: bool) -> None:
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

    def request(self, fn: Callable[[], object]) -> object:
        """A GC or checkpoint. An I/O error in it (not a refusal for lack of room: nothing was
        written then) must fail the store like one in a batch: its bytes may be half written, or
        a sync may have failed, which a later sync of the same file does not make good."""
        try:
            return self.writer_call(fn)
        except StoreIOError as exc:
            if isinstance(exc, DiskFullError) or self.failed() or self.fs.crashed():
                raise
            if Known.REQUEST_ERRORS_IGNORED not in self.known:
                raise Mismatch(
                    "unreported", f"{exc} ({store_frame(exc)}): the store goes on"
                ) from exc
            self.result.known[Known.REQUEST_ERRORS_IGNORED.value] += 1
            self.note(f"    the store went on after {exc}: restart")
            # Not a clean run: the failed checkpoint took the cancelled adds' sequences along.
            self.faults_since_open += 1
            self.restart()
            return None

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
            # Lazy removes are synced by a later batch, a checkpoint, a rollover or the close;
            # the timer that would sync them is out of play, as the others are.
            sync_interval_ms=3_600_000,
            sync_acks=c.sync_acks,
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
        store: MemoryStore | JournalStore | PostgresStore
        if self.postgres:
            assert self.pg is not None
            store = PostgresStore(
                self.pg.url,
                schema=self.schema,
                dedup_window=self.life.config.dedup_window,
                sync_acks=self.life.config.sync_acks,
            )
        elif self.journal:
            # What earlier runs wrote counts as on disk from now on.
            self.fs.forget_unsynced()
            self.model.synced()
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
            release_store(store)
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
        if self.kind is StoreKind.MEMORY:
            for tx in self.model.txs.values():
                store.abort(tx.txid)  # the core aborts them when their connections go
        fired_before = self.fs.stats.injected.total()
        self.sink.release()
        self.store = None
        try:
            store.close()
        except Exception as exc:
            if release_store(store) and not self.fs.crashed():
                if Known.CLOSE_STOPS_EARLY not in self.known:
                    raise Mismatch(
                        "close-leak",
                        f"close() raised {type(exc).__name__}: {exc} ({store_frame(exc)}) "
                        "before closing the index",
                    ) from exc
                self.result.known[Known.CLOSE_STOPS_EARLY.value] += 1
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
                release_store(store)
        shutil.rmtree(self.root, ignore_errors=True)
        os.rename(self.fs.image, self.root)
        if self.fs.power_lost:
            self.model.lose_unsynced()
        self.crash_next = False
        self.fault_span = 0
        self.model.drop_txs()
        self.open_store(exact=False)

    def pg_crash_restart(self) -> None:
        """The broker process died (see `sim_postgres`): drop the store without closing it,
        crash and restart the server too on a power loss, open again."""
        store, self.store = self.store, None
        if isinstance(store, PostgresStore):
            self.sink.release()
            store.abandon()
        if self.pg_crash & OPT_POWER:
            assert self.pg is not None
            self.note("    crashed, the server too: pg_ctl -m immediate, start")
            self.pg.restart()
            # Lazy removes and cursor moves not yet flushed from the server's WAL buffers.
            self.model.lose_unsynced()
        else:
            self.note("    crashed: the store dropped without close")
        self.pg_crash = 0
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
                release_store(store)

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

        def drain(ops: list[Op]) -> None:
            for dest, dm in self.model.dests.items():
                if dm.msgs:
                    handle = self.s.remove_range(dest, max(dm.msgs))
                    ops.append(Op(handle, partial(self.model.remove_range, dest, max(dm.msgs))))

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
