"""What a journal store holds on disk, for operators (`JournalStore.inspect`): its data files
as the index's last checkpoint has them, each with its live messages by destination (read from
the index's reverse list of the file), the state records in it, and the files that must go
before it; and the archive.

It reads through an LMDB read transaction, which any thread may open: a snapshot of the last
commit, consistent in itself, while the writer goes on. Nothing here writes, nor touches what
the writer thread owns.
"""

from __future__ import annotations

import collections
import os
from pathlib import Path

import lmdb

from sluice.store.api import ArchiveView, DataFileView, StoreView
from sluice.store.journal.files import file_path, list_files
from sluice.store.journal.index import Index
from sluice.store.journal.indexcodec import DestInfo, FileInfo, IndexCorrupt, SubInfo

__all__ = ["inspect_journal"]

_FILE_NO = 4  # bytes of a file number at the start of a reverse-list key
_DEST_KEY = 16  # bytes of a destination key after it
_UNKNOWN = "(unknown destination)"


def inspect_journal(
    index: Index,
    data_dir: Path,
    head: tuple[int, int],
    max_messages: int,
) -> StoreView:
    """The store's files and archive, attributing at most `max_messages` live messages."""
    journal_dir = data_dir / "journal"
    try:
        with index.begin_read() as txn:
            dbs = index.dbs
            checkpoint = index.checkpoint_in(txn)
            infos = {
                int.from_bytes(key, "big"): FileInfo.decode(value)
                for key, value in txn.cursor(db=dbs[b"files"])
            }
            names: dict[bytes, str] = {}
            state_of: dict[int, list[str]] = collections.defaultdict(list)
            for key, value in txn.cursor(db=dbs[b"dests"]):
                dest = DestInfo.decode(value)
                names[bytes(key)] = dest.name
                for file_no in dest.files | {dest.seq_pin, dest.mark_pin}:
                    if file_no:
                        state_of[file_no].append(dest.name)
            for _key, value in txn.cursor(db=dbs[b"subs"]):
                sub = SubInfo.decode(value)
                what = f"{sub.destination} durable subscription {sub.client_id}/{sub.name}"
                for file_no in sub.files | {sub.pin, sub.put_pin}:
                    if file_no:
                        state_of[file_no].append(what)
            live, oldest, scanned, complete = _live_messages(
                txn, index, sorted(infos), names, max_messages
            )
    except (lmdb.Error, IndexCorrupt):
        # The store closed meanwhile, or the index cannot be read: nothing to say of its files.
        return StoreView("journal", str(data_dir), head=head, complete=False)
    files = []
    for number in list_files(journal_dir):
        try:
            size = file_path(journal_dir, number).stat().st_size
        except OSError:
            continue  # collected meanwhile
        info = infos.get(number, FileInfo())
        files.append(
            DataFileView(
                number=number,
                name=file_path(journal_dir, number).name,
                size_bytes=size,
                data_bytes=info.data_bytes,
                live_messages=info.live_msgs,
                live_bytes=info.live_bytes,
                pins=info.pins,
                transaction_pins=info.tx_pins,
                live_by_destination=dict(live.get(number, {})),
                oldest_by_destination=oldest.get(number, {}),
                state_of=sorted(set(state_of.get(number, ()))),
                depends_on=sorted(info.deps),
                head=number == head[0],
            )
        )
    return StoreView(
        "journal",
        str(data_dir),
        files,
        checkpoint=checkpoint,
        head=head,
        archive=_archive(data_dir / "archive"),
        messages_scanned=scanned,
        complete=complete,
    )


def _live_messages(
    txn: lmdb.Transaction,
    index: Index,
    file_nos: list[int],
    names: dict[bytes, str],
    max_messages: int,
) -> tuple[dict[int, collections.Counter[str]], dict[int, dict[str, int]], int, bool]:
    """Per file, the live messages by destination and the lowest sequence of each (a file's
    reverse list is sorted by destination key, then sequence)."""
    live: dict[int, collections.Counter[str]] = {}
    oldest: dict[int, dict[str, int]] = {}
    scanned = 0
    cursor = txn.cursor(db=index.dbs[b"rev"])
    for file_no in file_nos:
        prefix = file_no.to_bytes(_FILE_NO, "big")
        if not cursor.set_range(prefix):
            break
        counts: collections.Counter[str] = collections.Counter()
        lowest: dict[str, int] = {}
        for key in cursor.iternext(values=False):
            if bytes(key[:_FILE_NO]) != prefix:
                break
            if scanned >= max_messages:
                live[file_no], oldest[file_no] = counts, lowest
                return live, oldest, scanned, False
            scanned += 1
            name = names.get(bytes(key[_FILE_NO : _FILE_NO + _DEST_KEY]), _UNKNOWN)
            counts[name] += 1
            if name not in lowest:
                lowest[name] = int.from_bytes(key[_FILE_NO + _DEST_KEY :], "big")
        live[file_no], oldest[file_no] = counts, lowest
    return live, oldest, scanned, True


def _archive(archive_dir: Path) -> ArchiveView | None:
    """The archive's files, if archiving ever put any there."""
    numbers = list_files(archive_dir)
    if not numbers:
        return None
    total = 0
    for number in numbers:
        try:
            total += os.stat(file_path(archive_dir, number)).st_size
        except OSError:
            continue
    return ArchiveView(
        str(archive_dir),
        len(numbers),
        total,
        file_path(archive_dir, numbers[0]).name,
        file_path(archive_dir, numbers[-1]).name,
    )
