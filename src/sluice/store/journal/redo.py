"""Bringing the index's write transaction back after a commit that failed.

LMDB aborts a write transaction whose commit fails (ENOSPC while it writes its pages) and keeps
the state of the last commit, so the index on disk is consistent, at the previous checkpoint.
What the lost transaction held is all in the journal from that checkpoint on: the writer reloads
the state from the index in a new transaction and applies those records again, as recovery does
at a start, and the next checkpoint commits them.
"""

from __future__ import annotations

from pathlib import Path

from sluice.errors import CorruptionError
from sluice.store.journal import format as fmt
from sluice.store.journal.files import file_path, list_files
from sluice.store.journal.scan import Damage, FileScan
from sluice.store.journal.state import JournalState


def redo_since_commit(state: JournalState, journal_dir: Path, head: tuple[int, int]) -> int:
    """Start a new write transaction with `state` as the last commit left it, then apply every
    record from its checkpoint up to `head` (file, offset), the journal as the writer has it.
    Returns the records applied. Raises `CorruptionError` if a record the writer wrote does
    not read back."""
    index = state.index
    index.begin_write()
    state.reload()
    (cp_file, cp_offset), state.next_txno = index.read_meta()
    present = list_files(journal_dir)
    # Collected since the checkpoint (and named in a FILES_RETIRED record before they went).
    state.files_gone([f for f in state.files if f not in present])
    head_file, head_offset = head
    applied = 0
    for file_no in present:
        if file_no < cp_file or file_no > head_file:
            continue
        path = file_path(journal_dir, file_no)
        start = cp_offset if file_no == cp_file else 0
        scan = FileScan(path, start, records_from=start)
        end = head_offset if file_no == head_file else 0
        for item in scan:
            if isinstance(item, Damage):
                raise CorruptionError(
                    f"journal record unreadable after the index commit failed: {item.reason}",
                    str(path),
                    item.offset,
                )
            if file_no == head_file and item.offset >= head_offset:
                break
            if item.offset == 0:
                continue  # the file header
            record = fmt.decode(item.rtype, item.payload)
            state.apply(item.rtype, record, file_no, item.offset, item.length)
            applied += 1
        state.file_seen(file_no, end if file_no == head_file else scan.end_offset)
    return applied
