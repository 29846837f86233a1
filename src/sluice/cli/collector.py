"""How the broker process uses the cyclic garbage collector: what survives a full collection is
frozen out of the next ones, and everything is thawed for a complete collection once as many
objects have been frozen since the last complete one as survived it.

Why. Every message a queue holds is one object the collector tracks (`Message`; its headers are
a dict of strings, which the collector does not track, and its body bytes). A full (generation 2)
collection visits every tracked object, and the interpreter runs one whenever a quarter as many
objects as the last one left have survived two young collections since. With 200,000 messages
queued, a full collection took 150 ms of CPU, and a steady 2,000 persistent messages a second
brought one every three seconds: a stall of the event loop each time (docs/benchmarks.md,
"Garbage collection with a backlog").

What. After each full collection its survivors are frozen (`gc.freeze`): moved to the permanent
generation, which no collection visits. The next full collections visit only what was created
since, so their cost follows the traffic, not the backlog. Freezing costs nothing (it links two
lists), and freezes objects the collection has just found reachable.

What is freed. Reference counting frees a frozen object as before once nothing refers to it: a
queued message is freed when it is acknowledged, and nothing the broker builds per message is in
a reference cycle (tests/server/test_no_cycles.py). Only a cycle of frozen objects that became
garbage after their freeze (a connection, a subscription, a destination that lived a while)
outlives its use. So once the survivors frozen since the last complete collection add up to as
many as that collection left (`FROZEN_GROWTH_FACTOR`), everything is thawed (`gc.unfreeze`): the
next full collection visits every object, frees such cycles, and its survivors are frozen again.
The cyclic garbage held at any time is so bounded by what was alive at the last complete
collection, whose cost is spread over as many objects frozen since. The frozen set is never
counted: `gc.get_freeze_count` walks it, as slow as a collection; a collection's survivors are.
Whoever needs every cycle freed at once (the broker after removing many destinations) thaws and
collects (`gc.unfreeze()`, `gc.collect()`); that collection is complete, and counts as one.

Only the `sluice broker` process installs this (an application that embeds the broker keeps its
own garbage collector settings). It follows the generational collector of CPython 3.11 to 3.13.
"""

from __future__ import annotations

import gc
from typing import Any

# Objects frozen after incomplete collections may add up to this many times the number that
# survived the last complete collection before everything is thawed.
FROZEN_GROWTH_FACTOR = 1.0


class FreezeSurvivors:
    """The `gc.callbacks` entry that freezes the survivors of every full collection, and thaws
    everything once those frozen since the last complete collection outnumber its survivors
    `growth_factor` times."""

    def __init__(self, growth_factor: float = FROZEN_GROWTH_FACTOR) -> None:
        if growth_factor <= 0:
            raise ValueError(f"growth_factor must be above 0, got {growth_factor}")
        self.growth_factor = growth_factor
        # Frozen with the rest (a list: always tracked). Found among a collection's survivors
        # only if everything was thawed since, by this class or anyone's `gc.unfreeze()`: that
        # collection visited every object.
        self._sentinel: list[None] = []
        # Survivors of the last complete collection, and of the incomplete ones since (frozen
        # after each; some freed since by reference counting, which nobody counts).
        self.complete_survivors = 0
        self.frozen_since_complete = 0
        self.full_collections = 0
        self.complete_collections = 0
        self.thaws = 0

    def install(self) -> None:
        """Start with a complete collection now, whose survivors (what the start built) are
        frozen."""
        gc.unfreeze()
        gc.callbacks.append(self.on_collection)
        gc.collect()

    def uninstall(self) -> None:
        """Stop freezing, and thaw what is frozen."""
        if self.on_collection in gc.callbacks:
            gc.callbacks.remove(self.on_collection)
        gc.unfreeze()

    def on_collection(self, phase: str, info: dict[str, Any]) -> None:
        """After a full collection: freeze its survivors; thaw everything when the bound is
        passed (the next full collection is then complete)."""
        if phase != "stop" or info["generation"] != 2:
            return
        survivors = gc.get_objects(generation=2)
        count = len(survivors)
        sentinel = self._sentinel
        complete = any(obj is sentinel for obj in survivors)
        del survivors
        gc.freeze()
        self.full_collections += 1
        if complete:
            self.complete_collections += 1
            self.complete_survivors = count
            self.frozen_since_complete = 0
            return
        self.frozen_since_complete += count
        if self.frozen_since_complete > self.complete_survivors * self.growth_factor:
            gc.unfreeze()
            self.thaws += 1
