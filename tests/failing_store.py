"""A store whose writes fail from a chosen moment on, as the journal's do after an I/O error
(a failed `pwritev` or `fsync`): every later write completes FAILED, with an error, through the
completion sink, and nothing more is stored."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from sluice.errors import StoreError
from sluice.store.api import StoredMessage, WriteHandle, WriteState
from sluice.store.memory import MemoryStore

INJECTED = "injected pwritev failure: No space left on device"


class FailingStore(MemoryStore):
    """The memory store, until `fail_writes()`; then every write fails."""

    def __init__(self) -> None:
        super().__init__()
        self.failing = False

    def fail_writes(self) -> None:
        """From now on, every write fails."""
        self.failing = True

    def _fail(self, on_complete: Callable[[WriteHandle], None] | None, size: int) -> WriteHandle:
        handle = WriteHandle(on_complete, size)
        handle.state = WriteState.FAILED
        handle.error = StoreError(INJECTED, "journal/db-1.log", 4096)
        self._stats.write_errors += 1
        if self._sink is not None:
            self._sink((handle,))
        return handle

    def add(
        self,
        message: StoredMessage,
        on_complete: Callable[[WriteHandle], None] | None,
        txid: str | None = None,
    ) -> WriteHandle:
        if self.failing:
            return self._fail(on_complete, message.size)
        return super().add(message, on_complete, txid)

    def remove(
        self,
        destination: str,
        seq: int,
        on_complete: Callable[[WriteHandle], None] | None = None,
        txid: str | None = None,
    ) -> WriteHandle:
        if self.failing:
            return self._fail(on_complete, 0)
        return super().remove(destination, seq, on_complete, txid)

    def commit(
        self, txid: str, seqs: Sequence[int], on_complete: Callable[[WriteHandle], None] | None
    ) -> WriteHandle:
        if self.failing:
            self.abort(txid)
            return self._fail(on_complete, 0)
        return super().commit(txid, seqs, on_complete)
