"""Micro benchmark of the journal store, driven directly (no broker).

    python benchmarks/journal_store.py adds  [--seconds 5] [--dir DIR]
    python benchmarks/journal_store.py open  [--messages 1000000] [--dir DIR]

`adds`: 1 KiB persistent messages with SyncPolicy ALWAYS, keeping 1 and then 8 adds outstanding
(the main thread plays the event loop: the sink hands completed batches to it through a queue, and
it issues one new add per completion). Prints adds/s, syncs/s and adds per sync.

`open`: fills a store with N messages of `--body-bytes` in a child process that exits with
os._exit once all are acknowledged (no close: a crash), then times opens: after the crash (replay
from the last checkpoint) and after a clean close, each with `verify_journal` full (every record
checksummed, the default) and after_checkpoint; the index check alone (data.mdb read as a file,
every entry read back against its digest); and an open after deleting the index (full rebuild).
"""

from __future__ import annotations

import argparse
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import lmdb

from sluice.config import JournalVerify, StoreConfig, SyncPolicy
from sluice.store.api import StoredMessage, WriteHandle
from sluice.store.journal.files import file_path, list_files
from sluice.store.journal.index import DIGESTED, check_structure, verify_entries
from sluice.store.journal.store import JournalStore


def _message(seq: int, body: bytes) -> StoredMessage:
    return StoredMessage("/queue/bench", seq, f"m-{seq}", int(time.time() * 1000), {}, body)


def bench_adds(data_dir: Path, outstanding: int, seconds: float) -> None:
    shutil.rmtree(data_dir, ignore_errors=True)
    completions: queue.SimpleQueue[int] = queue.SimpleQueue()

    def sink(handles: Sequence[WriteHandle]) -> None:
        completions.put(len(handles))

    store = JournalStore(StoreConfig(data_dir=data_dir, sync=SyncPolicy.ALWAYS))
    store.open(sink)
    body = os.urandom(1024)
    seq = 0
    for _ in range(outstanding):
        seq += 1
        store.add(_message(seq, body), None)
    done = 0
    syncs0 = store.stats().syncs
    start = time.perf_counter()
    deadline = start + seconds
    while time.perf_counter() < deadline:
        n = completions.get()
        done += n
        for _ in range(n):
            seq += 1
            store.add(_message(seq, body), None)
    elapsed = time.perf_counter() - start
    syncs = store.stats().syncs - syncs0
    store.close()
    print(
        f"outstanding={outstanding:>3}  adds/s={done / elapsed:>9,.0f}  "
        f"syncs/s={syncs / elapsed:>7,.0f}  adds/sync={done / max(syncs, 1):6.1f}"
    )


_FILL = """
import os, sys, threading
from pathlib import Path
from sluice.config import StoreConfig, SyncPolicy
from sluice.store.api import StoredMessage
from sluice.store.journal.store import JournalStore
n = int(sys.argv[2])
done = threading.Semaphore(0)
count = [0]
def sink(handles):
    count[0] += len(handles)
    if count[0] >= n:
        done.release()
store = JournalStore(StoreConfig(data_dir=Path(sys.argv[1]), sync=SyncPolicy.NEVER))
store.open(sink)
body = os.urandom(int(sys.argv[3]))
for seq in range(1, n + 1):
    store.add(StoredMessage(f"/queue/q{seq % 10}", seq, str(seq), seq, {}, body), None)
    if seq % 20000 == 0:
        while count[0] < seq - 20000:
            threading.Event().wait(0.001)
done.acquire()
os._exit(0)
"""


def _timed_open(data_dir: Path, label: str, verify: JournalVerify) -> None:
    store = JournalStore(StoreConfig(data_dir=data_dir, verify_journal=verify))
    start = time.perf_counter()
    recovery = store.open(lambda handles: None)
    elapsed = time.perf_counter() - start
    messages = sum(d.message_count for d in recovery.destinations)
    store.close()
    print(f"{label:<44} {elapsed:7.2f} s  ({messages:,} messages)")
    for line in recovery.report:
        print(f"    {line}")


def _timed_index_check(data_dir: Path) -> None:
    journal = data_dir / "journal"
    sizes = {n: file_path(journal, n).stat().st_size for n in list_files(journal)}
    start = time.perf_counter()
    check_structure(data_dir / "index")
    walked = time.perf_counter()
    env = lmdb.open(str(data_dir / "index"), max_dbs=8, readonly=True, lock=False)
    dbs = {name: env.open_db(name, create=False) for name in (*DIGESTED, b"meta")}
    with env.begin() as txn:
        _found, result = verify_entries(txn, dbs, sizes)
    env.close()
    done = time.perf_counter()
    entries = sum(result.entries.values())
    print(
        f"{'index check: file walk / entry scan':<44} {walked - start:7.2f} s / "
        f"{done - walked:.2f} s  ({entries:,} entries)"
    )


def bench_open(data_dir: Path, messages: int, body_bytes: int) -> None:
    shutil.rmtree(data_dir, ignore_errors=True)
    start = time.perf_counter()
    fill = [sys.executable, "-c", _FILL, str(data_dir), str(messages), str(body_bytes)]
    subprocess.run(fill, check=True)
    elapsed = time.perf_counter() - start
    print(f"fill {messages:,} messages ({body_bytes} B, sync never): {elapsed:.1f} s")
    journal_bytes = sum(p.stat().st_size for p in (data_dir / "journal").iterdir())
    print(f"journal {journal_bytes / 2**20:,.0f} MiB")
    killed = data_dir.with_name(data_dir.name + "-killed")
    shutil.rmtree(killed, ignore_errors=True)
    shutil.copytree(data_dir, killed)
    try:
        _timed_open(data_dir, "open after kill, verify full", JournalVerify.FULL)
        _timed_open(
            killed, "open after kill, verify after_checkpoint", JournalVerify.AFTER_CHECKPOINT
        )
    finally:
        shutil.rmtree(killed, ignore_errors=True)
    _timed_open(data_dir, "open after clean close, verify full", JournalVerify.FULL)
    _timed_open(
        data_dir, "open after clean close, after_checkpoint", JournalVerify.AFTER_CHECKPOINT
    )
    _timed_index_check(data_dir)
    shutil.rmtree(data_dir / "index")
    _timed_open(data_dir, "open with index deleted (rebuild)", JournalVerify.FULL)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["adds", "open"])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--body-bytes", type=int, default=256)
    parser.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args()
    data_dir = args.dir or Path(tempfile.mkdtemp(prefix="sluice-bench-"))
    try:
        if args.what == "adds":
            for outstanding in (1, 8, 64):
                bench_adds(data_dir, outstanding, args.seconds)
        else:
            bench_open(data_dir, args.messages, args.body_bytes)
    finally:
        if args.dir is None:
            shutil.rmtree(data_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
