"""Garbage collection, archive, compaction, transactions across files, index rebuild."""

from __future__ import annotations

import os
import random
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from sluice.store.api import RecoveredSubscription
from sluice.store.journal.files import list_files
from sluice.store.journal.store import JournalStore
from sluice.store.journal.tools import rebuild_index

from .helpers import Harness, copy_running, fields, journal_config, msg

Q = "/queue/g"
T = "/topic/t"
F = "/queue/filler"
QUIET = {"checkpoint_interval_s": 3600.0, "gc_interval_s": 3600.0}


def journal(h: Harness) -> JournalStore:
    assert isinstance(h.store, JournalStore)
    return h.store


def seqs(store: JournalStore, destination: str = Q) -> list[int]:
    return [m.seq for m in store.load(destination, 0, 10**9, 1 << 62)]


def snapshot(h: Harness) -> tuple[object, ...]:
    """Everything observable about a store's state."""
    s = journal(h)
    assert h.recovery is not None
    dests = sorted(
        (d.name, d.last_seq, d.message_count, d.message_bytes, d.dispatch_mark, tuple(d.dedup_ids))
        for d in h.recovery.destinations
    )
    subs = sorted(
        (x.client_id, x.name, x.destination, x.selector, x.cursor) for x in h.recovery.subscriptions
    )
    names = [d[0] for d in dests]
    messages = {n: [fields(m) for m in s.load(n, 0, 10**9, 1 << 62)] for n in names}
    firsts = {n: s.first_seq(n) for n in names}
    return dests, subs, messages, firsts


def fill_and_drain(h: Harness, first: int, count: int, size: int = 2048) -> None:
    s = journal(h)
    for seq in range(first, first + count):
        h.track(s.add(msg(Q, seq, os.urandom(size)), None))
    # Written before removed: a remove that caught its add still pending would cancel it, and
    # how many were cancelled would depend on the writer thread's timing.
    h.settle()
    for seq in range(first, first + count):
        h.track(s.remove(Q, seq))
    h.settle()


def test_gc_deletes_files_nothing_needs(make_journal: Callable[..., Harness]) -> None:
    h = make_journal(**QUIET)
    h.open()
    s = journal(h)
    h.track(s.add(msg(Q, 1), None))
    h.settle()
    fill_and_drain(h, 2, 2000)
    h.track(s.remove(Q, 1))
    h.settle()
    before = list_files(s.journal_dir)
    assert len(before) >= 4
    result = s.gc()
    after = list_files(s.journal_dir)
    assert result.deleted
    assert set(after) == set(before) - set(result.deleted)
    assert after == [s.head_position[0]]
    assert s.stats().gc_deleted_files == len(result.deleted)
    recovery = h.reopen()
    assert recovery.destinations[0].last_seq == 2001
    assert seqs(journal(h)) == []


def test_gc_archives_when_asked(make_journal: Callable[..., Harness]) -> None:
    h = make_journal(archive=True, **QUIET)
    h.open()
    s = journal(h)
    fill_and_drain(h, 1, 2000)
    result = s.gc()
    assert result.archived
    assert not result.deleted
    archive = s.config.data_dir / "archive"
    archived = sorted(archive.iterdir())
    assert [p.name for p in archived] == [f"db-{n}.log" for n in result.archived]
    assert all(p.stat().st_size < s.config.journal_file_bytes for p in archived)
    assert s.stats().gc_archived_files == len(result.archived)


def test_compaction_frees_a_file_pinned_by_one_old_message(
    make_journal: Callable[..., Harness],
) -> None:
    h = make_journal(**QUIET)
    h.open()
    s = journal(h)
    old = msg(Q, 1, b"the old one", headers={"x-dedup-id": "old-id"})
    h.track(s.add(old, None))
    h.track(s.put_subscription(RecoveredSubscription("c", "s", "/topic/t", None, 2)))
    h.track(s.mark_dispatched(Q, 1))
    fill_and_drain(h, 2, 2000)
    assert 1 in list_files(s.journal_dir)
    result = s.gc()
    assert 1 in result.compacted
    assert result.moved_messages >= 1
    assert 1 in result.deleted
    assert 1 not in list_files(s.journal_dir)
    assert [fields(m) for m in s.load(Q, 0, 10, 1 << 20)] == [fields(old)]
    recovery = h.reopen()
    assert [fields(m) for m in journal(h).load(Q, 0, 10, 1 << 20)] == [fields(old)]
    assert recovery.destinations[0].dedup_ids == ["old-id"]
    assert recovery.destinations[0].dispatch_mark == 1
    assert recovery.subscriptions[0].cursor == 2
    full = snapshot(h)
    h.close()
    shutil.rmtree(s.config.data_dir / "index")
    h.open()
    assert snapshot(h) == full


def test_transaction_spanning_rollover_commits_across_reopen(
    make_journal: Callable[..., Harness],
) -> None:
    h = make_journal(**QUIET)
    h.open()
    s = journal(h)
    bodies = [os.urandom(10 * 1024) for _ in range(300)]
    s.begin("big")
    for body in bodies:
        h.track(s.add(msg(Q, 0, body), None, "big"))
    h.track(s.add(msg("/queue/side", 1), None))
    h.settle()
    assert len(list_files(s.journal_dir)) >= 3
    # The transaction's files stay while it is open, even through GC.
    fill_and_drain(h, 1000, 300)
    s.gc()
    h.track(s.commit("big", list(range(1, 301)), None))
    h.settle()
    s.gc()
    h.reopen()
    s = journal(h)
    assert [m.body for m in s.load(Q, 0, 1000, 1 << 30)] == bodies
    assert seqs(s)[:300] == list(range(1, 301))


def test_transaction_spanning_rollover_aborts_across_reopen(
    make_journal: Callable[..., Harness], tmp_path: Path
) -> None:
    h = make_journal(**QUIET)
    h.open()
    s = journal(h)
    s.begin("gone")
    for _ in range(300):
        h.track(s.add(msg(Q, 0, os.urandom(10 * 1024)), None, "gone"))
    h.settle()
    files_with_tx = list_files(s.journal_dir)[:-1]
    assert len(files_with_tx) >= 2
    copy_running(s, tmp_path / "mid-tx")
    s.abort("gone")
    h.track(s.add(msg(Q, 1), None))
    h.settle()
    result = s.gc()
    assert set(files_with_tx) <= set(result.deleted)
    h.reopen()
    assert seqs(journal(h)) == [1]
    # A crash while the transaction was open drops it at recovery.
    crashed = make_journal(tmp_path / "mid-tx")
    recovery = crashed.open()
    assert seqs(journal(crashed)) == []
    assert any("uncommitted" in line for line in recovery.report)


def workload(h: Harness, rng: random.Random, rounds: int) -> None:
    """A random mix of every operation, with collections in between."""
    s = journal(h)
    next_seq: dict[str, int] = {}
    live: dict[str, list[int]] = {}
    dests = ["/queue/a", "/queue/b", "/topic/c"]
    for r in range(rounds):
        dest = rng.choice(dests)
        for _ in range(rng.randrange(20, 120)):
            seq = next_seq.get(dest, 0) + 1
            next_seq[dest] = seq
            headers = {"x-dedup-id": f"{dest}-{seq}"} if rng.random() < 0.3 else {"h": "v"}
            h.track(
                s.add(msg(dest, seq, os.urandom(rng.randrange(10, 6000)), headers=headers), None)
            )
            live.setdefault(dest, []).append(seq)
        for d, alive in live.items():
            for seq in rng.sample(alive, k=int(len(alive) * rng.uniform(0.5, 1.0))):
                h.track(s.remove(d, seq))
                alive.remove(seq)
        if rng.random() < 0.5:
            txid = f"tx{r}"
            s.begin(txid)
            n = rng.randrange(1, 30)
            for _ in range(n):
                h.track(
                    s.add(
                        msg(
                            dest,
                            0,
                            os.urandom(rng.randrange(10, 8000)),
                            headers={"x-dedup-id": f"{txid}-{_}"},
                        ),
                        None,
                        txid,
                    )
                )
            if rng.random() < 0.7:
                first = next_seq.get(dest, 0) + 1
                assigned = list(range(first, first + n))
                next_seq[dest] = first + n - 1
                h.track(s.commit(txid, assigned, None))
                live.setdefault(dest, []).extend(assigned)
            else:
                s.abort(txid)
        if rng.random() < 0.3:
            upto = max(0, next_seq.get("/topic/c", 0) - 5)
            h.track(s.remove_range("/topic/c", upto))
            live["/topic/c"] = [x for x in live.get("/topic/c", []) if x > upto]
        if rng.random() < 0.3:
            h.track(
                s.put_subscription(RecoveredSubscription("c", f"s{r % 3}", "/topic/c", None, r))
            )
        if rng.random() < 0.3:
            s.set_cursor("c", f"s{rng.randrange(3)}", r * 10)
        if rng.random() < 0.1:
            h.track(s.delete_subscription("c", f"s{rng.randrange(3)}"))
        if rng.random() < 0.3:
            h.track(s.mark_dispatched(dest, next_seq.get(dest, 0)))
        if rng.random() < 0.05:
            h.track(s.delete_destination("/queue/b"))
            next_seq.pop("/queue/b", None)
            live.pop("/queue/b", None)
        h.settle()
        if rng.random() < 0.4:
            s.gc()


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_deleted_index_is_rebuilt_with_identical_state(
    make_journal: Callable[..., Harness], seed: int
) -> None:
    h = make_journal(dedup_window=50, compaction_live_ratio=0.5, **QUIET)
    h.open()
    workload(h, random.Random(seed), 40)
    journal(h).gc()
    h.reopen()
    expected = snapshot(h)
    data_dir = journal(h).config.data_dir
    assert len(list_files(data_dir / "journal")) >= 1
    h.close()
    shutil.rmtree(data_dir / "index")
    recovery = h.open()
    assert any("index rebuilt" in line and "index missing" in line for line in recovery.report)
    assert snapshot(h) == expected


def test_corrupted_index_is_detected_and_rebuilt(make_journal: Callable[..., Harness]) -> None:
    h = make_journal(dedup_window=50, **QUIET)
    h.open()
    workload(h, random.Random(7), 15)
    h.reopen()
    expected = snapshot(h)
    data_dir = journal(h).config.data_dir
    h.close()
    index_file = data_dir / "index" / "data.mdb"
    raw = bytearray(index_file.read_bytes())
    rng = random.Random(3)
    for _ in range(64):
        raw[rng.randrange(len(raw))] ^= rng.randrange(1, 256)
    index_file.write_bytes(bytes(raw))
    recovery = h.open()
    assert any("index rebuilt" in line for line in recovery.report)
    assert snapshot(h) == expected
    # Garbage where LMDB expects its meta pages: it refuses to open; rebuilt as well.
    h.close()
    index_file.write_bytes(os.urandom(8192))
    (data_dir / "index" / "clean").unlink()
    recovery = h.open()
    assert any("index rebuilt" in line for line in recovery.report)
    assert snapshot(h) == expected


def test_one_collection_frees_a_chain_of_files_each_acking_the_one_before(
    make_journal: Callable[..., Harness],
) -> None:
    """Each file holds a destination's last sequence (pinned) and the ack of a message in the
    file before it (so it depends on that file). Compaction of each file must wait for the one
    before it; one collection compacts and deletes the whole chain, not one file per round."""
    h = make_journal(compaction_live_ratio=0.5, **QUIET)
    h.open()
    s = journal(h)
    body = os.urandom(s.config.journal_file_bytes * 2 // 3)  # one message per file
    names = [f"/queue/chain{i}" for i in range(6)]
    for i, name in enumerate(names):
        h.track(s.add(msg(name, 1, body), None))
        h.settle()
        if i:
            h.track(s.remove(names[i - 1], 1))
            h.settle()
    h.track(s.remove(names[-1], 1))
    h.settle()
    chain = list_files(s.journal_dir)[:-1]
    assert len(chain) >= len(names) - 1
    result = s.gc()
    assert set(chain) <= set(result.deleted)
    assert list_files(s.journal_dir) == [s.head_position[0]]
    h.reopen()
    full = snapshot(h)
    dests = full[0]
    assert isinstance(dests, list)
    assert [d[:3] for d in dests] == [(name, 1, 0) for name in sorted(names)]
    h.close()
    shutil.rmtree(s.config.data_dir / "index")
    h.open()
    assert snapshot(h) == full


def test_collection_after_a_transacted_ack_of_a_deleted_destination(
    make_journal: Callable[..., Harness],
) -> None:
    """A transacted ack written before its destination is deleted and created again (same
    sequences) is dropped with the delete: it neither removes the new message at the commit nor
    ties its file to the new message's file, which acks the old file's messages (a cycle that
    kept both files for ever)."""
    h = make_journal(compaction_live_ratio=0.5, **QUIET)
    h.open()
    s = journal(h)
    big = os.urandom(s.config.journal_file_bytes * 2 // 5)
    h.track(s.add(msg(Q, 1, b"old"), None))
    h.track(s.add(msg(T, 1, big), None))
    h.settle()
    s.begin("tx")
    h.track(s.remove(Q, 1, None, "tx"))
    h.track(s.delete_destination(Q))
    h.track(s.add(msg(T, 2, big), None))
    h.settle()
    # The next file: the new incarnation's message, the commit, and an ack of the old file's.
    h.track(s.add(msg(Q, 1, big), None))
    h.track(s.commit("tx", [], None))
    h.track(s.remove_range(T, 2))
    h.settle()
    assert seqs(s) == [1]
    for seq in (1, 2):
        h.track(s.add(msg(F, seq, big), None))
        h.settle()
    h.track(s.remove(Q, 1))
    h.track(s.remove_range(F, 2))
    h.settle()
    assert len(list_files(s.journal_dir)) >= 3
    for _ in range(2):
        s.gc()
    assert list_files(s.journal_dir) == [s.head_position[0]]
    h.reopen()
    full = snapshot(h)
    dests = full[0]
    assert isinstance(dests, list)
    assert [d[:3] for d in dests] == [(F, 2, 0), (Q, 1, 0), (T, 2, 0)]
    h.close()
    shutil.rmtree(s.config.data_dir / "index")
    h.open()
    assert snapshot(h) == full


def test_compaction_leaves_a_message_with_a_transacted_ack_pending(
    make_journal: Callable[..., Harness],
) -> None:
    """A message acknowledged in an open transaction stays in its file through compaction. Its
    copy would land in a newer file than the ack; at the commit the ack's file would depend on
    the copy's file, which also acks a message of the ack's file: the two would wait for each
    other for ever (found by the lifecycle simulation, seed 2217552266 and others)."""
    h = make_journal(compaction_live_ratio=0.5, **QUIET)
    h.open()
    s = journal(h)
    big = os.urandom(s.config.journal_file_bytes * 2 // 5)
    # The first file: the message, and fillers acknowledged at once (compaction worth it).
    h.track(s.add(msg(Q, 1, b"acked in a transaction"), None))
    h.track(s.add(msg(F, 1, big), None))
    h.track(s.add(msg(F, 2, big), None))
    h.settle()
    # The second file: a message of another destination, the transacted ack, more fillers.
    h.track(s.add(msg(T, 1, big), None))
    h.track(s.remove_range(F, 2))
    h.settle()
    s.begin("tx")
    h.track(s.remove(Q, 1, None, "tx"))
    h.track(s.add(msg(F, 3, big), None))
    h.settle()
    h.track(s.add(msg(F, 4, big), None))
    h.settle()
    first = list_files(s.journal_dir)[0]
    ack_file = list_files(s.journal_dir)[1]
    assert s.head_position[0] > ack_file
    s.gc()
    assert first in list_files(s.journal_dir), "the message moved with its ack pending"
    # The head file: an ack of the second file's message, then the commit.
    h.track(s.remove(T, 1))
    h.settle()
    h.track(s.commit("tx", [], None))
    h.track(s.remove_range(F, 4))
    h.settle()
    assert seqs(s) == []
    for seq in (5, 6, 7):
        h.track(s.add(msg(F, seq, big), None))
        h.settle()
    h.track(s.remove_range(F, 7))
    h.settle()
    for _ in range(2):
        s.gc()
    assert list_files(s.journal_dir) == [s.head_position[0]]
    h.reopen()
    full = snapshot(h)
    dests = full[0]
    assert isinstance(dests, list)
    assert [d[:3] for d in dests] == [(F, 7, 0), (Q, 1, 0), (T, 1, 0)]
    h.close()
    shutil.rmtree(s.config.data_dir / "index")
    h.open()
    assert snapshot(h) == full


def test_a_transaction_committed_in_a_later_file_keeps_its_last_sequence_after_collection(
    tmp_path: Path, make_journal: Callable[..., Harness]
) -> None:
    """Found by the store simulation (seed 3718535680): the last sequence of a destination set
    by a commit needs both records, the ADD (it names the destination) and the TX_COMMIT (it
    holds the sequence). Its pin was on the commit's file alone, so once the messages were
    acknowledged, collection deleted the ADDs' files and a rebuild lost the destination."""
    data = tmp_path / "data"
    config = {**QUIET, "journal_file_bytes": 32 * 1024, "compaction_live_ratio": 0.0}
    h = make_journal(data, **config)
    h.open()
    s = h.s
    assert isinstance(s, JournalStore)
    s.begin("tx")
    h.track(s.add(msg(T, 1, os.urandom(24 * 1024)), None, "tx"))
    h.track(s.add(msg(T, 2, os.urandom(24 * 1024)), None, "tx"))
    h.settle()
    last_add_file = s.head_position[0]
    h.track(s.add(msg(F, 1, os.urandom(24 * 1024)), None))
    h.track(s.commit("tx", [1, 2], None))
    h.settle()
    assert s.head_position[0] > last_add_file  # the commit lies in a later file than the adds
    h.track(s.remove(T, 1))
    h.track(s.remove(T, 2))
    h.track(s.remove(F, 1))
    h.settle()
    s.gc()
    h.s.close()
    h.store = None
    rebuild_index(data, journal_config(data, **config))
    recovery = h.open()
    assert (T, 2) in [(d.name, d.last_seq) for d in recovery.destinations]
