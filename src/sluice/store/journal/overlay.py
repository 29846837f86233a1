"""Changes the index has not committed yet, as the event-loop thread must already see them.

Readers merge the overlay over a read snapshot of the index. An entry is a pending or written add
(the writer's op), or a `Removed` marker for a removal; a floor hides every indexed message of a
destination at or below it (remove_range, delete_destination). Each floor stays until the commit
of its own op: a destination deleted (floor MAX_SEQ), filled again and trimmed (a low floor)
hides its old messages until the delete is committed, and after that only what the trim removed.

The writer drops entries once an index commit contains their effect: each op carries `Cleanup`
triples naming the entries it created, and an entry is dropped only if it is still the same
object, so a later change to the same key stays. That is why each removal has a marker of its
own: a destination deleted and filled again reuses sequences, and the commit of an old remove
must not drop a newer remove of the same key that the index does not hold yet.

Readers open their index snapshot while holding the store lock, and the writer drops entries under
that lock after its commit; so a reader sees each change either in the overlay, in its snapshot, or
(briefly) in both, never in neither. Every method here is called with the store lock held.
"""

from __future__ import annotations

from sortedcontainers import SortedDict

MAX_SEQ = (1 << 64) - 1


class Removed:
    """The overlay entry of one removal not committed yet (compared by identity)."""

    __slots__ = ()


# (destination, seq, entry) to drop if still present; seq -1 drops the floor whose token is entry.
Cleanup = list[tuple[str, int, object]]


class Overlay:
    """Per-destination sorted entries and floors."""

    def __init__(self) -> None:
        self.entries: dict[str, SortedDict] = {}
        # Per destination, the floors not committed yet: (upto_seq, token), in order.
        self.floors: dict[str, list[tuple[int, object]]] = {}

    def put(self, destination: str, seq: int, entry: object) -> None:
        """Show an add (or, with a `Removed` marker, a removal) at this key."""
        entries = self.entries.get(destination)
        if entries is None:
            entries = self.entries[destination] = SortedDict()
        entries[seq] = entry

    def discard(self, destination: str, seq: int) -> None:
        """Forget the key (a cancelled add: nothing was stored)."""
        entries = self.entries.get(destination)
        if entries is not None:
            entries.pop(seq, None)
            if not entries:
                del self.entries[destination]

    def set_floor(self, destination: str, upto_seq: int, token: object) -> None:
        """Hide everything of the destination up to `upto_seq`."""
        self.floors.setdefault(destination, []).append((upto_seq, token))
        entries = self.entries.get(destination)
        if entries is not None:
            for seq in list(entries.irange(maximum=upto_seq)):
                del entries[seq]
            if not entries:
                del self.entries[destination]

    def floor(self, destination: str) -> int:
        """Indexed messages at or below this are hidden."""
        floors = self.floors.get(destination)
        return max(upto for upto, _token in floors) if floors else 0

    def drop(self, cleanups: list[Cleanup]) -> None:
        """Forget entries whose effect the index now holds."""
        for cleanup in cleanups:
            for destination, seq, entry in cleanup:
                if seq < 0:
                    floors = self.floors.get(destination)
                    if floors is not None:
                        floors[:] = [f for f in floors if f[1] is not entry]
                        if not floors:
                            del self.floors[destination]
                    continue
                entries = self.entries.get(destination)
                if entries is not None and entries.get(seq, _MISSING) is entry:
                    del entries[seq]
                    if not entries:
                        del self.entries[destination]


_MISSING = object()
