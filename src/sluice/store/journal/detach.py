"""Taking the store away from a master that may still be alive (high availability).

A master that lost its lease while frozen (SIGSTOP, a paused VM) still has the journal's head
file open and holds the LMDB write transaction of `index/`; on waking it may complete one write
it had begun before it knew (see docs/high-availability.md). The next master, when the previous
one may still be alive, cuts it off from both before it opens the store:

- the newest data file is replaced by a copy of itself (written beside it, synced, renamed over
  it): the old master's descriptor still points at the old file, which is no longer in the
  journal, so whatever it writes there is read by nobody;
- `index/` is moved aside to `index.detached/` (LMDB's lock would otherwise make the new master
  wait for the old one for ever), and the new master works on a copy of its `data.mdb` in a new
  `index/` with a lock file of its own. The copy is the last committed state; without the clean
  marker the start checks it in full and replays the journal from its checkpoint (or rebuilds it
  if the copy is unusable).

The old master cannot start a data file either: a new data file is linked into place, never
renamed over one that exists (`files.Preallocator.take`).
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

from sluice.errors import StoreError
from sluice.store.journal.files import file_path, fsync_dir, list_files

__all__ = ["DETACHED_INDEX", "detach_previous_master"]

log = logging.getLogger(__name__)

DETACHED_INDEX = "index.detached"
_COPY_SUFFIX = ".detaching"


def detach_previous_master(data_dir: Path) -> None:
    """Replace the newest data file by a copy, and move `index/` aside for a copy of itself."""
    try:
        _copy_head(data_dir / "journal")
        _copy_index(data_dir)
    except OSError as exc:
        raise StoreError(f"cannot take the store from the previous master: {exc}") from exc
    log.warning(
        "the previous master may still be alive: the journal's newest file and the index are "
        "copies now (its index moved to %s)",
        data_dir / DETACHED_INDEX,
    )


def _copy_head(journal_dir: Path) -> None:
    files = list_files(journal_dir)
    if not files:
        return
    head = file_path(journal_dir, files[-1])
    copy = head.with_name(head.name + _COPY_SUFFIX)
    shutil.copyfile(head, copy)
    fd = os.open(copy, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(copy, head)
    fsync_dir(journal_dir)


def _copy_index(data_dir: Path) -> None:
    index_dir = data_dir / "index"
    if not index_dir.is_dir():
        return
    detached = data_dir / DETACHED_INDEX
    if detached.exists():
        shutil.rmtree(detached)
    index_dir.rename(detached)
    index_dir.mkdir()
    source = detached / "data.mdb"
    if source.is_file():
        shutil.copyfile(source, index_dir / "data.mdb")
