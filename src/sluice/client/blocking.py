"""A blocking client: the asyncio `Client` run on a private event loop thread.

Every method hands a coroutine to that loop and waits for its result, so `BlockingClient` can be
used from plain threads (scripts, Spark tasks). Callbacks given to `subscribe` run on the loop
thread: they must not block for long, and must not call the blocking client (that would wait for
the very thread they run on; use `BlockingClient.aio` and await it there instead). Calling a
blocking method from the loop thread raises `ClientError`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable, Coroutine, Iterator, Mapping, Sequence
from concurrent.futures import Future
from types import TracebackType
from typing import Any, TypeVar, Unpack

from sluice.client.aio import Client
from sluice.client.message import AckMode, Message
from sluice.client.options import DEFAULT_BROKERS, DEFAULT_MAX_QUEUED, DEFAULT_MAX_QUEUED_BYTES
from sluice.client.streams.blocking import BlockingStreamReader
from sluice.client.streams.chunker import StreamSource
from sluice.client.streams.options import StreamOptionFields, StreamOptions
from sluice.client.streams.reader import DEFAULT_STREAM_PREFETCH_BYTES, GapPolicy
from sluice.client.streams.send import SentStream
from sluice.client.subscription import ClientSubscription, MessageCallback
from sluice.errors import ClientError

__all__ = ["BlockingClient", "BlockingSubscription"]

logger = logging.getLogger(__name__)

_T = TypeVar("_T")


class _LoopThread:
    """An event loop running forever on a daemon thread of its own."""

    def __init__(self, loop_factory: Callable[[], asyncio.AbstractEventLoop]) -> None:
        self.loop = loop_factory()
        self._thread = threading.Thread(target=self._main, name="sluice-client-loop", daemon=True)
        self._started = threading.Event()

    def start(self) -> None:
        self._thread.start()
        self._started.wait()

    def _main(self) -> None:
        loop = self.loop
        asyncio.set_event_loop(loop)
        loop.call_soon(self._started.set)
        try:
            loop.run_forever()
        finally:
            tasks = asyncio.all_tasks(loop)
            for task in tasks:
                task.cancel()
            if tasks:
                loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    def run(self, coro: Coroutine[Any, Any, _T]) -> _T:
        if threading.get_ident() == self._thread.ident:
            coro.close()
            raise ClientError("blocking client call from its own loop thread (a callback?)")
        if not self._thread.is_alive():
            coro.close()
            raise ClientError("the client is closed")
        future: Future[_T] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result()
        except BaseException:
            future.cancel()
            raise

    def stop(self) -> None:
        if self._thread.is_alive():
            self.loop.call_soon_threadsafe(self.loop.stop)
            if threading.get_ident() != self._thread.ident:
                self._thread.join()


class BlockingSubscription:
    """A `ClientSubscription` read from a plain thread: `receive(timeout)` or iteration."""

    def __init__(self, subscription: ClientSubscription, runner: _LoopThread) -> None:
        self.aio = subscription
        self._runner = runner

    @property
    def id(self) -> str:
        """The subscription id."""
        return self.aio.id

    @property
    def destination(self) -> str:
        """The subscribed destination."""
        return self.aio.destination

    def receive(self, timeout: float | None = None) -> Message | None:
        """The next message, or None after `timeout` seconds. Raises `ClientError` once closed."""
        return self._runner.run(self.aio.get(timeout))

    def __iter__(self) -> Iterator[Message]:
        """Yield messages until the subscription ends (raises if it failed)."""
        while True:
            try:
                message = self.receive()
            except ClientError:
                if self.aio.error is not None:
                    raise
                return
            if message is not None:
                yield message

    def unsubscribe(self, headers: Mapping[str, str] | None = None) -> None:
        """Send UNSUBSCRIBE and wait for its receipt."""
        self._runner.run(self.aio.unsubscribe(headers))


class BlockingClient:
    """The blocking counterpart of `Client`.

    `BlockingClient(brokers, **options)` takes the arguments of `Client.connect`; `connect()`
    (or entering `with BlockingClient(...) as client:`) starts the loop thread and connects.
    Methods are those of `Client`, synchronous; it may be shared between threads.
    """

    def __init__(
        self,
        brokers: str | Sequence[str] = DEFAULT_BROKERS,
        *,
        loop_factory: Callable[[], asyncio.AbstractEventLoop] = asyncio.new_event_loop,
        **options: Any,
    ) -> None:
        self.brokers = brokers
        self._options = options
        self._loop_factory = loop_factory
        self._runner: _LoopThread | None = None
        self._client: Client | None = None

    def connect(self) -> BlockingClient:
        """Start the loop thread and connect (see `Client.connect`); return self."""
        if self._client is not None:
            return self
        runner = _LoopThread(self._loop_factory)
        runner.start()
        try:
            self._client = runner.run(Client.connect(self.brokers, **self._options))
        except BaseException:
            runner.stop()
            raise
        self._runner = runner
        return self

    def __enter__(self) -> BlockingClient:
        return self.connect()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    @property
    def aio(self) -> Client:
        """The asyncio client underneath, for use on its loop (in callbacks, say)."""
        if self._client is None:
            raise ClientError("the blocking client is not connected")
        return self._client

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop the client runs on (callbacks run there)."""
        return self._require_runner().loop

    def _require_runner(self) -> _LoopThread:
        if self._runner is None:
            raise ClientError("the blocking client is not connected")
        return self._runner

    def _run(self, coro: Coroutine[Any, Any, _T]) -> _T:
        if self._runner is None:
            coro.close()
            raise ClientError("the blocking client is not connected")
        return self._runner.run(coro)

    def send(
        self,
        destination: str,
        body: bytes | str,
        *,
        headers: Mapping[str, str] | None = None,
        persistent: bool = False,
        receipt: bool = True,
        transaction: str | None = None,
        content_type: str | None = None,
    ) -> None:
        """See `Client.send`."""
        self._run(
            self.aio.send(
                destination,
                body,
                headers=headers,
                persistent=persistent,
                receipt=receipt,
                transaction=transaction,
                content_type=content_type,
            )
        )

    def subscribe(
        self,
        destination: str,
        *,
        ack: AckMode | str = AckMode.AUTO,
        headers: Mapping[str, str] | None = None,
        prefetch: int | None = None,
        prefetch_bytes: int | None = None,
        selector: str | None = None,
        callback: MessageCallback | None = None,
        id: str | None = None,
        max_queued: int = DEFAULT_MAX_QUEUED,
        max_queued_bytes: int = DEFAULT_MAX_QUEUED_BYTES,
    ) -> BlockingSubscription:
        """See `Client.subscribe`. A `callback` runs on the client's loop thread."""
        subscription = self._run(
            self.aio.subscribe(
                destination,
                ack=ack,
                headers=headers,
                prefetch=prefetch,
                prefetch_bytes=prefetch_bytes,
                selector=selector,
                callback=callback,
                id=id,
                max_queued=max_queued,
                max_queued_bytes=max_queued_bytes,
            )
        )
        return BlockingSubscription(subscription, self._require_runner())

    def send_stream(
        self,
        destination: str,
        source: StreamSource,
        options: StreamOptions | None = None,
        **changes: Unpack[StreamOptionFields],
    ) -> SentStream:
        """See `Client.send_stream`. The source is read, and `on_progress` called, on the
        client's loop thread."""
        return self._run(self.aio.send_stream(destination, source, options, **changes))

    def stream_reader(
        self,
        destination: str,
        *,
        prefetch_bytes: int = DEFAULT_STREAM_PREFETCH_BYTES,
        on_gap: GapPolicy | str = GapPolicy.RAISE,
        headers: Mapping[str, str] | None = None,
    ) -> BlockingStreamReader:
        """See `Client.stream_reader`: `with client.stream_reader(dest) as reader:`."""
        reader = self.aio.stream_reader(
            destination, prefetch_bytes=prefetch_bytes, on_gap=on_gap, headers=headers
        )
        return BlockingStreamReader(reader, self._require_runner().run)

    def ack(
        self, message: Message, *, transaction: str | None = None, receipt: bool = False
    ) -> None:
        """See `Client.ack`."""
        self._run(self.aio.ack(message, transaction=transaction, receipt=receipt))

    def nack(
        self, message: Message, *, transaction: str | None = None, receipt: bool = False
    ) -> None:
        """See `Client.nack`."""
        self._run(self.aio.nack(message, transaction=transaction, receipt=receipt))

    def begin(self, transaction: str | None = None, *, receipt: bool = True) -> str:
        """See `Client.begin`."""
        return self._run(self.aio.begin(transaction, receipt=receipt))

    def commit(self, transaction: str) -> None:
        """See `Client.commit`."""
        self._run(self.aio.commit(transaction))

    def abort(self, transaction: str) -> None:
        """See `Client.abort`."""
        self._run(self.aio.abort(transaction))

    @contextlib.contextmanager
    def transaction(self) -> Iterator[str]:
        """`with client.transaction() as tx:` commits on success, aborts on an exception."""
        tx = self.begin()
        try:
            yield tx
        except BaseException:
            try:
                self.abort(tx)
            except ClientError as exc:
                logger.debug("abort of %s after an error failed: %s", tx, exc)
            raise
        self.commit(tx)

    def close(self) -> None:
        """Close the client, then stop and join the loop thread. Safe to call twice."""
        runner = self._runner
        if runner is None:
            return
        try:
            with contextlib.suppress(ClientError):
                runner.run(self.aio.close())
        finally:
            runner.stop()
