"""Process-level lifecycle simulation: one life of a real broker subprocess.

A life (`process_events.generate(seed)`) is a list of events run one after another against a
`sluice broker` on the journal store, with stomp.py clients: sends, consumes with ACK/NACK,
durable subscriptions, transactions (some spanning file rollover), x-dedup-id resends, expiry,
streams, GC, clean stops with `sluice store verify`, SIGKILLs at chosen moments (while a
background producer waits for its k-th receipt, mid-commit, mid-stop), offline tools between
runs, `--repair` starts, and a disk that fills and frees. `process_model.Model` records what must
exist; after every restart a sweep (`process_sweep`) reads every queue, dead-letter queue and
durable subscription and checks it; the life ends with a sweep that acknowledges everything, a
bounded wait for the journal to shrink under a bound, a clean stop and `verify`. A broken rule
raises `SimFailure`; `process_run` shrinks and reports.

The same seed always gives the same events and the same choices within them; only the exact
instant of a kill relative to the broker's own threads varies, which is why every kill is tied
to a receipt or a log line rather than to a clock.
"""

from __future__ import annotations

import contextlib
import hashlib
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lifecycle.process_events import (
    JOURNAL_FILE_BYTES,
    SMALL_DISK_BYTES,
    Consume,
    Crash,
    DiskFull,
    DurableConsume,
    DurableCreate,
    DurableDelete,
    Event,
    Resend,
    Restart,
    Send,
    Settings,
    Stop,
    Stream,
    Transaction,
    WaitGc,
)
from lifecycle.process_io import Broker, BrokerGone, SimClient, SmallDisk
from lifecycle.process_load import BackgroundLoad
from lifecycle.process_model import (
    DURABLES,
    QUEUES,
    Expiry,
    Fate,
    Model,
    SimFailure,
    SimMessage,
)
from lifecycle.process_sweep import body_for, headers_for, sweep, take
from sluice.store.journal import tools as journal_tools
from waiting import wait_until

# A SEND on a full disk is refused or held back at once; one held this long is held.
FULL_WAIT_S = 3.0
# Room is measured every 0.25 s; once the disk has room a held producer goes on within this.
RECOVERY_TIMEOUT_S = 15.0
# The broker logs the start and the end of every episode of a full store.
FULL_LOG_LINE = "the store is full"
ROOM_LOG_LINE = "the store has room again"
# After the final drain and GC the journal directory must come back under this many bytes: the
# head file, the spare made ready for rollover, and one older file still pinned by small records.
DISK_BOUND_BYTES = 4 * JOURNAL_FILE_BYTES
Tamper = Callable[[Path], None]


def _poll(condition: Callable[[], bool], timeout_s: float) -> bool:
    """Wait (bounded) for a condition the broker's threads make true; True if it became so."""
    try:
        wait_until(condition, timeout_s)
    except TimeoutError:
        return False
    return True


@dataclass
class LifeStats:
    """What one life did."""

    seed: int
    events: int = 0
    restarts: int = 0
    crashes: int = 0
    clean_stops: int = 0
    sent: int = 0
    acked: int = 0
    gc_passes: int = 0
    compactions: int = 0
    newest_file: int = 0  # the journal's highest data file number: files started in the life
    disk_fulls: int = 0
    seconds: float = 0.0
    timings: list[tuple[float, str]] = field(default_factory=list)  # seconds per event

    def summary(self) -> str:
        """One line."""
        return (
            f"seed {self.seed}: {self.events} events, {self.restarts} restarts "
            f"({self.crashes} crashes, {self.clean_stops} clean stops), {self.sent} sent, "
            f"{self.acked} acked, {self.gc_passes} gc passes, {self.compactions} compactions, "
            f"journal up to db-{self.newest_file}.log, {self.disk_fulls} disk fulls, "
            f"{self.seconds:.1f} s"
        )


class Life:
    """One life: its broker, its model, its events."""

    def __init__(
        self,
        seed: int,
        settings: Settings,
        events: list[Event],
        workdir: Path,
        *,
        tamper: Tamper | None = None,
    ) -> None:
        self.seed = seed
        self.settings = settings
        self.events = events
        self.workdir = workdir
        self.tamper = tamper
        self.model = Model(settings.max_redeliveries)
        self.stats = LifeStats(seed, events=len(events))
        self.disk = SmallDisk(workdir / "disk", SMALL_DISK_BYTES)
        self.data_dir = self.disk.path / "data"
        self.broker = Broker(workdir, settings.config_toml(self.data_dir))
        self._txs = 0
        self._streams = 0
        self._sweeps = 0

    # -- the life -------------------------------------------------------------------------------

    def run(self) -> LifeStats:
        """Run every event and the final checks; raises `SimFailure`."""
        started = time.monotonic()
        self.workdir.mkdir(parents=True, exist_ok=True)
        with contextlib.ExitStack() as cleanup:
            if self.settings.small_disk:
                cleanup.enter_context(self.disk)
            self.disk.path.mkdir(parents=True, exist_ok=True)
            cleanup.callback(self._after, started)
            cleanup.callback(self.broker.kill)  # runs first: the disk goes after the broker
            self.data_dir.mkdir(exist_ok=True)
            self.broker.start()
            for index, event in enumerate(self.events):
                began = time.monotonic()
                try:
                    self._execute(event)
                except SimFailure as failure:
                    failure.add_note(f"at event {index}: {event!r}")
                    raise
                self.stats.timings.append((time.monotonic() - began, repr(event)))
            began = time.monotonic()
            self._finish()
            self.stats.timings.append((time.monotonic() - began, "final checks"))
        return self.stats

    def _after(self, started: float) -> None:
        self._count_logs()
        self.stats.seconds = time.monotonic() - started

    def _execute(self, event: Event) -> None:
        handlers: dict[type[Any], Callable[[Any], None]] = {
            Send: self._send,
            Resend: self._resend,
            Consume: self._consume,
            DurableCreate: self._durable_create,
            DurableConsume: self._durable_consume,
            DurableDelete: self._durable_delete,
            Transaction: self._transaction,
            Stream: self._stream,
            WaitGc: self._wait_gc,
            Crash: self._crash,
            Stop: self._stop,
            DiskFull: self._disk_full,
        }
        try:
            handlers[type(event)](event)
        except BrokerGone as exc:
            state = "running" if self.broker.running else "dead"
            raise SimFailure(
                "connection-lost",
                f"{exc} (broker {state}); broker log:\n{_tail(self.broker.log_text())}",
            ) from exc

    def _finish(self) -> None:
        # Acknowledge everything (twice: the second sweep catches what moved to a DLQ during
        # the first), then everything drained must let the journal shrink.
        self._sweep(ack=True, check_deleted=True)
        self._sweep(ack=True, final=True)
        self._wait_disk_bound()
        self.broker.stop()
        self.stats.clean_stops += 1
        self._verify(after_crash=False)
        logs = "".join(self.broker.logs)
        if "Traceback" in logs:
            at = logs.index("Traceback")
            begin = logs.rfind("\n", 0, max(0, at - 300)) + 1  # from a whole line
            raise SimFailure("broker-traceback", logs[begin : at + 2500])

    def _count_logs(self) -> None:
        logs = "".join(self.broker.logs) + self.broker.log_text()
        self.stats.gc_passes = logs.count("journal gc:")
        self.stats.compactions = logs.count("journal gc: compacted")
        self.stats.sent = len(self.model.messages)
        self.stats.acked = self.model.count([Fate.ACKED])
        self.stats.newest_file = max(
            [int(p.stem.split("-")[1]) for p in self.data_dir.glob("journal/db-*.log")] or [0]
        )

    # -- clients --------------------------------------------------------------------------------

    def _client(self, client_id: str | None = None) -> SimClient:
        return SimClient(self.broker.port, client_id=client_id)

    # -- sending --------------------------------------------------------------------------------

    def _send(self, ev: Send) -> None:
        client = self._client()
        try:
            sent = []
            for _ in range(ev.count):
                dedup = self.model.new_dedup_id() if ev.dedup else None
                msg = self.model.new_message(
                    ev.dest,
                    persistent=ev.persistent,
                    size=ev.size,
                    expiry=Expiry(ev.expiry),
                    dedup=dedup,
                )
                body = body_for(msg.msg_id, msg.size)
                sent.append((client.send(ev.dest, body, headers_for(msg)), msg))
            client.wait_receipts([r for r, _ in sent], "SEND")
            for _, msg in sent:
                self.model.visible(msg, receipted=True)
        finally:
            client.close()

    def _resend(self, ev: Resend) -> None:
        ids = self.model.dedup_ids(ev.dest)
        if not ids:
            return
        rng = random.Random(ev.seed)
        client = self._client()
        try:
            for _ in range(ev.count):
                dedup = rng.choice(ids)
                msg = self.model.new_message(ev.dest, persistent=True, size=200, dedup=dedup)
                accepted = self.model.group_accepted(ev.dest, dedup, before=msg.msg_id)
                body = body_for(msg.msg_id, msg.size)
                client.wait_receipts([client.send(ev.dest, body, headers_for(msg))], "SEND")
                if accepted is True:
                    self.model.forbid(msg, "duplicate")
                elif accepted is False:  # every earlier one was aborted: this one counts
                    self.model.visible(msg, receipted=True)
                else:
                    self.model.visible(msg, receipted=False)
                    with self.model.lock:
                        self.model.dedup_required.add((ev.dest, dedup))
        finally:
            client.close()

    def _stream(self, ev: Stream) -> None:
        self._streams += 1
        sid = f"st{self.seed}-{self._streams}"
        client = self._client()
        tx = f"stx{self._streams}"
        txno = None
        try:
            if ev.transactional:
                self._txs += 1
                txno = self._txs
                client.call("BEGIN", transaction=tx)
            sha = hashlib.sha256()
            offset = 0
            sent = []
            for seq in range(ev.chunks):
                msg = self.model.new_message(
                    ev.dest, persistent=True, size=ev.chunk_bytes, dedup=f"{sid}:{seq}", tx=txno
                )
                body = body_for(msg.msg_id, msg.size)
                sha.update(body.encode())
                extra = {
                    "x-stream-id": sid,
                    "JMSXGroupID": sid,
                    "x-stream-seq": str(seq),
                    "x-stream-offset": str(offset),
                }
                offset += len(body)
                if ev.complete and seq == ev.chunks - 1:
                    extra["x-stream-end"] = "true"
                    extra["x-stream-length"] = str(offset)
                    extra["x-stream-sha256"] = sha.hexdigest()
                if ev.transactional:
                    extra["transaction"] = tx
                sent.append((client.send(ev.dest, body, headers_for(msg, **extra)), msg))
            client.wait_receipts([r for r, _ in sent], "stream chunk")
            if ev.transactional:
                client.call("COMMIT", transaction=tx)
            for _, msg in sent:
                self.model.visible(msg, receipted=True)
        finally:
            client.close()

    # -- consuming ------------------------------------------------------------------------------

    def _consume(self, ev: Consume) -> None:
        wanted = min(ev.count, self.model.surely_available(ev.dest))
        if wanted == 0:
            return
        rng = random.Random(ev.seed)
        client = self._client()
        try:
            client.subscribe(ev.dest, "c", prefetch=ev.prefetch)
            held: dict[int, SimMessage] = {}
            acks: list[tuple[str, SimMessage]] = []
            distinct: set[int] = set()
            while len(distinct) < wanted:
                frame = client.message()
                msg = take(self.model, client, frame, "queue", ev.dest)
                if msg is None:
                    continue
                distinct.add(msg.msg_id)
                held.pop(msg.msg_id, None)
                action = rng.choices(["ack", "nack", "leave"], weights=[6, 2, 2])[0]
                if action == "leave" and len(held) + 2 > ev.prefetch:
                    action = "ack"  # never hold the whole credit: the queue would stall
                if action == "ack":
                    acks.append((client.frame("ACK", id=frame.headers["ack"]), msg))
                elif action == "nack":
                    client.frame("NACK", id=frame.headers["ack"])
                    self.model.requeued(msg)
                else:
                    held[msg.msg_id] = msg
            client.wait_receipts([r for r, _ in acks], "ACK")
            for _, msg in acks:
                self.model.acked(msg)
            # UNSUBSCRIBE puts back what is unacknowledged before its receipt: the next client
            # finds it in place.
            client.call("UNSUBSCRIBE", id="c")
            for frame in client.take_buffered():
                extra = take(self.model, client, frame, "queue", ev.dest, ack_markers=False)
                if extra is not None:
                    self.model.requeued(extra)
            for msg in held.values():
                self.model.requeued(msg)
        finally:
            client.close()

    def _durable_create(self, ev: DurableCreate) -> None:
        if self.model.durables[ev.name].exists:
            return
        client = self._client("sim")
        try:
            client.subscribe(
                DURABLES[ev.name], "dc", prefetch=10, **{"activemq.subscriptionName": ev.name}
            )
            self.model.durable_created(ev.name)
            client.call("UNSUBSCRIBE", id="dc")
            for frame in client.take_buffered():  # a new subscription starts at the end
                take(self.model, client, frame, "durable", ev.name, ack_markers=False)
        finally:
            client.close()

    def _durable_delete(self, ev: DurableDelete) -> None:
        if not self.model.durables[ev.name].exists:
            return
        client = self._client("sim")
        try:
            # STOMP 1.2's UNSUBSCRIBE needs an id: attach, then unsubscribe with the name.
            client.subscribe(
                DURABLES[ev.name], "dd", prefetch=1, **{"activemq.subscriptionName": ev.name}
            )
            client.call("UNSUBSCRIBE", id="dd", **{"activemq.subscriptionName": ev.name})
            for frame in client.take_buffered():
                take(self.model, client, frame, "durable", ev.name, ack_markers=False)
            self.model.durable_deleted(ev.name)
        finally:
            client.close()

    def _durable_consume(self, ev: DurableConsume) -> None:
        if not self.model.durables[ev.name].exists:
            return
        wanted = min(ev.count, self.model.durable_surely_available(ev.name))
        if wanted == 0:
            return
        rng = random.Random(ev.seed)
        client = self._client("sim")
        try:
            client.subscribe(
                DURABLES[ev.name],
                "dur",
                prefetch=ev.prefetch,
                **{"activemq.subscriptionName": ev.name},
            )
            held: set[int] = set()
            nacks: dict[int, int] = {}
            acks: list[tuple[str, int]] = []
            distinct: set[int] = set()
            while len(distinct) < wanted:
                frame = client.message()
                msg = take(self.model, client, frame, "durable", ev.name)
                if msg is None:
                    continue
                distinct.add(msg.msg_id)
                held.discard(msg.msg_id)
                action = rng.choices(["ack", "nack", "leave"], weights=[6, 2, 2])[0]
                if action == "leave" and len(held) + 2 > ev.prefetch:
                    action = "ack"
                if action == "ack":
                    acks.append((client.frame("ACK", id=frame.headers["ack"]), msg.msg_id))
                elif action == "nack":
                    client.frame("NACK", id=frame.headers["ack"])
                    nacks[msg.msg_id] = nacks.get(msg.msg_id, 0) + 1
                    self.model.durable_requeued(ev.name, msg.msg_id, nacks[msg.msg_id])
                else:
                    held.add(msg.msg_id)
            client.wait_receipts([r for r, _ in acks], "ACK")
            for _, msg_id in acks:
                self.model.durable_acked(ev.name, msg_id)
            client.call("UNSUBSCRIBE", id="dur")
            back = set(held)
            for frame in client.take_buffered():
                extra = take(self.model, client, frame, "durable", ev.name, ack_markers=False)
                if extra is not None:
                    back.add(extra.msg_id)
            for msg_id in back:
                self.model.durable_requeued(ev.name, msg_id, nacks.get(msg_id, 0) + 1)
        finally:
            client.close()

    # -- transactions ---------------------------------------------------------------------------

    def _transaction(self, ev: Transaction) -> None:
        self._txs += 1
        txno, tx = self._txs, f"tx{self._txs}"
        client = self._client()
        msgs: list[SimMessage] = []
        acked: list[SimMessage] = []
        killed = False
        try:
            client.call("BEGIN", transaction=tx)
            receipts = []
            for k in range(ev.sends):
                dest = ev.dests[k % len(ev.dests)]
                dedup = self.model.new_dedup_id() if ev.dedup and dest in QUEUES else None
                msg = self.model.new_message(
                    dest, persistent=True, size=ev.size, dedup=dedup, tx=txno
                )
                msgs.append(msg)
                body = body_for(msg.msg_id, msg.size)
                headers = headers_for(msg, transaction=tx)
                receipts.append(client.send(dest, body, headers))
            client.wait_receipts(receipts, "transacted SEND")
            acked = self._transacted_acks(client, ev, tx)
            if ev.outcome == "commit":
                client.call("COMMIT", transaction=tx)
                for msg in msgs:
                    self.model.visible(msg, receipted=True)
                for msg in acked:
                    self.model.acked(msg)
            elif ev.outcome == "abort":
                client.call("ABORT", transaction=tx)
                self._aborted(msgs, acked)
            elif ev.outcome == "disconnect":
                client.close()
                self._aborted(msgs, acked)
            elif ev.outcome == "crash_open":
                self.broker.kill()
                killed = True
                self._aborted(msgs, [])
            else:  # crash_commit: the COMMIT is on its way when the broker dies
                client.frame("COMMIT", transaction=tx)
                self.broker.kill()
                killed = True
                for msg in msgs:
                    self.model.visible(msg, receipted=False)
                with self.model.lock:
                    self.model.unknown_commits.append([m.msg_id for m in msgs])
                    for msg in acked:
                        msg.fate = Fate.MAYBE
            if ev.outcome in ("commit", "abort") and acked:
                client.call("UNSUBSCRIBE", id="tx")
                for frame in client.take_buffered():
                    extra = take(
                        self.model, client, frame, "queue", ev.acks_from, ack_markers=False
                    )
                    if extra is not None:
                        self.model.requeued(extra)
        finally:
            if killed:
                client.abandon()
            else:
                client.close()
        if killed:
            self.stats.crashes += 1
            self._restart(ev.restart, crashed=True)

    def _transacted_acks(self, client: SimClient, ev: Transaction, tx: str) -> list[SimMessage]:
        """Take up to `ev.acks` messages of `ev.acks_from` and ACK them in the transaction."""
        wanted = min(ev.acks, self.model.surely_available(ev.acks_from))
        if wanted == 0:
            return []
        client.subscribe(ev.acks_from, "tx", prefetch=wanted)
        taken: list[SimMessage] = []
        while len(taken) < wanted:
            frame = client.message()
            msg = take(self.model, client, frame, "queue", ev.acks_from)
            if msg is not None:
                taken.append(msg)
                client.frame("ACK", id=frame.headers["ack"], transaction=tx)
        return taken

    def _aborted(self, msgs: list[SimMessage], acked: list[SimMessage]) -> None:
        for msg in msgs:
            self.model.forbid(msg, "aborted")
        for msg in acked:
            self.model.requeued(msg)

    # -- GC, crashes, stops, restarts -----------------------------------------------------------

    def _gc_passes(self) -> int:
        return self.broker.log_text().count("journal gc:")

    def _wait_gc(self, _: WaitGc) -> None:
        """Give GC a pass: wait (bounded) for its next log line, unless the journal has only
        its head file, when there is nothing to collect."""
        files = list((self.data_dir / "journal").glob("db-*.log"))
        if len(files) <= 1:
            return
        before = self._gc_passes()
        _poll(lambda: self._gc_passes() > before, 2 * self.settings.gc_interval_s + 0.5)

    def _crash(self, ev: Crash) -> None:
        if ev.during in ("sends", "mixed"):
            self._crash_under_load(ev)
        else:
            if ev.during == "gc":
                self._wait_gc(WaitGc())
            elif ev.during == "stop":
                self.broker.terminate()
            self.broker.kill()
        self.stats.crashes += 1
        self._restart(ev.restart, crashed=True)

    def _crash_under_load(self, ev: Crash) -> None:
        load = BackgroundLoad(self.model, self.broker.port, ev.seed, ev.during == "mixed")
        load.run_then_kill(ev.receipts, self.broker.kill)
        if load.receipts < ev.receipts:
            raise SimFailure(
                "connection-lost",
                f"the background producer stopped after {load.receipts} of {ev.receipts} "
                f"receipts:\n{_tail(self.broker.logs[-1] if self.broker.logs else '')}",
            )

    def _stop(self, ev: Stop) -> None:
        self.broker.stop()
        self.stats.clean_stops += 1
        self._verify(after_crash=False)
        self._restart(ev.restart, crashed=False, verified=True)

    def _disk_full(self, ev: DiskFull) -> None:
        if not (self.settings.small_disk and self.disk.available):
            return
        self.stats.disk_fulls += 1
        episodes, rooms = self._log_count(FULL_LOG_LINE), self._log_count(ROOM_LOG_LINE)
        self.disk.fill(ev.leave_bytes)
        # Sends before the broker's next measure meet the disk itself (refused whatever the
        # policy); after it, the policy (held or refused). Both happen: give the measure a chance.
        _poll(lambda: self._log_count(FULL_LOG_LINE) > episodes, 2.0)
        producer: SimClient | None = None
        held: tuple[str, SimMessage] | None = None
        try:
            producer, held = self._send_until_full(ev)
            self._acks_on_full_disk(ev)
        except BaseException:
            if producer is not None:
                producer.abandon()
            raise
        finally:
            self.disk.free()
        try:
            self._after_room_is_back(episodes, rooms, producer, held)
        finally:
            if producer is not None:
                producer.close()
        self._send_after_disk_full()
        if ev.restart is not None:
            self.broker.stop()
            self.stats.clean_stops += 1
            self._verify(after_crash=False)
            self._restart(ev.restart, crashed=False, verified=True)

    def _after_room_is_back(
        self,
        episodes: int,
        rooms: int,
        producer: SimClient | None,
        held: tuple[str, SimMessage] | None,
    ) -> None:
        # Room is back: the episode ends, a held producer goes on by itself, new sends are taken.
        if self._log_count(FULL_LOG_LINE) > episodes and not _poll(
            lambda: self._log_count(ROOM_LOG_LINE) > rooms, RECOVERY_TIMEOUT_S
        ):
            raise self._full_disk_failure(
                f"the broker did not see the room that came back within {RECOVERY_TIMEOUT_S} s"
            )
        if producer is not None and held is not None:
            receipt, msg = held
            try:
                producer.wait_receipts([receipt], "SEND held on a full disk", RECOVERY_TIMEOUT_S)
            except (BrokerGone, SimFailure) as exc:
                raise self._full_disk_failure(
                    f"a producer held back on a full disk was not let go once the disk had "
                    f"room again: {exc}"
                ) from None
            self.model.visible(msg, receipted=True)

    def _send_until_full(
        self, ev: DiskFull
    ) -> tuple[SimClient | None, tuple[str, SimMessage] | None]:
        """Send one by one until a SEND is refused (`error`) or held back (`block`). Returns the
        producer's connection, still open (a held connection is not read: it could not take a
        DISCONNECT before the disk has room), and the receipt and message of a held SEND."""
        refused = 0
        client: SimClient | None = None
        try:
            for k in range(ev.sends):
                if client is None:
                    client = self._client()
                dest = QUEUES[k % len(QUEUES)]
                msg = self.model.new_message(dest, persistent=True, size=ev.size)
                receipt = client.send(dest, body_for(msg.msg_id, msg.size), headers_for(msg))
                try:
                    client.wait_receipts([receipt], "SEND on a full disk", FULL_WAIT_S)
                except BrokerGone:
                    if "full" in client.error_text():
                        self.model.forbid(msg, "refused")  # not stored: the disk was full
                    else:
                        self.model.unanswered(msg)
                    client.abandon()
                    client = None
                    refused += 1
                    if refused >= 2:
                        break
                    continue
                except SimFailure:
                    return client, (receipt, msg)
                self.model.visible(msg, receipted=True)
        except BaseException:
            if client is not None:
                client.abandon()
            raise
        return client, None

    def _acks_on_full_disk(self, ev: DiskFull) -> None:
        """Consumers go on while the disk is full: their ACKs are written into the reserve."""
        queue = QUEUES[0]
        wanted = min(ev.acks, self.model.surely_available(queue))
        if wanted == 0:
            return
        client = self._client()
        try:
            client.subscribe(queue, "full", prefetch=wanted)
            acks: list[tuple[str, SimMessage]] = []
            while len(acks) < wanted:
                frame = client.message()
                msg = take(self.model, client, frame, "queue", queue)
                if msg is not None:
                    acks.append((client.frame("ACK", id=frame.headers["ack"]), msg))
            try:
                client.wait_receipts([r for r, _ in acks], "ACK on a full disk")
            except SimFailure as exc:
                raise SimFailure("disk-full-acks", f"ACKs stuck on a full disk: {exc}") from None
            for _, msg in acks:
                self.model.acked(msg)
            client.call("UNSUBSCRIBE", id="full")
            for frame in client.take_buffered():
                extra = take(self.model, client, frame, "queue", queue, ack_markers=False)
                if extra is not None:
                    self.model.requeued(extra)
        finally:
            client.close()

    def _full_disk_failure(self, what: str) -> SimFailure:
        """A full disk is not a failed store: once it has room again, sends are taken."""
        text = what + self.broker.log_text()
        failed = "store failed" in text or "store write failed" in text
        return SimFailure(
            "disk-full-failed-store" if failed else "disk-full-no-recovery",
            f"{what}\nbroker log:\n{_tail(self.broker.log_text())}",
        )

    def _send_after_disk_full(self) -> None:
        client = self._client()
        try:
            msg = self.model.new_message(QUEUES[1], persistent=True, size=100)
            receipt = client.send(QUEUES[1], body_for(msg.msg_id, msg.size), headers_for(msg))
            try:
                client.wait_receipts([receipt], "SEND after the disk had room", RECOVERY_TIMEOUT_S)
            except (BrokerGone, SimFailure) as exc:
                if "full" in client.error_text():
                    self.model.forbid(msg, "refused")
                else:
                    self.model.unanswered(msg)
                raise self._full_disk_failure(
                    f"a persistent SEND after the disk had room again was not taken: {exc}"
                ) from None
            self.model.visible(msg, receipted=True)
        finally:
            client.close()

    def _log_count(self, line: str) -> int:
        return self.broker.log_text().count(line)

    def _verify(self, *, after_crash: bool) -> None:
        """`sluice store verify` must pass; after a crash only a torn tail of the newest file
        (a write the kill cut short) may be reported."""
        result = self.broker.tool("verify", self.data_dir)
        if result.returncode == 0:
            return
        # The problems themselves, not the command's summary lines around them.
        problems = journal_tools.verify(self.data_dir).problems
        if after_crash and problems and all("torn tail" in line for line in problems):
            return
        check = "verify-after-crash" if after_crash else "verify-after-clean-stop"
        raise SimFailure(
            check,
            f"sluice store verify exit {result.returncode}:\n"
            + "\n".join(problems[:20] or result.stdout.splitlines()[-20:])
            + "\n"
            + result.stderr[-2000:],
        )

    def _restart(self, restart: Restart, *, crashed: bool, verified: bool = False) -> None:
        if self.tamper is not None:
            self.tamper(self.data_dir)
        if restart.tool == "verify" and not verified:
            self._verify(after_crash=crashed)
        elif restart.tool in ("rebuild-index", "compact"):
            result = self.broker.tool(restart.tool, self.data_dir)
            if result.returncode != 0:
                raise SimFailure(
                    f"tool-{restart.tool}",
                    f"exit {result.returncode}:\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}",
                )
        self.broker.start(repair=restart.repair)
        self.model.restarted(crashed)
        self.stats.restarts += 1
        self._sweep(ack=False)

    # -- sweeps ---------------------------------------------------------------------------------

    def _sweep(self, *, ack: bool, final: bool = False, check_deleted: bool = False) -> None:
        self._sweeps += 1
        sweep(
            self.model,
            self.broker.port,
            f"sweep{self._sweeps}",
            ack=ack,
            final=final,
            check_deleted=check_deleted,
        )

    def _journal_bytes(self) -> int:
        return sum(p.stat().st_size for p in (self.data_dir / "journal").iterdir() if p.is_file())

    def _wait_disk_bound(self) -> None:
        timeout = max(15.0, 10 * self.settings.gc_interval_s)
        if not _poll(lambda: self._journal_bytes() <= DISK_BOUND_BYTES, timeout):
            files = sorted(
                f"{p.name} {p.stat().st_size}" for p in (self.data_dir / "journal").iterdir()
            )
            raise SimFailure(
                "disk-bound",
                f"journal holds {self._journal_bytes()} bytes > {DISK_BOUND_BYTES} after "
                f"everything was drained and {timeout:.0f} s of GC: {files}",
            )


def _tail(text: str, lines: int = 30) -> str:
    return "\n".join(text.splitlines()[-lines:])
