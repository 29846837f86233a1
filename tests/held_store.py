"""A store whose completions the test releases: writes it holds are stored (a page read sees
them, as the journal's overlay shows a write at once) but not yet reported written, so receipts
and whatever waits on a write stay pending as long as the test wants."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from sluice.store.api import CompletionSink, Recovery, WriteHandle
from sluice.store.memory import MemoryStore


class HeldStore(MemoryStore):
    """The memory store, except that while `holding` its completions wait for `release()`.
    With `pages_to_disk` (in its capabilities) the broker pages to it as it would to the journal."""

    def __init__(self, *, pages_to_disk: bool = False) -> None:
        super().__init__()
        self.capabilities = dataclasses.replace(self.capabilities, pages_to_disk=pages_to_disk)
        self.holding = False
        self._held: list[WriteHandle] = []
        self._deliver: CompletionSink | None = None

    def open(self, sink: CompletionSink) -> Recovery:
        self._deliver = sink
        return super().open(self._complete_or_hold)

    def _complete_or_hold(self, handles: Sequence[WriteHandle]) -> None:
        if self.holding:
            self._held.extend(handles)
        else:
            assert self._deliver is not None
            self._deliver(handles)

    def release(self) -> None:
        """Stop holding and complete what was held (call on the broker's loop)."""
        self.holding = False
        held, self._held = self._held, []
        assert self._deliver is not None
        self._deliver(held)
