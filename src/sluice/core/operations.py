"""An operator's operations on the messages of a queue: delete, move, copy, and retry (dead
letters sent back to the destination each came from), on the messages a `MessageFilter`
matches; and counting them first (a dry run).

An operation goes a step at a time (`MessageOperation.step`): a step reads a window of the queue
(`picking.QueuePicking.window`, at most `STEP_MESSAGES` messages), takes the waiting messages
that match out of the queue (consumers no longer see them), and opens one transaction in which
it sends each copy to its target and removes each original from the source; one COMMIT writes
both. So a message moved is in its target or in its source, never in neither and never in both,
whatever happens: if the COMMIT is not written (the store fails, the broker dies before it), the
store forgets the copies and keeps the originals, and the originals taken are given back to the
queue at their place. A copy keeps what the message was: its id, headers, body, priority, expiry
and persistence (a persistent message stays persistent). Messages in flight stay with their
consumers and are counted as skipped; so are those in a passing state (being written,
acknowledged inside an open transaction).

Steps are bounded (messages and bytes, below the transaction limits) so that one step never
holds the loop long nor memory much; between steps the caller lets the loop run. Each step is
all or nothing; a whole operation over a large queue is not (a failed step leaves the steps
before it done, and says how many).
"""

from __future__ import annotations

import collections
import enum
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

from sluice.core.broker import DLQ_REASON, ORIGINAL_DESTINATION, Broker
from sluice.core.destination import Destination
from sluice.core.message import DEDUP_ID, DestinationNameError, Message, parse_destination
from sluice.core.picking import Found, Place, QueuePicking
from sluice.core.selector import Selector
from sluice.core.subscription import message_lookup
from sluice.core.transaction import STUB_OVERHEAD_BYTES, Transaction
from sluice.errors import LimitExceeded, StoreUnavailableError
from sluice.store.api import WriteHandle

__all__ = [
    "STEP_BYTES",
    "STEP_MESSAGES",
    "Action",
    "MessageFilter",
    "MessageOperation",
    "Skip",
    "StepResult",
    "retry_target",
    "send_message",
]

# A step looks at this many messages, and moves at most this many bytes (and never more than
# half the transaction limits allow).
STEP_MESSAGES = 1000
STEP_BYTES = 16 << 20

_operation_ids = itertools.count(1)


class Action(enum.Enum):
    """What an operation does with each message it matches."""

    DELETE = "delete"
    MOVE = "move"
    COPY = "copy"
    RETRY = "retry"  # a move to the destination named in `x-original-destination`

    @property
    def takes(self) -> bool:
        """Does it take the message out of its queue (all but a copy)?"""
        return self is not Action.COPY

    @property
    def sends(self) -> bool:
        """Does it send a copy somewhere (all but a delete)?"""
        return self is not Action.DELETE


@dataclass(frozen=True, slots=True)
class MessageFilter:
    """Which messages an operation concerns: those whose id is one of `ids` (when given), whose
    headers have each of `headers`' values, and that `selector` accepts (when given); with
    nothing given, every message."""

    ids: frozenset[str] = frozenset()
    headers: tuple[tuple[str, str], ...] = ()
    selector: Selector | None = None

    def matches(self, message: Message) -> bool:
        """Does the message pass every test?"""
        if self.ids and message.message_id not in self.ids:
            return False
        headers = message.headers
        for name, value in self.headers:
            if headers.get(name) != value:
                return False
        return self.selector is None or self.selector.matches(message_lookup(message))


@dataclass(frozen=True, slots=True)
class Skip:
    """A message an operation leaves where it is, and why."""

    reason: str


# The target of a message (a destination's full name), or why it has none.
TargetOf = Callable[[Message], "str | Skip"]

IN_FLIGHT = "in flight: a consumer holds it"
BUSY = "being written or acknowledged"
NO_ORIGIN = f"no {ORIGINAL_DESTINATION} header"


@dataclass
class StepResult:
    """What a step found and did: messages after the window's start that `matched`, how many
    of them it acted on (or would, in a dry run), those it `skipped` by reason, and where the
    next step starts (None: the operation is done)."""

    next_after: int | None
    matched: int = 0
    acted: int = 0
    skipped: collections.Counter[str] = field(default_factory=collections.Counter)
    # Acted on, by target (moves, copies, retries).
    targets: collections.Counter[str] = field(default_factory=collections.Counter)


def retry_target(message: Message) -> str | Skip:
    """Where a dead letter came from: its `x-original-destination`."""
    origin = message.headers.get(ORIGINAL_DESTINATION)
    return Skip(NO_ORIGIN) if origin is None else origin


def send_message(
    broker: Broker, message: Message, on_stored: Callable[[WriteHandle | None], None]
) -> bool:
    """Send a message an operator wrote, as a producer's SEND is taken: refused while the store
    has failed (persistent ones) or is full (`StoreUnavailableError`, `StoreFullError`), dropped
    as a duplicate of an `x-dedup-id` within its destination's window (False, and `on_stored`
    is not called). `on_stored` runs once it is safe (written, for a persistent one). An
    operator's one message is never held back by flow control; the destination is created if
    need be (`DestinationNameError`, `LimitExceeded`)."""
    persistent = message.persistent
    if persistent and broker.store_failed:
        broker.count("sends_refused_store_failed")
        cause = f" ({broker.store_failure})" if broker.store_failure else ""
        raise StoreUnavailableError(f"persistent messages are refused: the store failed{cause}")
    if persistent and broker.disk_full(persistent=True):
        raise broker.disk_budget(persistent=True).refusal()
    name = message.destination
    destination = broker.find(name)
    if destination is None:
        broker.create_destination(name)
        destination = broker.destinations[name]
    dedup_id = message.headers.get(DEDUP_ID)
    if dedup_id is not None:
        if dedup_id in destination.dedup:
            broker.count("duplicates_dropped")
            return False
        destination.dedup.add(dedup_id)
    broker.accept(destination, message, on_stored)
    return True


class MessageOperation:
    """One operator's operation on one queue: `step` until its `next_after` is None."""

    def __init__(
        self,
        broker: Broker,
        queue: QueuePicking,
        action: Action,
        message_filter: MessageFilter,
        target_of: TargetOf | None = None,
    ) -> None:
        if action.sends and target_of is None:
            raise ValueError(f"a {action.value} needs a target")
        self.broker = broker
        self.queue = queue
        self.action = action
        self.filter = message_filter
        self.target_of = target_of
        # Messages that come in after the operation started are not its business (a retry to
        # the queue itself would otherwise never end).
        self.upto_seq = queue.last_seq
        limits = broker.limits
        self.step_messages = max(1, min(STEP_MESSAGES, limits.max_transaction_messages // 2))
        self.step_bytes = max(1, min(STEP_BYTES, limits.max_transaction_held_bytes // 2))

    def step(
        self,
        after_seq: int,
        on_written: Callable[[bool], None],
        *,
        dry_run: bool = False,
    ) -> StepResult:
        """Act on the matching messages of the next window after `after_seq`; `on_written`
        runs with True once what the step did is written (at once when there was nothing to
        write), with False if the store failed to write it (nothing of the step then shows).
        A dry run changes nothing (it creates no target either) and counts what a step would
        do. Raises `LimitExceeded` (nothing of the step done) if a transaction limit is too
        small for one message."""
        window = self.queue.window(after_seq, self.step_messages)
        result = StepResult(window.next_after)
        tx: Transaction | None = None
        held = 0
        last_seq = after_seq
        try:
            for found in window.found:
                message = found.message
                if message.seq > self.upto_seq:
                    result.next_after = None
                    break
                if not self.filter.matches(message):
                    last_seq = message.seq
                    continue
                cost = message.nbytes + STUB_OVERHEAD_BYTES
                if held and held + cost > self.step_bytes:
                    result.next_after = last_seq  # the next step starts with this message
                    break
                last_seq = message.seq
                result.matched += 1
                target = self._target(found, result, create=not dry_run)
                if target is None:
                    continue
                if dry_run:
                    self._acted(result, target)
                    continue
                if tx is None:
                    tx = self._begin()
                if self._act(tx, found, target, result):
                    held += cost
        except LimitExceeded:
            if tx is not None:
                tx.rollback()
            raise
        if tx is None:
            on_written(True)
        else:
            tx.commit(lambda: on_written(True), lambda: on_written(False))
        return result

    def _target(
        self, found: Found, result: StepResult, *, create: bool
    ) -> Destination | str | None:
        """Where a matching message goes: its target (a destination, or with `create` off the
        name of one to be created), the source for a delete; None when it is skipped
        (counted in `result`)."""
        place = found.place
        if place is Place.BUSY or (self.action.takes and place is Place.IN_FLIGHT):
            result.skipped[IN_FLIGHT if place is Place.IN_FLIGHT else BUSY] += 1
            return None
        if self.target_of is None:
            return self.queue
        name = self.target_of(found.message)
        if isinstance(name, Skip):
            result.skipped[name.reason] += 1
            return None
        if name == self.queue.name:
            result.skipped["its target is the queue it is in"] += 1
            return None
        try:
            existing = self.broker.find(name)
            if existing is not None:
                return existing
            if not create:
                parse_destination(name)
                return name
            self.broker.create_destination(name)
            return self.broker.destinations[name]
        except (DestinationNameError, LimitExceeded) as exc:
            result.skipped[f"no target {name[:200]}: {exc}"] += 1
            return None

    def _begin(self) -> Transaction:
        number = next(_operation_ids)
        tx = Transaction(self.broker, f"operator-{number}", f"operator:{number}", check_dedup=False)
        self.broker.store.begin(tx.store_id)
        return tx

    def _acted(self, result: StepResult, target: Destination | str) -> None:
        result.acted += 1
        if self.action.sends:
            result.targets[target if isinstance(target, str) else target.name] += 1

    def _act(
        self, tx: Transaction, found: Found, target: Destination | str, result: StepResult
    ) -> bool:
        """Take the message (unless copying) and send its copy, in `tx`."""
        message = found.message
        if self.action.takes:
            taken = self.queue.take(found)
            if taken is None:
                result.skipped[BUSY] += 1
                return False
            tx.take(taken)
        if self.action.sends:
            assert isinstance(target, Destination)
            tx.add(target, self._copy(message, target.name))
        self._acted(result, target)
        return True

    def _copy(self, message: Message, target: str) -> Message:
        headers = dict(message.headers)
        if self.action is Action.RETRY:
            # Sent as its producer sent it: the dead-letter marks go.
            headers.pop(ORIGINAL_DESTINATION, None)
            headers.pop(DLQ_REASON, None)
        return Message(
            target,
            0,
            message.message_id,
            message.timestamp_ms,
            headers,
            message.body,
            expires_ms=message.expires_ms,
            priority=message.priority,
            persistent=message.persistent,
        )
