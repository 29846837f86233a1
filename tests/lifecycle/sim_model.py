"""The model of a simulated store: plain data of what must, may and must not be stored.

Every store operation is applied to the model with its outcome (`Outcome`, from the final state
of its write handle):

- WRITTEN: its effect is certain (a message surely present, surely gone, a cursor surely moved);
- CANCELLED: an add cancelled by the remove that followed it: it never existed;
- REFUSED: the journal found no room for its batch before writing any of it and went on: it
  never happened (only plain adds and removes are refused; anything else fails the store);
- FAILED: its effect is in doubt until the next open says which way it went. A message in doubt
  may be there or not, but if it is there it is exactly the message that was sent. The effects of
  one transaction commit (or one remove_range, one destination delete) in doubt form a group:
  after the open, all of them happened or none did.

After an open, `check_recovery` compares the `Recovery` and what `load()` returns with the model
and raises `Mismatch` naming the check that failed; `resolve` then makes the model exact again.
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import NamedTuple

from sluice.store.api import RecoveredSubscription, Recovery, StoredMessage

from .sim_events import ALL_DESTS

SubState = tuple[str, str | None, int]  # destination, selector, cursor


class Outcome(enum.Enum):
    """How an operation ended, as the model sees it."""

    WRITTEN = "written"
    CANCELLED = "cancelled"
    REFUSED = "refused"
    FAILED = "failed"


class Mismatch(Exception):
    """A check failed. `check` names it (failures are told apart by it when shrinking)."""

    def __init__(self, check: str, detail: str) -> None:
        super().__init__(f"{check}: {detail}")
        self.check = check
        self.detail = detail


class Fields(NamedTuple):
    """Everything a stored message carries, comparable."""

    destination: str
    seq: int
    message_id: str
    timestamp_ms: int
    headers: tuple[tuple[str, str], ...]
    body: bytes
    expires_ms: int
    priority: int
    persistent: bool

    def message(self, destination: str, seq: int, headers: dict[str, str]) -> StoredMessage:
        """A new message with these contents (and more headers) at another place."""
        return StoredMessage(
            destination,
            seq,
            self.message_id,
            self.timestamp_ms,
            {**dict(self.headers), **headers},
            self.body,
            expires_ms=self.expires_ms,
            priority=self.priority,
            persistent=self.persistent,
        )


def fields_of(m: StoredMessage) -> Fields:
    """The fields of a stored message."""
    return Fields(
        m.destination,
        m.seq,
        m.message_id,
        m.timestamp_ms,
        tuple(sorted(m.headers.items())),
        bytes(m.body),
        m.expires_ms,
        m.priority,
        m.persistent,
    )


@dataclass
class Expect:
    """A message the model knows of. `group` ties it to a transaction (or range, or delete) in
    doubt; `added` says whether that group adds it (present iff it happened) or removes it."""

    fields: Fields
    sure: bool = True
    group: int = 0
    added: bool = True


@dataclass
class DestModel:
    """One destination."""

    msgs: dict[int, Expect] = field(default_factory=dict)
    gone: dict[int, str] = field(default_factory=dict)  # seq -> how it went (for messages)
    low: int = 0  # the recovered last_seq is at least this (adds surely written)
    high: int = 0  # and at most this (every sequence handed out)
    settled: int = 0  # after a clean close it is exactly this (adds written or cancelled)
    marks: set[int] = field(default_factory=lambda: {0})  # possible dispatch marks
    mark_latest: int = 0
    dedup: list[tuple[str, bool]] = field(default_factory=list)  # ids in journal order, sure?
    dedup_unknown: bool = False
    deleted: bool = False  # a delete surely happened and nothing touched it since

    def touch(self) -> None:
        """An operation was submitted: the destination may exist from now on."""
        self.deleted = False


@dataclass
class SubModel:
    """A durable subscription: the states an open may show, and whether it surely exists."""

    states: set[SubState]
    latest: SubState
    sure: bool = True


@dataclass
class TxAdd:
    """A transacted add: its destination, message (at seq 0) and dedup id."""

    destination: str
    fields: Fields
    dedup_id: str | None


@dataclass
class TxModel:
    """An open transaction."""

    txid: str
    adds: list[TxAdd] = field(default_factory=list)
    removes: list[tuple[str, int]] = field(default_factory=list)


class Model:
    """What the store must hold, per destination and subscription."""

    def __init__(self, dedup_window: int, *, trim_windows: bool = False) -> None:
        self.window = dedup_window
        # Known issue: a window longer than configured (see `store_sim.Known`) is compared by
        # its newest ids; `trimmed` counts the times that was needed.
        self.trim_windows = trim_windows
        self.trimmed = 0
        self.dests: dict[str, DestModel] = {name: DestModel() for name in ALL_DESTS}
        self.subs: dict[tuple[str, str], SubModel] = {}
        self.txs: dict[int, TxModel] = {}  # by slot
        # Removes written lazily (no sync of their own) that no sync has covered yet: a power
        # cut may undo them.
        self.unsynced: list[tuple[str, int, Expect]] = []
        self._groups = itertools.count(1)

    # -- choosing what to act on -----------------------------------------------------------------

    def next_seq(self, destination: str) -> int:
        """Hand out the destination's next sequence, as the core does."""
        dm = self.dests[destination]
        dm.high += 1
        return dm.high

    def locked(self) -> set[tuple[str, int]]:
        """Messages an open transaction removes."""
        return {key for tx in self.txs.values() for key in tx.removes}

    def sure_seqs(self, destination: str) -> list[int]:
        """Sequences surely present and not held by a transaction, ascending."""
        locked = self.locked()
        return sorted(
            seq
            for seq, e in self.dests[destination].msgs.items()
            if e.sure and (destination, seq) not in locked
        )

    # -- applying operations ---------------------------------------------------------------------

    def add(
        self, dest: str, seq: int, fields: Fields, dedup_id: str | None, state: Outcome
    ) -> None:
        """A non-transacted add finished."""
        dm = self.dests[dest]
        dm.touch()
        if state is Outcome.WRITTEN:
            dm.msgs[seq] = Expect(fields)
            dm.low = max(dm.low, seq)
            dm.settled = max(dm.settled, seq)
            if dedup_id:
                dm.dedup.append((dedup_id, True))
        elif state is Outcome.CANCELLED:
            dm.settled = max(dm.settled, seq)
            dm.gone[seq] = "cancelled with its add"
        elif state is Outcome.REFUSED:
            dm.gone[seq] = "refused: no room for its batch"
        else:
            dm.msgs[seq] = Expect(fields, sure=False)
            if dedup_id:
                dm.dedup.append((dedup_id, False))

    def remove(self, dest: str, seq: int, state: Outcome, *, lazy: bool = False) -> None:
        """A non-transacted remove finished (`lazy`: written without a sync of its own)."""
        dm = self.dests[dest]
        if state in (Outcome.WRITTEN, Outcome.CANCELLED):
            expect = dm.msgs.pop(seq, None)
            if expect is not None:
                dm.gone[seq] = "acknowledged"
                if lazy and state is Outcome.WRITTEN:
                    self.unsynced.append((dest, seq, expect))
        elif state is Outcome.REFUSED:
            return
        elif seq in dm.msgs:
            dm.msgs[seq] = replace(dm.msgs[seq], sure=False, group=0)

    def synced(self) -> None:
        """A sync covered every record written so far: lazy removes are on disk."""
        self.unsynced.clear()

    def lose_unsynced(self) -> None:
        """A power cut: a lazy remove no sync covered may be undone, its message back."""
        for dest, seq, expect in self.unsynced:
            dm = self.dests[dest]
            if seq not in dm.msgs:
                dm.msgs[seq] = replace(expect, sure=False, group=0)
                dm.gone.pop(seq, None)
        self.unsynced.clear()

    def _doubt_group(self, dest: str, seqs: Iterable[int]) -> None:
        """One record in doubt removes these: the ones surely there go or stay together; one
        already in doubt may be missing for its own reason, so it stays a doubt of its own."""
        dm = self.dests[dest]
        group = next(self._groups)
        for seq in seqs:
            e = dm.msgs[seq]
            dm.msgs[seq] = replace(e, sure=False, group=group if e.sure else 0, added=False)

    def remove_range(self, dest: str, upto: int, state: Outcome) -> None:
        """A remove_range finished."""
        dm = self.dests[dest]
        hit = [seq for seq in dm.msgs if seq <= upto]
        if state is Outcome.WRITTEN:
            for seq in hit:
                del dm.msgs[seq]
                dm.gone[seq] = f"removed by remove_range up to {upto}"
        else:
            self._doubt_group(dest, hit)

    def mark(self, dest: str, seq: int, state: Outcome) -> None:
        """A mark_dispatched finished."""
        dm = self.dests[dest]
        dm.touch()
        dm.mark_latest = seq
        if state is Outcome.WRITTEN:
            dm.marks = {seq}
        else:
            dm.marks.add(seq)

    def delete_dest(self, dest: str, state: Outcome) -> None:
        """A delete_destination finished (open transactions forget their removes of it)."""
        for tx in self.txs.values():
            tx.removes = [(name, seq) for name, seq in tx.removes if name != dest]
        dm = self.dests[dest]
        if state is Outcome.WRITTEN:
            gone = dict(dm.gone)
            gone.update((seq, "its destination was deleted") for seq in dm.msgs)
            self.dests[dest] = DestModel(gone=gone, deleted=True)
            return
        self._doubt_group(dest, list(dm.msgs))
        dm.low = 0
        dm.marks.add(0)
        dm.dedup_unknown = True

    def begin(self, slot: int, txid: str) -> TxModel:
        """A transaction starts."""
        tx = self.txs[slot] = TxModel(txid)
        return tx

    def commit(self, slot: int, seqs: Sequence[int], state: Outcome) -> None:
        """A commit finished (its adds take `seqs`, in add order)."""
        tx = self.txs.pop(slot)
        group = next(self._groups)
        for add, seq in zip(tx.adds, seqs, strict=True):
            dm = self.dests[add.destination]
            dm.touch()
            fields = add.fields._replace(seq=seq)
            if state is Outcome.WRITTEN:
                dm.msgs[seq] = Expect(fields)
                dm.low = max(dm.low, seq)
                dm.settled = max(dm.settled, seq)
            else:
                dm.msgs[seq] = Expect(fields, sure=False, group=group, added=True)
            if add.dedup_id:
                dm.dedup.append((add.dedup_id, state is Outcome.WRITTEN))
        for dest, seq in tx.removes:
            dm = self.dests[dest]
            if seq not in dm.msgs:
                continue
            if state is Outcome.WRITTEN:
                del dm.msgs[seq]
                dm.gone[seq] = f"acknowledged in transaction {tx.txid}"
            else:
                e = dm.msgs[seq]
                dm.msgs[seq] = replace(e, sure=False, group=group if e.sure else 0, added=False)

    def abort(self, slot: int) -> None:
        """A transaction was aborted."""
        self.txs.pop(slot, None)

    def drop_txs(self) -> None:
        """The store stopped: open transactions are gone (the journal aborts them at open)."""
        self.txs.clear()

    def sub_put(self, key: tuple[str, str], sub: RecoveredSubscription, state: Outcome) -> None:
        """A put_subscription finished."""
        new: SubState = (sub.destination, sub.selector, sub.cursor)
        old = self.subs.get(key)
        if state is Outcome.WRITTEN:
            self.subs[key] = SubModel({new}, new)
        elif old is None:
            self.subs[key] = SubModel({new}, new, sure=False)
        else:
            old.states.add(new)
            old.latest = new

    def sub_cursor(self, key: tuple[str, str], cursor: int) -> None:
        """set_cursor was called (written with the next batch or checkpoint)."""
        sub = self.subs.get(key)
        if sub is not None:
            sub.latest = (sub.latest[0], sub.latest[1], cursor)
            sub.states.add(sub.latest)

    def sub_delete(self, key: tuple[str, str], state: Outcome) -> None:
        """A delete_subscription finished."""
        if state is Outcome.WRITTEN:
            self.subs.pop(key, None)
        elif key in self.subs:
            self.subs[key].sure = False

    def settle(self) -> None:
        """A step ended with the store healthy: its batch wrote the coalesced cursors."""
        for sub in self.subs.values():
            if sub.sure:
                sub.states = {sub.latest}

    # -- checks ----------------------------------------------------------------------------------

    def check_messages(self, loaded: Mapping[str, Sequence[StoredMessage]]) -> None:
        """What `load()` returns against the model: every sure message, nothing unknown, exact
        contents, and every group all or nothing."""
        for dest, dm in self.dests.items():
            if dest not in loaded:
                continue
            found = {m.seq: fields_of(m) for m in loaded[dest]}
            seqs = [m.seq for m in loaded.get(dest, ())]
            if seqs != sorted(set(seqs)):
                raise Mismatch("order", f"{dest}: load returned sequences {seqs}")
            groups: dict[int, set[bool]] = {}
            for seq, e in dm.msgs.items():
                got = found.get(seq)
                if got is None:
                    if e.sure:
                        raise Mismatch("lost", f"{dest} #{seq} ({e.fields.message_id}) is missing")
                elif got != e.fields:
                    raise Mismatch("content", f"{dest} #{seq}: stored {got!r}, sent {e.fields!r}")
                if e.group:
                    happened = (got is not None) == e.added
                    groups.setdefault(e.group, set()).add(happened)
            for seq, got in found.items():
                if seq not in dm.msgs:
                    why = dm.gone.get(seq)
                    if why is not None:
                        raise Mismatch(
                            "resurrected", f"{dest} #{seq} ({got.message_id}) is back: {why}"
                        )
                    raise Mismatch("phantom", f"{dest} #{seq} ({got.message_id}) was never stored")
            for group, outcomes in groups.items():
                if len(outcomes) > 1:
                    raise Mismatch(
                        "atomicity",
                        f"{dest}: a transaction, range or delete in doubt (group "
                        f"{group}) half happened",
                    )

    def check_recovery(
        self, recovery: Recovery, loaded: Mapping[str, Sequence[StoredMessage]], *, exact: bool
    ) -> None:
        """After an open: messages, destination numbers, dedup windows, subscriptions. `exact`:
        the store was closed cleanly after a healthy run, so nothing is in doubt."""
        self.check_messages(loaded)
        infos = {d.name: d for d in recovery.destinations}
        for dest, dm in self.dests.items():
            info = infos.get(dest)
            msgs = loaded.get(dest, ())
            if info is None:
                if msgs or dm.low:
                    raise Mismatch(
                        "dest-info", f"{dest} is missing from the recovery (last_seq >= {dm.low})"
                    )
                continue
            if dm.deleted:
                raise Mismatch("deleted-back", f"{dest} was deleted and is back: {info}")
            if info.message_count != len(msgs):
                raise Mismatch(
                    "dest-info",
                    f"{dest}: recovery counts {info.message_count} messages, "
                    f"load finds {len(msgs)}",
                )
            nbytes = sum(m.size for m in msgs)
            if info.message_bytes != nbytes:
                raise Mismatch(
                    "dest-info",
                    f"{dest}: recovery counts {info.message_bytes} bytes, load finds {nbytes}",
                )
            top = max((m.seq for m in msgs), default=0)
            if not max(dm.low, top) <= info.last_seq <= max(dm.high, top):
                raise Mismatch(
                    "last-seq",
                    f"{dest}: last_seq {info.last_seq} outside [{max(dm.low, top)}, {dm.high}]",
                )
            if exact and info.last_seq != dm.settled:
                raise Mismatch(
                    "last-seq",
                    f"{dest}: last_seq {info.last_seq} after a clean close, not {dm.settled}",
                )
            if info.dispatch_mark not in dm.marks:
                raise Mismatch(
                    "mark",
                    f"{dest}: dispatch mark {info.dispatch_mark}, expected one of {dm.marks}",
                )
            window = info.dedup_ids
            if self.trim_windows and len(window) > self.window:
                window = window[-self.window :]
                self.trimmed += 1
            if not dm.dedup_unknown and not self._window_fits(dm.dedup, window):
                raise Mismatch(
                    "dedup",
                    f"{dest}: dedup window {info.dedup_ids}, "
                    f"sent (id, sure) {dm.dedup[-3 * self.window :]}",
                )
        self._check_subs(recovery.subscriptions)

    def _window_fits(self, sent: list[tuple[str, bool]], window: list[str]) -> bool:
        """Whether `window` is the newest `self.window` ids of `sent` with some of the ids in
        doubt left out (ids are unique, so the walk is greedy)."""
        if len(window) > self.window:
            return False
        want = list(reversed(window))
        j = 0
        for dedup_id, sure in reversed(sent):
            if j < len(want):
                if dedup_id == want[j]:
                    j += 1
                elif sure:
                    return False
            elif len(want) < self.window and sure:
                return False
        return j == len(want)

    def _check_subs(self, subs: Sequence[RecoveredSubscription]) -> None:
        found = {(s.client_id, s.name): (s.destination, s.selector, s.cursor) for s in subs}
        for key, sub in self.subs.items():
            got = found.get(key)
            if got is None:
                if sub.sure:
                    raise Mismatch("sub-lost", f"subscription {key} is missing")
            elif got not in sub.states:
                raise Mismatch(
                    "sub-state", f"subscription {key} is {got}, expected one of {sub.states}"
                )
        for key, got in found.items():
            if key not in self.subs:
                raise Mismatch("sub-back", f"subscription {key} ({got}) was deleted or never made")

    # -- after an open ---------------------------------------------------------------------------

    def resolve(self, recovery: Recovery, loaded: Mapping[str, Sequence[StoredMessage]]) -> None:
        """Make the model exactly what the open found (after `check_recovery` passed)."""
        infos = {d.name: d for d in recovery.destinations}
        for dest, dm in self.dests.items():
            found = {m.seq for m in loaded.get(dest, ())}
            for seq in [s for s in dm.msgs if s not in found]:
                del dm.msgs[seq]
                dm.gone[seq] = "in doubt at a failure or crash, and not stored"
            for seq in found:
                dm.msgs[seq] = Expect(dm.msgs[seq].fields)
            info = infos.get(dest)
            last = info.last_seq if info is not None else 0
            dm.low = dm.high = dm.settled = last
            dm.mark_latest = info.dispatch_mark if info is not None else 0
            dm.marks = {dm.mark_latest}
            ids = info.dedup_ids[-self.window :] if info is not None else []
            dm.dedup = [(i, True) for i in ids]
            dm.dedup_unknown = False
            dm.deleted = info is None
        self.subs = {
            (s.client_id, s.name): SubModel(
                {(s.destination, s.selector, s.cursor)}, (s.destination, s.selector, s.cursor)
            )
            for s in recovery.subscriptions
        }
        self.txs.clear()

    def message_count(self) -> int:
        """Messages the model holds."""
        return sum(len(dm.msgs) for dm in self.dests.values())
