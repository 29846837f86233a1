"""Disk as a bounded resource: one store's room, measured against its limit and the free disk.

The broker measures each store every `DISK_CHECK_INTERVAL_S` and hands the numbers to its
`DiskBudget`. The room is the smaller of:

- the limit (`store.max_bytes`, or `limits.temp_limit_bytes` for the temp store) less what the
  store holds, when a limit is set;
- the free disk, plus what the store has preallocated and not written yet, less the reserve
  (`StoreConfig.disk_reserve_bytes`), when the store has a disk.

Between two measures, every byte accepted for the store is taken off the room, so a fast producer
cannot run far past it. With no room left the store is full: an episode starts, logged once and
counted, and producers meet the store's `store_full` policy until the room is back to
`resume_bytes` (one journal file: collection frees whole files) and the store has the space for
its next data file. The reserve is what keeps a full store working: acknowledgements, checkpoints,
compaction and the next data file are written into it, and they are what frees space.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from sluice.config import MiB, StoreFullPolicy
from sluice.errors import StoreFullError
from sluice.store.api import StoreStats

log = logging.getLogger(__name__)


def _mib(nbytes: int) -> str:
    return f"{nbytes / MiB:.1f} MiB"


class DiskBudget:
    """One store's disk: its room, whether it is full, and the episodes of being full."""

    def __init__(
        self,
        what: str,
        producers: str,
        *,
        counter: str,
        limit_name: str,
        limit_bytes: int,
        reserve_bytes: int,
        resume_bytes: int,
        policy: StoreFullPolicy,
        count: Callable[[str, int], None],
    ) -> None:
        self.what = what
        # Whose sends meet the policy: "persistent producers", "non-persistent producers".
        self.producers = producers
        # Names its counters: `<counter>_full_episodes`, `sends_refused_<counter>_full`.
        self.counter = counter
        self.limit_name = limit_name
        self.limit_bytes = limit_bytes
        self.reserve_bytes = reserve_bytes
        self.resume_bytes = resume_bytes
        self.policy = policy
        self._count = count
        # The last measure. A store without a disk (the memory store) is never full.
        self.active = False
        self.held_bytes = 0
        self.free_bytes = -1
        self.preallocated_bytes = 0
        self.room_bytes = 0
        self.no_space = False
        self._accepted_since = 0
        # Which bound the room came from, for the log and the ERROR: (setting, value).
        self._bound = (limit_name, limit_bytes)
        self.full = False
        self.episodes = 0
        self._episode_started = 0.0
        self._paused = 0
        self._refused = 0

    # -- measures and estimates -------------------------------------------------------------------

    def measure(self, stats: StoreStats, now: float) -> bool:
        """Take the store's numbers. Returns True when this ends an episode (resume producers)."""
        self._accepted_since = 0
        self.active = stats.disk_free_bytes >= 0
        if not self.active:
            return self._end(now) if self.full else False
        self.held_bytes = stats.data_bytes
        self.free_bytes = stats.disk_free_bytes
        self.preallocated_bytes = stats.preallocated_bytes
        self.no_space = stats.no_space
        room = stats.disk_free_bytes + stats.preallocated_bytes - self.reserve_bytes
        self._bound = ("store.reserve_bytes", self.reserve_bytes)
        if self.limit_bytes and self.limit_bytes - stats.data_bytes < room:
            room = self.limit_bytes - stats.data_bytes
            self._bound = (self.limit_name, self.limit_bytes)
        self.room_bytes = room
        if self.full:
            if room >= self.resume_bytes and not stats.no_space:
                return self._end(now)
        elif room <= 0 or stats.no_space:
            self._start(now)
        return False

    def note_accepted(self, nbytes: int) -> None:
        """Bytes accepted for the store since the last measure."""
        self._accepted_since += nbytes

    def estimate_ran_out(self) -> bool:
        """Whether what was accepted since the last measure used up the room it found. The
        caller measures again before it calls the store full: the last measure may be from
        before space came back."""
        return not self.full and self.active and self.room_bytes - self._accepted_since <= 0

    def is_full(self, now: float) -> bool:
        """Whether the store is full now (an episode starts when the estimate runs out)."""
        if self.full:
            return True
        if self.estimate_ran_out():
            self._start(now)
            return True
        return False

    def out_of_space(self, now: float) -> None:
        """The store refused writes for lack of space: full until a measure finds room."""
        self.no_space = True
        if not self.full:
            self._bound = ("store.reserve_bytes", self.reserve_bytes)
            self._start(now)

    # -- producers ------------------------------------------------------------------------------

    def paused_producer(self) -> None:
        """A producer was paused in this episode."""
        self._paused += 1
        self._count("flow_paused_disk", 1)

    def refusal(self) -> StoreFullError:
        """The ERROR for a send refused in this episode (counted), naming the limit."""
        self._refused += 1
        self._count(f"sends_refused_{self.counter}_full", 1)
        name, value = self._bound
        if name == "store.reserve_bytes":
            detail = f"{self.what} is full: its disk has {_mib(max(self.free_bytes, 0))} free"
        else:
            detail = f"{self.what} is full: it holds {_mib(self.held_bytes)}"
        return StoreFullError(name, value, detail)

    # -- episodes -------------------------------------------------------------------------------

    def _reason(self) -> str:
        name, value = self._bound
        if self.no_space and self.room_bytes > 0:
            return "no space left on its disk for the next data file"
        if name == "store.reserve_bytes":
            return (
                f"what is left of its disk is down to {name}={_mib(value)} "
                f"({_mib(max(self.free_bytes, 0))} free and {_mib(self.preallocated_bytes)} "
                "preallocated at the last measure)"
            )
        return f"{name}={_mib(value)} reached (it held {_mib(self.held_bytes)} at the last measure)"

    def _start(self, now: float) -> None:
        self.full = True
        self.episodes += 1
        self._episode_started = now
        self._paused = self._refused = 0
        self._count(f"{self.counter}_full_episodes", 1)
        action = "paused" if self.policy is StoreFullPolicy.BLOCK else "refused with an ERROR"
        log.warning(
            "%s is full: %s; %s are %s until there is room",
            self.what,
            self._reason(),
            self.producers,
            action,
        )

    def _end(self, now: float) -> bool:
        self.full = False
        self.no_space = False
        log.info(
            "%s has room again (%s) after %.1f s full: %d producers were paused, %d sends refused",
            self.what,
            _mib(max(self.room_bytes, 0)),
            now - self._episode_started,
            self._paused,
            self._refused,
        )
        return True
