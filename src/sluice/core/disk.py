"""Disk as a bounded resource: one store's room, measured against its limit and the free disk
(`DiskBudget`), and the broker's watch over both of its stores (`DiskWatch`).

`DiskWatch` measures each store every `DISK_CHECK_INTERVAL_S` and hands the numbers to its
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
import time
from collections.abc import Callable, Hashable

from sluice.config import Config, MiB, StoreFullPolicy
from sluice.core.services import Cancellable, FlowReason, Loop, Producer
from sluice.errors import StoreFullError
from sluice.store.api import MessageStore, StoreStats

log = logging.getLogger(__name__)

# Disk use is measured this often (a statvfs and the store's counters), and estimated between.
DISK_CHECK_INTERVAL_S = 0.25


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


class DiskWatch:
    """The disks of the store and of the temp store: measured every `DISK_CHECK_INTERVAL_S`,
    estimated in between, and measured again before an estimate calls one full. Producers
    paused for room are resumed once both have room again."""

    def __init__(
        self,
        config: Config,
        store: MessageStore,
        temp_store: MessageStore | None,
        loop: Loop,
        *,
        count: Callable[[str, int], None],
        on_write_errors: Callable[[], None],
    ) -> None:
        self._store = store
        self._temp_store = temp_store
        self._loop = loop
        self._on_write_errors = on_write_errors
        self.store, self.temp = _disk_budgets(config, count)
        self.store_disk_bytes = 0
        self.temp_disk_bytes = 0
        self._waiters: dict[Hashable, Producer] = {}
        self._timer: Cancellable | None = None

    def start(self) -> None:
        """Measure now, then on the timer."""
        self._tick()

    def stop(self) -> None:
        """No more measures."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _tick(self) -> None:
        self.measure()
        self._timer = self._loop.call_later(DISK_CHECK_INTERVAL_S, self._tick)

    def measure(self) -> None:
        """Measure the stores' disks; resume producers once every store has room again."""
        now = time.monotonic()
        stats = self._store.stats()
        self.store_disk_bytes = stats.disk_bytes
        if stats.write_errors:
            self._on_write_errors()
        resumed = self.store.measure(stats, now)
        if self._temp_store is not None:
            temp_stats = self._temp_store.stats()
            self.temp_disk_bytes = temp_stats.disk_bytes
            resumed = self.temp.measure(temp_stats, now) or resumed
        if (resumed or self._waiters) and not (self.store.full or self.temp.full):
            waiters, self._waiters = self._waiters, {}
            if waiters:
                log.info("disk has room again: resuming %d producers", len(waiters))
            for producer in waiters.values():
                producer.resume_producer(FlowReason.DISK)

    def budget(self, *, persistent: bool) -> DiskBudget:
        """The disk of the store (`persistent`) or of the temp store."""
        return self.store if persistent else self.temp

    def full(self, *, persistent: bool) -> bool:
        """Is the store (`persistent`) or the temp store full?"""
        if not persistent and self._temp_store is None:
            return False
        budget = self.budget(persistent=persistent)
        if budget.estimate_ran_out():
            # The estimate is the last measure less what was accepted since; space may have
            # come back in between. Only a fresh measure starts an episode.
            self.measure()
        return budget.is_full(time.monotonic())

    def wait(self, key: Hashable, producer: Producer, *, persistent: bool) -> None:
        """Pause a producer until the store (or temp store) has room again."""
        self.budget(persistent=persistent).paused_producer()
        self._waiters[key] = producer
        producer.pause_producer(FlowReason.DISK)

    def forget(self, key: Hashable) -> None:
        """A connection closed: it waits for room no more."""
        self._waiters.pop(key, None)


def _disk_budgets(
    config: Config, count: Callable[[str, int], None]
) -> tuple[DiskBudget, DiskBudget]:
    """The disk budgets of the store (persistent messages) and of the temp store."""
    store_cfg = config.store
    temp_limit = config.limits.temp_limit_bytes
    store_disk = DiskBudget(
        "the store",
        "persistent producers",
        counter="store",
        limit_name="store.max_bytes",
        limit_bytes=store_cfg.max_bytes,
        reserve_bytes=store_cfg.disk_reserve_bytes,
        resume_bytes=_resume_bytes(store_cfg.journal_file_bytes, store_cfg.max_bytes),
        policy=store_cfg.store_full,
        count=count,
    )
    temp_disk = DiskBudget(
        "the temp store",
        "non-persistent producers",
        counter="temp",
        limit_name="limits.temp_limit_bytes",
        limit_bytes=temp_limit,
        reserve_bytes=store_cfg.disk_reserve_bytes,
        resume_bytes=_resume_bytes(store_cfg.journal_file_bytes, temp_limit),
        policy=store_cfg.store_full,
        count=count,
    )
    return store_disk, temp_disk


def _resume_bytes(file_bytes: int, limit_bytes: int) -> int:
    """Room a full store needs back before producers resume: one journal file (collection
    frees whole files), or a quarter of a smaller limit."""
    return min(file_bytes, limit_bytes // 4) if limit_bytes else file_bytes
