"""A destination's producers (`sluice.core.producers`): the connections open now that have sent
to it, each counted once, a connection counted for at most `MAX_PRODUCED_DESTINATIONS`
destinations (those it sent to last), and no destination kept alive by the connections that
sent to it."""

from __future__ import annotations

import gc
import weakref

from sluice.core.producers import MAX_PRODUCED_DESTINATIONS, ProducerMarks

from .fakes import Harness


def _producers(h: Harness) -> dict[str, int]:
    return {name: d.producers for name, d in h.broker.destinations.items()}


def test_each_connection_counts_once_until_it_closes() -> None:
    h = Harness()
    a, _ = h.connect()
    b, _ = h.connect()
    for _ in range(3):
        h.send(a, "/queue/x", b"m")
        h.send(a, "/topic/y", b"m")
    h.send(b, "/queue/x", b"m")
    assert _producers(h) == {"/queue/x": 2, "/topic/y": 1}
    assert h.broker.destinations["/queue/x"].view().producers == 2
    a.close()
    assert _producers(h) == {"/queue/x": 1, "/topic/y": 0}
    b.close()
    assert _producers(h) == {"/queue/x": 0, "/topic/y": 0}


def test_a_connection_counts_for_the_destinations_it_sent_to_last() -> None:
    h = Harness()
    a, _ = h.connect()
    assert a.producing.limit == MAX_PRODUCED_DESTINATIONS
    a.producing.limit = 3
    for name in ("q1", "q2", "q3"):
        h.send(a, f"/queue/{name}", b"m")
    h.send(a, "/queue/q1", b"m")  # q1 is the most recent again: q2 goes first
    h.send(a, "/queue/q4", b"m")
    assert _producers(h) == {"/queue/q1": 1, "/queue/q2": 0, "/queue/q3": 1, "/queue/q4": 1}
    assert len(a.producing) == 3
    h.send(a, "/queue/q2", b"m")  # counted again; q3 is now the oldest
    assert _producers(h) == {"/queue/q1": 1, "/queue/q2": 1, "/queue/q3": 0, "/queue/q4": 1}
    a.close()
    assert set(_producers(h).values()) == {0}
    assert len(a.producing) == 0


class _Destination:
    """What a mark needs of a destination: a count, and a weak reference to it."""

    def __init__(self) -> None:
        self.producers = 0


def test_a_mark_keeps_no_destination_alive() -> None:
    marks = ProducerMarks(limit=30)
    gone = _Destination()
    marks.note(gone)  # type: ignore[arg-type]
    kept = _Destination()
    marks.note(kept)  # type: ignore[arg-type]  # `last` now holds `kept`, not `gone`
    ref = weakref.ref(gone)
    del gone
    gc.collect()
    assert ref() is None
    assert kept.producers == 1
    # A destination created later (perhaps at a freed one's address) is counted anew.
    for _ in range(20):
        fresh = _Destination()
        marks.note(fresh)  # type: ignore[arg-type]
        assert fresh.producers == 1
    marks.clear()
    assert kept.producers == 0
