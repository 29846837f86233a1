"""`QueuePicking.window` over a queue a store pages: windows read one after another give every
message once, in order, even when a store's page stops short of its byte budget because the
next message would not fit (a large message behind small ones)."""

from __future__ import annotations

from sluice.core.picking import Place
from sluice.core.queue import Queue

from .fakes import Harness
from .test_operations import _PagingStore

SOURCE = "/queue/src"


def test_windows_go_past_a_page_cut_short_by_a_large_message() -> None:
    h = Harness(_PagingStore(), limits={"destination_memory_limit_bytes": 6000})
    producer, _ = h.connect()
    sizes = [100, 100, 3000, 100, 5000, 3000, 100, 4000]
    sent = [h.send(producer, SOURCE, b"x" * size, persistent=True) for size in sizes]
    queue = h.broker.destinations[SOURCE]
    assert isinstance(queue, Queue)
    seen: list[int] = []
    places: set[Place] = set()
    after: int | None = 0
    windows = 0
    while after is not None:
        window = queue.window(after, 100, max_bytes=2000)
        seen += [found.message.seq for found in window.found]
        places.update(found.place for found in window.found)
        after = window.next_after
        windows += 1
        assert windows <= len(sizes) + 1
    assert seen == [message.seq for message in sent]
    assert Place.UNREAD in places  # some were in the store alone
