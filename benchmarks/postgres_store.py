"""Micro benchmark of the PostgreSQL store, driven directly (no broker). As root: it starts a
throwaway PostgreSQL server (`tests/pgserver.py`, `fsync = on`) for the run.

    python benchmarks/postgres_store.py [--seconds 5] [--outstanding 1,8] [--size 256]
    python benchmarks/postgres_store.py --url postgresql://user@host/db   # an existing server

Persistent messages of `--size` bytes, keeping N adds outstanding (the main thread plays the
event loop: the sink hands completed batches to it through a queue, and it issues one new add
per completion, as producers waiting for their receipts would). Each add of the measured window
is removed again (an acknowledgement nobody waits for) once written, so the table stays small.
Prints adds/s, batches/s and adds per batch, for each N.
"""

from __future__ import annotations

import argparse
import os
import queue
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from sluice.store.api import StoredMessage, WriteHandle
from sluice.store.postgres.store import PostgresStore

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from pgserver import PgServer

Q = "/queue/bench"


def _message(seq: int, body: bytes) -> StoredMessage:
    return StoredMessage(Q, seq, f"m-{seq}", int(time.time() * 1000), {}, body)


def bench_adds(url: str, schema: str, outstanding: int, seconds: float, size: int) -> None:
    """Keep `outstanding` adds in flight for `seconds`; print the rates."""
    completions: queue.SimpleQueue[Sequence[WriteHandle]] = queue.SimpleQueue()
    store = PostgresStore(url, schema=schema)
    store.open(completions.put)
    body = os.urandom(size)
    seq = 0
    seqs: dict[WriteHandle, int] = {}

    def add() -> None:
        nonlocal seq
        seq += 1
        handle = store.add(_message(seq, body), None)
        seqs[handle] = seq

    for _ in range(outstanding):
        add()
    done = 0
    batches0 = store.stats().batches
    start = time.perf_counter()
    deadline = start + seconds
    while time.perf_counter() < deadline:
        handles = completions.get()
        for handle in handles:
            done_seq = seqs.pop(handle, None)
            if done_seq is None:
                continue  # a remove's completion
            done += 1
            store.remove(Q, done_seq, None)
            add()
    elapsed = time.perf_counter() - start
    batches = store.stats().batches - batches0
    store.close()
    print(
        f"outstanding={outstanding:>3}  adds/s={done / elapsed:>8,.0f}  "
        f"batches/s={batches / elapsed:>7,.0f}  adds/batch={done / max(batches, 1):5.1f}",
        flush=True,
    )


def main() -> None:
    """Run the benchmark."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--outstanding", default="1,8")
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--url", default="", help="an existing server (default: a throwaway one)")
    args = parser.parse_args()
    server = None
    url = args.url
    if not url:
        server = PgServer()
        server.init()
        server.start()
        url = server.url()
    try:
        for n, outstanding in enumerate(int(x) for x in args.outstanding.split(",")):
            bench_adds(url, f"bench_{os.getpid()}_{n}", outstanding, args.seconds, args.size)
    finally:
        if server is not None:
            server.destroy()


if __name__ == "__main__":
    main()
