"""Taking the index away from a master that may still be alive (high availability).

A master that lost its lease while frozen (SIGSTOP, a paused VM) still holds the LMDB write
transaction of `index/`, and LMDB's lock would make the next master wait for it for ever. So the
next master, when the previous one may still be alive, moves `index/` aside to `index.detached/`
(the frozen process keeps its open files there, and whatever it commits on waking lands there,
read by nobody) and works on a copy of its `data.mdb` in a new `index/` with a lock file of its
own. The copy is the last committed state; without the clean marker the start checks it in full
and replays the journal from its checkpoint (or rebuilds it if the copy is unusable).
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from sluice.errors import StoreError

__all__ = ["DETACHED_NAME", "detach_index"]

log = logging.getLogger(__name__)

DETACHED_NAME = "index.detached"


def detach_index(data_dir: Path) -> None:
    """Move `data_dir/index` aside and start a new one from a copy of its data file."""
    index_dir = data_dir / "index"
    if not index_dir.is_dir():
        return
    detached = data_dir / DETACHED_NAME
    try:
        if detached.exists():
            shutil.rmtree(detached)
        index_dir.rename(detached)
        index_dir.mkdir()
        source = detached / "data.mdb"
        if source.is_file():
            shutil.copyfile(source, index_dir / "data.mdb")
    except OSError as exc:
        raise StoreError(f"cannot detach the index: {exc.strerror}", str(index_dir)) from exc
    log.warning(
        "the previous master may still be alive: its index moved to %s, working on a copy",
        detached,
    )
