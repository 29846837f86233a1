"""The index checks itself at every open, after a crash as after a clean stop: LMDB's file read
as a file before it is mapped, every entry read back against the digest written with it. Damage
is reported and the index rebuilt from the journal; an intact index is never thrown away."""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

import sluice
from sluice.store.journal.index import DIGESTED, Index, digest_problems, verify_entries
from sluice.store.journal.indexcodec import MsgLoc, dkey, msg_key
from sluice.store.journal.lmdbcheck import LmdbDamage, check_file, read_meta
from sluice.store.journal.store import JournalStore

from .helpers import Harness, Sink, copy_running, fields, journal_config, msg
from .test_gc import QUIET, journal, snapshot, workload

SRC = str(Path(sluice.__file__).resolve().parents[1])
Q = "/queue/ix"
NAMES = (b"meta", *DIGESTED)


def crashed_copy(h: Harness, target: Path) -> None:
    s = journal(h)
    s.checkpoint()
    copy_running(s, target)


def test_every_kind_of_write_keeps_the_digest_exact(
    make_journal: Callable[..., Harness], tmp_path: Path
) -> None:
    h = make_journal(dedup_window=50, compaction_live_ratio=0.5, **QUIET)
    h.open()
    workload(h, random.Random(11), 30)
    crashed_copy(h, tmp_path / "crashed")
    recovery = h.reopen()
    assert recovery.report == []
    expected = snapshot(h)  # from what the reopen recovered
    again = make_journal(tmp_path / "crashed", dedup_window=50)
    recovery = again.open()
    assert not any("index" in line for line in recovery.report), recovery.report
    assert snapshot(again) == expected


def test_index_file_may_end_before_its_free_pages(tmp_path: Path) -> None:
    # LMDB never writes a page that was allocated and freed in one transaction, so the file
    # may end before the last page its meta page names, when those pages are free. A page a
    # tree uses past the end is a truncation.
    index = Index.create(tmp_path / "index", 1 << 30, b"i" * 16, durable=True)
    keys = [n.to_bytes(24, "big") for n in range(1499)]
    value = MsgLoc(1, 47, 100, 1, 0).encode()
    for batch in (keys[:1000], keys[1000:]):
        index.begin_write()
        index.write_meta((1, 47), 1, ok=True)
        for key in batch:
            index.put(b"msgs", key, value)
        index.commit()
    for batch in (keys[:1000], keys[1000:1498]):
        index.begin_write()
        for key in batch:
            index.delete(b"msgs", key)
        index.commit()
    index.close(clean=False)
    data = tmp_path / "index" / "data.mdb"
    checked = check_file(data, NAMES)
    page = checked.meta.page_bytes
    end = checked.meta.last_page + 1
    while end - 1 in checked.free_pages:
        end -= 1
    assert end <= checked.meta.last_page, "this sequence leaves free pages at the end"
    os.truncate(data, end * page)
    check_file(data, NAMES)
    reopened = Index.open_checked(
        tmp_path / "index", 1 << 30, b"i" * 16, durable=True, file_sizes={1: 4096}
    )
    assert reopened.verified.entries[b"msgs"] == 1
    reopened.close(clean=False)
    os.truncate(data, (end - 1) * page)
    with pytest.raises(LmdbDamage, match="past the end of the file"):
        check_file(data, NAMES)


def _entry_offsets(data: bytes, loc: MsgLoc) -> list[int]:
    """Where the entry's value is in the file (old copies in free pages too)."""
    raw = loc.encode()
    found = [data.find(raw)]
    while found[-1] >= 0:
        found.append(data.find(raw, found[-1] + 1))
    assert len(found) > 1
    return found[:-1]


def test_changed_index_entry_after_a_crash_is_found_and_rebuilt(
    make_journal: Callable[..., Harness], tmp_path: Path
) -> None:
    h = make_journal(**QUIET)
    h.open()
    s = journal(h)
    written = [msg(Q, seq, os.urandom(300)) for seq in range(1, 200)]
    for m in written:
        h.track(s.add(m, None))
    h.settle()
    crashed_copy(h, tmp_path / "crashed")
    index = s._index
    assert index is not None
    with index.begin_read() as txn:
        loc = MsgLoc.decode(txn.get(msg_key(dkey(Q), 100), db=index.dbs[b"msgs"]))
    data_file = tmp_path / "crashed" / "index" / "data.mdb"
    raw = bytearray(data_file.read_bytes())
    for at in _entry_offsets(bytes(raw), loc):
        raw[at + 4] ^= 0x10  # the record offset: a plausible lie
    data_file.write_bytes(bytes(raw))
    store = JournalStore(journal_config(tmp_path / "crashed"))
    recovery = store.open(Sink())
    try:
        assert any("index rebuilt" in line and "digest" in line for line in recovery.report)
        assert [fields(m) for m in store.load(Q, 0, 10**6, 1 << 62)] == [fields(m) for m in written]
    finally:
        store.close()


_OPEN_AND_COUNT = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from sluice.config import StoreConfig
    from sluice.store.journal.store import JournalStore
    store = JournalStore(StoreConfig(data_dir=Path(sys.argv[1]), journal_file_bytes=1 << 20))
    recovery = store.open(lambda handles: None)
    print(len(store.load("/queue/ix", 0, 10**6, 1 << 62)))
    print("\\n".join(recovery.report))
    store.close()
    """
)


@pytest.mark.parametrize("keep", [0.9, 0.5, 0.1, 0.0])
def test_truncated_index_after_a_crash_is_rebuilt_without_crashing(
    make_journal: Callable[..., Harness], tmp_path: Path, keep: float
) -> None:
    h = make_journal(**QUIET)
    h.open()
    s = journal(h)
    for seq in range(1, 3001):
        h.track(s.add(msg(Q, seq, b"x" * 200), None))
    h.settle()
    target = tmp_path / "crashed"
    crashed_copy(h, target)
    data_file = target / "index" / "data.mdb"
    os.truncate(data_file, int(data_file.stat().st_size * keep) // 4096 * 4096 + 100)
    # In a child process: a store that maps a truncated LMDB file dies of SIGBUS.
    proc = subprocess.run(  # noqa: PLW1510 - a crash is the finding, asserted below
        [sys.executable, "-c", _OPEN_AND_COUNT, str(target)],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=SRC),
        timeout=120,
    )
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    count, *report = proc.stdout.splitlines()
    assert count == "3000"
    assert any("index rebuilt" in line for line in report), report


def test_damaged_page_header_is_named(make_journal: Callable[..., Harness]) -> None:
    h = make_journal(**QUIET)
    h.open()
    s = journal(h)
    for seq in range(1, 3001):
        h.track(s.add(msg(Q, seq, b"y" * 100), None))
    h.close()
    data_file = s.config.data_dir / "index" / "data.mdb"
    meta = read_meta(data_file)
    raw = bytearray(data_file.read_bytes())
    root = meta.main.root
    raw[root * meta.page_bytes] ^= 0x01  # the page number the main tree's root page claims
    data_file.write_bytes(bytes(raw))
    with pytest.raises(LmdbDamage, match=f"page {root} .*header names page"):
        check_file(data_file, NAMES)


def test_verify_entries_matches_a_fresh_index(tmp_path: Path) -> None:
    index = Index.create(tmp_path / "index", 1 << 30, b"i" * 16, durable=False)
    index.begin_write()
    rng = random.Random(5)
    keys = [rng.randbytes(24) for _ in range(500)]
    for key in keys:
        index.put(b"msgs", key, MsgLoc(1, 47, 100, 10, 0).encode())
    for key in keys[:200]:
        index.delete(b"msgs", key)
    index.put(b"msgs", keys[300], MsgLoc(1, 147, 100, 10, 0).encode())
    index.commit()
    with index.env.begin() as txn:
        found, result = verify_entries(txn, index.dbs, {1: 4096})
        assert digest_problems(txn, index.dbs, found) == []
    assert result.entries[b"msgs"] == 300
    index.close(clean=False)
    shutil.rmtree(tmp_path / "index")
