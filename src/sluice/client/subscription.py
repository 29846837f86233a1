"""A subscription's bounded buffer of messages, read by iteration, `get`, or a callback task.

The buffer holds at most `max_queued` messages and `max_queued_bytes` of bodies (one message is
always let in, however large). When it reaches either bound it tells the client, which stops
handing over frames and pauses reading the socket until the application has taken half of it back:
TCP then pushes back on the broker. With `client` and `client-individual` acks the broker's
prefetch credit usually keeps the buffer below the bound anyway.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from types import MappingProxyType
from typing import Protocol

from sluice.client.errors import ConnectionLost
from sluice.client.message import AckMode, Message
from sluice.errors import ClientError

__all__ = ["ClientSubscription", "MessageCallback", "SubscriptionOwner"]

logger = logging.getLogger(__name__)

MessageCallback = Callable[[Message], Awaitable[None] | None]


class SubscriptionOwner(Protocol):
    """The client side of a subscription."""

    def subscription_full(self, subscription: ClientSubscription) -> None:
        """The buffer reached a bound: stop handing over frames."""

    def subscription_drained(self, subscription: ClientSubscription) -> None:
        """The buffer is back below its low mark."""

    async def unsubscribe(
        self, subscription: ClientSubscription, headers: Mapping[str, str]
    ) -> None:
        """Send UNSUBSCRIBE and forget the subscription."""


class ClientSubscription:
    """A subscription to one destination, made by `Client.subscribe`.

    Without a callback, read it with `async for message in subscription` (which ends after
    `unsubscribe` or `Client.close` once the buffer is empty, and raises if the subscription
    failed) or with `await subscription.get(timeout)`. With a callback, a task of its own calls
    the callback for each message in order, awaiting it when it returns an awaitable.
    """

    def __init__(
        self,
        owner: SubscriptionOwner,
        *,
        id: str,
        destination: str,
        ack: AckMode,
        headers: Mapping[str, str],
        callback: MessageCallback | None,
        max_queued: int,
        max_queued_bytes: int,
    ) -> None:
        if max_queued < 1:
            raise ClientError(f"max_queued must be at least 1 (got {max_queued})")
        if max_queued_bytes < 1:
            raise ClientError(f"max_queued_bytes must be at least 1 (got {max_queued_bytes})")
        self._owner = owner
        self.id = id
        self.destination = destination
        self.ack = ack
        self.headers: Mapping[str, str] = MappingProxyType(dict(headers))
        self.callback = callback
        self.max_queued = max_queued
        self.max_queued_bytes = max_queued_bytes
        self._low_count = max_queued // 2
        self._low_bytes = max_queued_bytes // 2
        self._buffer: deque[Message] = deque()
        self._buffer_bytes = 0
        self._full = False
        self._readable = asyncio.Event()
        self._closed = False
        self._error: ClientError | None = None
        self._task: asyncio.Task[None] | None = None

    def __repr__(self) -> str:
        return f"<ClientSubscription {self.id} {self.destination} ack={self.ack.value}>"

    @property
    def queued(self) -> int:
        """Messages in the buffer."""
        return len(self._buffer)

    @property
    def queued_bytes(self) -> int:
        """Body bytes in the buffer."""
        return self._buffer_bytes

    @property
    def full(self) -> bool:
        """Whether the buffer has reached a bound (and deliveries are held back)."""
        return self._full

    @property
    def closed(self) -> bool:
        """Whether the subscription has ended; buffered messages can still be read."""
        return self._closed

    @property
    def error(self) -> ClientError | None:
        """Why the subscription failed, if it did."""
        return self._error

    # Reading.

    async def get(self, timeout: float | None = None) -> Message | None:
        """Return the next message, or None if none came within `timeout` seconds.

        Raises `ClientError` once the subscription is closed and its buffer empty (the failure
        itself if it failed), and when the subscription has a callback.
        """
        if self.callback is not None:
            raise ClientError(f"subscription {self.id} delivers to its callback")
        return await self._next(timeout)

    def __aiter__(self) -> ClientSubscription:
        if self.callback is not None:
            raise ClientError(f"subscription {self.id} delivers to its callback")
        return self

    async def __anext__(self) -> Message:
        try:
            message = await self._next(None)
        except ClientError:
            if self._error is None:
                raise StopAsyncIteration from None
            raise
        assert message is not None
        return message

    async def _next(self, timeout: float | None) -> Message | None:
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while not self._buffer:
            if self._closed:
                if self._error is not None:
                    raise self._error
                raise ClientError(f"subscription {self.id} is closed")
            if deadline is None:
                await self._readable.wait()
                continue
            remaining = deadline - loop.time()
            if remaining <= 0:
                return None
            try:
                await asyncio.wait_for(self._readable.wait(), remaining)
            except TimeoutError:
                return None
        return self._take()

    def _take(self) -> Message:
        message = self._buffer.popleft()
        self._buffer_bytes -= len(message.body)
        if not self._buffer and not self._closed:
            self._readable.clear()
        self._check_drained()
        return message

    def _check_drained(self) -> None:
        if (
            self._full
            and len(self._buffer) <= self._low_count
            and self._buffer_bytes <= self._low_bytes
        ):
            self._full = False
            self._owner.subscription_drained(self)

    async def unsubscribe(self, headers: Mapping[str, str] | None = None) -> None:
        """Send UNSUBSCRIBE (with `headers`, such as `activemq.subscriptionName` to end a durable
        subscription) and wait for its receipt. Buffered messages can still be read afterwards.
        """
        await self._owner.unsubscribe(self, headers or {})

    # Called by the client.

    def deliver(self, message: Message) -> bool:
        """Append a message; False (and the message dropped) if the buffer is full or closed.

        The client does not hand over frames while a buffer is full, so a refusal only happens
        while the client closes.
        """
        if self._closed or self._full:
            return False
        self._buffer.append(message)
        self._buffer_bytes += len(message.body)
        self._readable.set()
        if len(self._buffer) >= self.max_queued or self._buffer_bytes >= self.max_queued_bytes:
            self._full = True
            self._owner.subscription_full(self)
        return True

    def discard_epoch(self, epoch: int) -> int:
        """Drop the buffered messages a lost connection delivered, which the broker redelivers.

        Only for `client`/`client-individual` acks: their acknowledgement died with the
        connection. Returns how many were dropped.
        """
        if self.ack is AckMode.AUTO or not self._buffer:
            return 0
        kept = deque(m for m in self._buffer if m.connection_epoch != epoch)
        dropped = len(self._buffer) - len(kept)
        if dropped:
            self._buffer = kept
            self._buffer_bytes = sum(len(m.body) for m in kept)
            if not kept and not self._closed:
                self._readable.clear()
            self._check_drained()
        return dropped

    def close(self, error: ClientError | None = None) -> None:
        """End the subscription: no more deliveries; readers finish the buffer, then stop."""
        if self._closed:
            return
        self._closed = True
        self._error = error
        self._readable.set()
        if self._full:
            self._full = False
            self._owner.subscription_drained(self)

    def start_dispatch(self) -> None:
        """Start the task that feeds the callback, if there is one."""
        if self.callback is not None and self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._dispatch(self.callback), name=f"sluice-subscription-{self.id}"
            )

    async def stop_dispatch(self, *, cancel: bool) -> None:
        """Wait for the callback task to finish the buffer (or cancel it first)."""
        task = self._task
        if task is None or task is asyncio.current_task():
            return
        if cancel:
            task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            if not task.cancelled():
                raise

    async def _dispatch(self, callback: MessageCallback) -> None:
        while True:
            try:
                message = await self._next(None)
            except ClientError:
                return
            assert message is not None
            try:
                result = callback(message)
                if inspect.isawaitable(result):
                    await result
            except ConnectionLost as exc:
                logger.info("callback of subscription %s: %s", self.id, exc)
            except Exception:
                # The callback's task boundary: one failed message must not end the subscription.
                logger.exception("callback of subscription %s failed", self.id)
