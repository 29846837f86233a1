"""One contract, every store: the same tests run against MemoryStore, JournalStore and
PostgresStore (on the session's PostgreSQL server, a schema of its own per test).

Each test also reopens the store (a new JournalStore on the same directory, a new PostgresStore on
the same schema; the same MemoryStore instance) and checks that the state is still there.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from pgserver import fresh_schema
from sluice.store.api import RecoveredSubscription, WriteState
from sluice.store.journal.store import JournalStore
from sluice.store.memory import MemoryStore
from sluice.store.postgres.store import PostgresStore

from .helpers import Harness, fields, journal_config, msg

Q = "/queue/orders"
T = "/topic/prices"


@pytest.fixture(params=["memory", "journal", "postgres"])
def h(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Harness]:
    window = 3
    if request.param == "memory":
        harness = Harness("memory", lambda: MemoryStore(dedup_window=window))
    elif request.param == "postgres":
        url = request.getfixturevalue("pg_server").url()
        schema = fresh_schema()
        harness = Harness(
            "postgres", lambda: PostgresStore(url, schema=schema, dedup_window=window)
        )
    else:
        config = journal_config(tmp_path / "data")
        harness = Harness("journal", lambda: JournalStore(config, dedup_window=window))
    harness.open()
    yield harness
    harness.close()


def loaded(h: Harness, destination: str, after: int = 0) -> list[int]:
    return [m.seq for m in h.s.load(destination, after, 1_000_000, 1 << 62)]


def dest_info(h: Harness, destination: str) -> tuple[int, int, int, int, list[str]] | None:
    assert h.recovery is not None
    for d in h.recovery.destinations:
        if d.name == destination:
            return d.last_seq, d.message_count, d.message_bytes, d.dispatch_mark, d.dedup_ids
    return None


def test_add_then_load_in_order_with_all_fields(h: Harness) -> None:
    originals = [
        msg(Q, seq, bytes([seq]) * seq * 10, ts=100 + seq, priority=seq % 10, expires_ms=seq * 7)
        for seq in range(1, 11)
    ]
    originals[3].persistent = False
    originals[4].headers = {"a": "1", "ü": "ñ\n:", "empty": ""}
    for m in originals:
        h.track(h.s.add(m, None))
    expected = [fields(m) for m in originals]
    assert [fields(m) for m in h.s.load(Q, 0, 100, 1 << 30)] == expected
    h.reopen()
    assert [fields(m) for m in h.s.load(Q, 0, 100, 1 << 30)] == expected
    assert dest_info(h, Q) == (10, 10, sum(m.size for m in originals), 0, [])


def test_load_budgets(h: Harness) -> None:
    for seq in range(1, 8):
        h.track(h.s.add(msg(Q, seq, b"x" * 100), None))
    size = msg(Q, 1, b"x" * 100).size
    assert loaded(h, Q) == [1, 2, 3, 4, 5, 6, 7]
    assert [m.seq for m in h.s.load(Q, 0, 3, 1 << 30)] == [1, 2, 3]
    assert [m.seq for m in h.s.load(Q, 2, 100, size * 2 + size // 2)] == [3, 4]
    # At least one message even if it alone exceeds the byte budget.
    assert [m.seq for m in h.s.load(Q, 4, 100, 1)] == [5]
    assert h.s.load(Q, 7, 100, 1 << 30) == []
    assert h.s.load("/queue/none", 0, 100, 1 << 30) == []
    h.reopen()
    assert [m.seq for m in h.s.load(Q, 2, 100, size * 2 + size // 2)] == [3, 4]
    assert [m.seq for m in h.s.load(Q, 4, 100, 1)] == [5]


def test_remove(h: Harness) -> None:
    for seq in range(1, 6):
        h.track(h.s.add(msg(Q, seq), None))
    h.settle()
    h.track(h.s.remove(Q, 2))
    h.track(h.s.remove(Q, 4))
    h.track(h.s.remove(Q, 99))  # unknown: harmless
    assert loaded(h, Q) == [1, 3, 5]
    h.reopen()
    assert loaded(h, Q) == [1, 3, 5]
    info = dest_info(h, Q)
    assert info is not None
    assert info[:2] == (5, 3)
    assert info[2] == 3 * msg(Q, 1).size


def test_remove_of_pending_add_drops_both(h: Harness) -> None:
    add = h.track(h.s.add(msg(Q, 1), None))
    rem = h.track(h.s.remove(Q, 1))
    assert loaded(h, Q) == []
    h.settle()
    assert add.done
    assert rem.done
    assert h.sink.count(add) == 1
    assert h.sink.count(rem) == 1
    h.reopen()
    assert loaded(h, Q) == []
    info = dest_info(h, Q)
    assert info is None or info[1] == 0


def test_remove_range(h: Harness) -> None:
    for seq in range(1, 11):
        h.track(h.s.add(msg(T, seq), None))
    h.track(h.s.remove_range(T, 6))
    assert loaded(h, T) == [7, 8, 9, 10]
    assert h.s.first_seq(T) == 7
    h.track(h.s.add(msg(T, 11), None))
    h.reopen()
    assert loaded(h, T) == [7, 8, 9, 10, 11]
    h.track(h.s.remove_range(T, 100))
    assert loaded(h, T) == []
    h.reopen()
    assert loaded(h, T) == []
    assert dest_info(h, T) is not None


def test_first_seq_with_and_without_time(h: Harness) -> None:
    assert h.s.first_seq(T) == 0
    for seq, ts in [(1, 100), (2, 200), (3, 200), (4, 400)]:
        h.track(h.s.add(msg(T, seq, ts=ts), None))
    assert h.s.first_seq(T) == 1
    assert h.s.first_seq(T, 150) == 2
    assert h.s.first_seq(T, 400) == 4
    assert h.s.first_seq(T, 401) == 0
    h.track(h.s.remove(T, 1))
    h.settle()
    assert h.s.first_seq(T) == 2
    h.reopen()
    assert h.s.first_seq(T) == 2
    assert h.s.first_seq(T, 300) == 4


def test_transaction_commit_assigns_seqs_and_applies_removes(h: Harness) -> None:
    h.track(h.s.add(msg(Q, 1), None))
    h.track(h.s.add(msg(Q, 2), None))
    h.s.begin("tx-1")
    h.track(h.s.add(msg(Q, 0, b"first"), None, "tx-1"))
    h.track(h.s.add(msg("/queue/other", 0, b"second"), None, "tx-1"))
    h.track(h.s.add(msg(Q, 0, b"third"), None, "tx-1"))
    h.track(h.s.remove(Q, 1, None, "tx-1"))
    assert loaded(h, Q) == [1, 2]  # nothing visible, nothing removed before commit
    h.track(h.s.commit("tx-1", [3, 1, 4], None))
    assert loaded(h, Q) == [2, 3, 4]
    assert [m.body for m in h.s.load(Q, 2, 10, 1 << 20)] == [b"first", b"third"]
    assert [(m.seq, m.body) for m in h.s.load("/queue/other", 0, 10, 1 << 20)] == [(1, b"second")]
    h.reopen()
    assert loaded(h, Q) == [2, 3, 4]
    assert [m.body for m in h.s.load(Q, 2, 10, 1 << 20)] == [b"first", b"third"]
    assert loaded(h, "/queue/other") == [1]
    assert dest_info(h, Q) is not None
    assert dest_info(h, Q)[:2] == (4, 3)  # type: ignore[index]


def test_transaction_abort_drops_everything(h: Harness) -> None:
    h.track(h.s.add(msg(Q, 1), None))
    h.s.begin("tx-2")
    h.track(h.s.add(msg(Q, 0), None, "tx-2"))
    h.track(h.s.remove(Q, 1, None, "tx-2"))
    h.s.abort("tx-2")
    assert loaded(h, Q) == [1]
    h.reopen()
    assert loaded(h, Q) == [1]
    # The same transaction id can be used again afterwards.
    h.s.begin("tx-2")
    h.track(h.s.add(msg(Q, 0, b"again"), None, "tx-2"))
    h.track(h.s.commit("tx-2", [2], None))
    h.reopen()
    assert [m.body for m in h.s.load(Q, 1, 10, 1 << 20)] == [b"again"]


def test_commit_with_wrong_count_is_an_error(h: Harness) -> None:
    h.s.begin("tx-3")
    h.track(h.s.add(msg(Q, 0), None, "tx-3"))
    with pytest.raises(ValueError, match="tx-3"):
        h.s.commit("tx-3", [1, 2], None)
    with pytest.raises(ValueError, match="tx-3"):
        h.s.commit("tx-3", [], None)
    # The transaction is still open and commits with the right count.
    h.track(h.s.commit("tx-3", [1], None))
    assert loaded(h, Q) == [1]
    h.reopen()
    assert loaded(h, Q) == [1]


def test_empty_and_remove_only_transactions(h: Harness) -> None:
    h.track(h.s.add(msg(Q, 1), None))
    h.track(h.s.commit("never-begun", [], None))
    h.s.begin("acks")
    h.track(h.s.remove(Q, 1, None, "acks"))
    h.track(h.s.commit("acks", [], None))
    assert loaded(h, Q) == []
    h.reopen()
    assert loaded(h, Q) == []


def test_subscriptions_and_cursors(h: Harness) -> None:
    h.track(h.s.put_subscription(RecoveredSubscription("c1", "s1", T, None, 0)))
    h.track(h.s.put_subscription(RecoveredSubscription("c1", "s2", T, "price > 10", 5)))
    h.s.set_cursor("c1", "s1", 3)
    h.s.set_cursor("c1", "s1", 7)
    h.s.set_cursor("nobody", "none", 9)  # unknown: ignored
    h.reopen()
    assert h.recovery is not None
    subs = sorted(
        (s.client_id, s.name, s.destination, s.selector, s.cursor) for s in h.recovery.subscriptions
    )
    assert subs == [("c1", "s1", T, None, 7), ("c1", "s2", T, "price > 10", 5)]
    h.track(h.s.put_subscription(RecoveredSubscription("c1", "s1", "/topic/b", None, 1)))
    h.track(h.s.delete_subscription("c1", "s2"))
    h.reopen()
    assert h.recovery is not None
    subs = sorted(
        (s.client_id, s.name, s.destination, s.selector, s.cursor) for s in h.recovery.subscriptions
    )
    assert subs == [("c1", "s1", "/topic/b", None, 1)]


def test_delete_destination(h: Harness) -> None:
    for seq in range(1, 4):
        h.track(h.s.add(msg(Q, seq, headers={"x-dedup-id": f"d{seq}"}), None))
    h.track(h.s.mark_dispatched(Q, 2))
    h.track(h.s.add(msg(T, 1), None))
    h.track(h.s.delete_destination(Q))
    assert loaded(h, Q) == []
    h.reopen()
    assert dest_info(h, Q) is None
    assert loaded(h, Q) == []
    assert loaded(h, T) == [1]
    h.track(h.s.add(msg(Q, 1, b"new"), None))
    assert [m.body for m in h.s.load(Q, 0, 10, 1 << 20)] == [b"new"]
    h.reopen()
    assert dest_info(h, Q) == (1, 1, msg(Q, 1, b"new").size, 0, [])


def test_a_commit_never_removes_a_message_of_a_destination_created_again(h: Harness) -> None:
    """A transacted ack of a message whose destination is deleted before the commit acknowledges
    nothing: the destination created again hands out the same sequence to another message."""
    h.track(h.s.add(msg(Q, 1, b"old"), None))
    h.settle()
    h.s.begin("tx-1")
    h.track(h.s.remove(Q, 1, None, "tx-1"))
    h.track(h.s.delete_destination(Q))
    h.track(h.s.add(msg(Q, 1, b"new"), None))
    h.track(h.s.commit("tx-1", [], None))
    assert [m.body for m in h.s.load(Q, 0, 10, 1 << 20)] == [b"new"]
    h.reopen()
    assert [m.body for m in h.s.load(Q, 0, 10, 1 << 20)] == [b"new"]
    assert dest_info(h, Q) == (1, 1, msg(Q, 1, b"new").size, 0, [])


def test_dispatch_mark_survives(h: Harness) -> None:
    h.track(h.s.add(msg(Q, 1), None))
    h.track(h.s.mark_dispatched(Q, 1))
    h.track(h.s.mark_dispatched("/queue/fresh", 9))
    h.reopen()
    assert dest_info(h, Q) == (1, 1, msg(Q, 1).size, 1, [])
    info = dest_info(h, "/queue/fresh")
    assert info is not None
    assert info[3] == 9


def test_dedup_ids_window(h: Harness) -> None:
    for seq in range(1, 6):
        h.track(h.s.add(msg(Q, seq, headers={"x-dedup-id": f"d{seq}"}), None))
    h.s.begin("t")
    h.track(h.s.add(msg(Q, 0, headers={"x-dedup-id": "in-tx"}), None, "t"))
    h.s.begin("aborted")
    h.track(h.s.add(msg(Q, 0, headers={"x-dedup-id": "never"}), None, "aborted"))
    h.s.abort("aborted")
    h.track(h.s.commit("t", [6], None))
    h.track(h.s.remove(Q, 5))
    h.reopen()
    info = dest_info(h, Q)
    assert info is not None
    assert info[4] == ["d4", "d5", "in-tx"]  # window of 3, oldest first
    h.reopen()
    info = dest_info(h, Q)
    assert info is not None
    assert info[4] == ["d4", "d5", "in-tx"]


def test_sink_gets_every_handle_once(h: Harness) -> None:
    handles = [h.track(h.s.add(msg(Q, seq), None)) for seq in range(1, 50)]
    handles.append(h.track(h.s.remove(Q, 3)))
    handles.append(h.track(h.s.remove(Q, 49)))
    h.s.begin("t")
    handles.append(h.track(h.s.add(msg(Q, 0), None, "t")))
    handles.append(h.track(h.s.commit("t", [50], None)))
    handles.append(h.track(h.s.mark_dispatched(Q, 10)))
    handles.append(h.track(h.s.remove_range(Q, 5)))
    handles.append(h.track(h.s.put_subscription(RecoveredSubscription("c", "n", T, None, 0))))
    handles.append(h.track(h.s.delete_subscription("c", "n")))
    handles.append(h.track(h.s.delete_destination("/queue/x")))
    h.settle()
    for handle in handles:
        assert handle.state in (WriteState.WRITTEN, WriteState.CANCELLED)
        assert h.sink.count(handle) == 1
    assert len(h.sink.delivered) == len({id(x) for x in h.sink.delivered})


def test_stats_shape(h: Harness) -> None:
    h.track(h.s.add(msg(Q, 1), None))
    h.settle()
    stats = h.s.stats()
    assert stats.written_records >= 1
    assert stats.pending_writes == 0
    assert stats.pending_write_bytes == 0
