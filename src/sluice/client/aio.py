"""The asyncio STOMP client: send, subscribe, acknowledge, transactions.

`Client` sends frames on the link its `Connector` keeps (failover and reconnection live there).
When the connection drops and `reconnect` is on, the connector dials again and the client re-sends
every SUBSCRIBE with the same id and headers. What cannot be carried over fails loudly instead of
being lost or repeated in silence:

- a frame written but not yet receipted raises `ConnectionLost` (a `ClientError`): the broker may
  or may not have it, so the caller decides whether to retry (use `x-dedup-id` to make that safe),
  unless the client was made with `resend=True`: then a SEND outside a transaction carries an
  `x-dedup-id` and goes out again on the next connection (`sluice.client.resend`);
  a frame not yet written waits for the new connection and goes out there;
- transactions open at the drop were aborted by the broker; using them raises `ClientError`;
- messages of `client`/`client-individual` subscriptions delivered on the old connection are
  redelivered by the broker, so those still buffered are dropped, and acknowledging one already
  taken raises `ConnectionLost`.

Operations that need a connection wait for one at most `receipt_timeout_s`, and then as long again
for their receipt.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import secrets
import ssl
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType

from sluice.client.address import BrokerAddress, parse_brokers
from sluice.client.connector import Connector
from sluice.client.errors import ConnectionLost
from sluice.client.link import ClientLink
from sluice.client.message import AckMode, Message
from sluice.client.options import (
    DEFAULT_BROKERS,
    DEFAULT_MAX_PENDING_RECEIPTS,
    DEFAULT_MAX_QUEUED,
    DEFAULT_MAX_QUEUED_BYTES,
    ClientOptions,
)
from sluice.client.pipeline import PipelinedReceipt
from sluice.client.resend import DEFAULT_MAX_RESENDS, Resender
from sluice.client.routing import SubscriptionRegistry
from sluice.client.slots import Slots
from sluice.client.state import ClientState
from sluice.client.streams.methods import StreamMethods
from sluice.client.subscription import ClientSubscription, MessageCallback
from sluice.client.tls import client_context
from sluice.errors import ClientError
from sluice.stomp.codec import StompLimits
from sluice.stomp.frames import Command, Frame, Version

__all__ = ["Client"]

logger = logging.getLogger(__name__)


class Client(StreamMethods):
    """An asyncio STOMP client. Make one with `await Client.connect(...)`.

    Use it as `async with await Client.connect(...) as client:` so that it is closed on the way
    out. Not thread-safe: call it from its event loop (see `sluice.client.blocking` otherwise).
    Streams: `send_stream` and `stream_reader` (see `StreamMethods`).
    """

    def __init__(self, brokers: Sequence[BrokerAddress], options: ClientOptions) -> None:
        self.options = options
        self._connector = Connector(self, brokers, options)
        self._registry = SubscriptionRegistry()
        self._transactions: dict[str, int] = {}
        self._ids = itertools.count(1)
        self._token = secrets.token_hex(4)
        self._receipt_slots = Slots(options.max_pending_receipts)
        self._resender = Resender(options.max_resends)

    @classmethod
    async def connect(
        cls,
        brokers: str | Sequence[str] = DEFAULT_BROKERS,
        *,
        login: str | None = None,
        passcode: str | None = None,
        client_id: str | None = None,
        heartbeat_ms: tuple[int, int] = (10_000, 10_000),
        version: str = "1.2",
        connect_timeout_s: float = 10.0,
        reconnect: bool = True,
        initial_reconnect_delay_s: float = 0.1,
        max_reconnect_delay_s: float = 30.0,
        receipt_timeout_s: float = 30.0,
        heartbeat_grace_factor: float = 2.0,
        max_pending_receipts: int = DEFAULT_MAX_PENDING_RECEIPTS,
        limits: StompLimits | None = None,
        connect_headers: Mapping[str, str] | None = None,
        ssl_context: ssl.SSLContext | None = None,
        tls: bool = False,
        ca: str | Path | None = None,
        cert: str | Path | None = None,
        key: str | Path | None = None,
        key_password: str | None = None,
        server_hostname: str | None = None,
        resend: bool = False,
        max_resends: int = DEFAULT_MAX_RESENDS,
    ) -> Client:
        """Connect to the first broker of `brokers` that answers and return the client.

        `brokers` is `"host:port"`, a comma-separated list, or a list; they are tried in order,
        once. `heartbeat_ms` is (how often we send, how often we want to hear from the broker).
        `version` is the highest STOMP version offered (older ones are offered too). See
        `ClientOptions` for the rest.

        TLS: give an `ssl_context`, or `tls=True` with, as needed, `ca` (the CA file that signed
        the broker's certificate; the system's CAs otherwise), `cert` and `key` (a client
        certificate, and `key_password` if its key is encrypted); `ca`, `cert` or `key` alone
        imply `tls=True`. The broker's certificate must name `server_hostname`, or else the host
        dialled.

        Failover: with several brokers and `reconnect`, a lost connection is dialled again over
        the list with backoff, and subscriptions are restored. `resend=True` also sends again,
        on the next connection, every `send` (outside a transaction, with a receipt) whose
        RECEIPT the lost one did not bring, at most `max_resends` times, with an `x-dedup-id`
        so that the broker stores it once (see `sluice.client.resend`).

        Raises `BrokerErrorFrame` if a broker refuses the CONNECT, `ClientError` if none answers
        (or a TLS file cannot be used).
        """
        if ssl_context is None and (tls or ca is not None or cert is not None or key is not None):
            ssl_context = client_context(ca=ca, cert=cert, key=key, key_password=key_password)
        options = ClientOptions(
            login=login,
            passcode=passcode,
            client_id=client_id,
            heartbeat_ms=heartbeat_ms,
            version=version,
            connect_timeout_s=connect_timeout_s,
            reconnect=reconnect,
            initial_reconnect_delay_s=initial_reconnect_delay_s,
            max_reconnect_delay_s=max_reconnect_delay_s,
            receipt_timeout_s=receipt_timeout_s,
            heartbeat_grace_factor=heartbeat_grace_factor,
            max_pending_receipts=max_pending_receipts,
            limits=limits or StompLimits(),
            connect_headers=tuple((connect_headers or {}).items()),
            ssl_context=ssl_context,
            server_hostname=server_hostname,
            resend=resend,
            max_resends=max_resends,
        )
        client = cls(parse_brokers(brokers), options)
        await client._connector.connect()
        return client

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # State.

    @property
    def state(self) -> ClientState:
        """Where the client stands."""
        return self._connector.state

    @property
    def connected(self) -> bool:
        """Whether a connection is up and usable now."""
        link = self._connector.current_link()
        return link is not None and link.usable

    @property
    def version(self) -> Version | None:
        """The STOMP version of the current connection."""
        link = self._connector.link
        return link.version if link is not None and link.negotiated is not None else None

    @property
    def broker(self) -> str | None:
        """`host:port` of the broker currently connected to."""
        link = self._connector.link
        return link.label.rpartition("#")[0] if link is not None else None

    @property
    def epoch(self) -> int:
        """Number of the newest connection; it grows by one at each (re)connection."""
        return self._connector.epoch

    @property
    def resent(self) -> int:
        """Sends written again after a lost connection (with `resend`), over the client's life."""
        return self._resender.resent

    @property
    def subscriptions(self) -> Mapping[str, ClientSubscription]:
        """Active subscriptions by id."""
        return self._registry.snapshot()

    # ConnectorOwner.

    def route_message(self, link: ClientLink, frame: Frame) -> None:
        """Put a MESSAGE in its subscription's buffer."""
        self._registry.route(link, frame)

    def restore(self, link: ClientLink) -> None:
        """Re-send every SUBSCRIBE on a new link (see `SubscriptionRegistry.restore`)."""
        self._registry.restore(link)

    def connection_ended(self, link: ClientLink) -> None:
        """Forget the lost connection's transactions and unacknowledged messages."""
        self._transactions.clear()
        self._registry.discard_epoch(link.epoch)

    def failed(self, error: ClientError) -> None:
        """The client will not reconnect: subscriptions end with `error`."""
        self._registry.close_all(error)

    def deliveries_blocked(self) -> bool:
        """Whether a subscription buffer is full (the link then pauses reading)."""
        return self._registry.blocked

    # SubscriptionOwner.

    def subscription_full(self, subscription: ClientSubscription) -> None:
        """A subscription buffer reached its bound."""
        self._registry.mark_full(subscription)

    def subscription_drained(self, subscription: ClientSubscription) -> None:
        """A subscription buffer went below its low mark."""
        link = self._connector.link
        if self._registry.mark_drained(subscription) and link is not None:
            link.resume_deliveries()

    # Operations.

    def _check_transaction(self, transaction: str, link: ClientLink | None) -> ClientLink:
        """`link`, if `transaction` is open on it; else `ClientError` (and it is forgotten)."""
        if link is None or self._transactions.get(transaction) != link.epoch:
            self._transactions.pop(transaction, None)
            raise ClientError(
                f"transaction {transaction!r} is not open: already committed or aborted, "
                "or aborted by the broker when its connection was lost"
            )
        return link

    async def _writable_link(self, timeout_s: float, link: ClientLink | None) -> ClientLink:
        """`link`, or the live link, once its write buffer has room.

        Without a given link, a connection that drops meanwhile is waited out: nothing was
        written yet, so the frame can go out on the next one.
        """
        while True:
            target = link if link is not None else await self._connector.live_link(timeout_s)
            try:
                await target.drain()
            except ClientError:
                if link is not None or not self.options.reconnect:
                    raise
                continue
            return target

    async def _request(
        self,
        command: Command,
        headers: dict[str, str],
        body: bytes = b"",
        *,
        receipt: bool,
        what: str,
        transaction: str | None = None,
        link: ClientLink | None = None,
    ) -> None:
        """Send one frame on the live link (or on `link`), waiting for its receipt if asked.

        Once the frame is written, the loss of the connection raises `ConnectionLost`.
        """
        if transaction is not None:
            headers["transaction"] = transaction
        timeout_s = self.options.receipt_timeout_s
        if not receipt:
            target = await self._writable_link(timeout_s, link)
            if transaction is not None:
                self._check_transaction(transaction, target)
            target.send_frame(Frame(command, headers, body))
            return
        async with self._receipt_slots:
            target = await self._writable_link(timeout_s, link)
            if transaction is not None:
                self._check_transaction(transaction, target)
            receipt_id, future = target.send_with_receipt(command, headers, body)
            await target.wait_receipt(receipt_id, future, timeout_s, what)

    async def send(
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
        """Send a message to `destination` (`/queue/NAME` or `/topic/NAME`).

        A `str` body is sent as UTF-8. `headers` travel with the message (user properties, or
        broker headers such as `priority`, `expires`, `x-dedup-id`). With `receipt` (the
        default) this returns once the broker has the message (on disk, for `persistent`) and
        raises `BrokerErrorFrame` if it refused it, `ReceiptTimeout` or `ConnectionLost` if the
        outcome is unknown. Without it, a send only waits while the connection's write buffer
        is full; many may be pipelined.
        """
        data = body.encode("utf-8") if isinstance(body, str) else bytes(body)
        frame_headers = _own_headers(headers, destination=destination)
        if persistent:
            frame_headers["persistent"] = "true"
        if content_type is not None:
            frame_headers["content-type"] = content_type
        what = f"SEND to {destination}"
        if receipt and transaction is None and self.options.resend:
            dedup_id = self._resender.stamp(frame_headers)
            await self._resender.send(
                lambda: self._request(
                    Command.SEND, dict(frame_headers), data, receipt=True, what=what
                ),
                lambda: self._connector.state,
                what,
                dedup_id,
            )
            return
        await self._request(
            Command.SEND,
            frame_headers,
            data,
            receipt=receipt,
            what=what,
            transaction=transaction,
        )

    async def send_pipelined(
        self,
        destination: str,
        body: bytes,
        *,
        headers: Mapping[str, str] | None = None,
        persistent: bool = False,
        transaction: str | None = None,
        epoch: int | None = None,
    ) -> PipelinedReceipt:
        """Write a SEND with a receipt and return without waiting for the RECEIPT.

        Waits only for a receipt slot and for room in the write buffer. With `epoch`, the frame
        goes out on that connection or not at all (`ConnectionLost`), so that a sequence of
        frames never continues on a new connection after a gap. Call `wait()` or `cancel()` on
        the result, so that a failure is always seen.
        """
        frame_headers = _own_headers(headers, destination=destination)
        if persistent:
            frame_headers["persistent"] = "true"
        if transaction is not None:
            frame_headers["transaction"] = transaction
        timeout_s = self.options.receipt_timeout_s
        await self._receipt_slots.acquire()
        try:
            link = await self._writable_link(timeout_s, None)
            if epoch is not None and link.epoch != epoch:
                raise ConnectionLost(f"connection {epoch} to the broker was lost")
            if transaction is not None:
                self._check_transaction(transaction, link)
            receipt_id, future = link.send_with_receipt(Command.SEND, frame_headers, body)
        except BaseException:
            self._receipt_slots.release()
            raise
        return PipelinedReceipt(
            link, receipt_id, future, self._receipt_slots, timeout_s, f"SEND to {destination}"
        )

    async def subscribe(
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
    ) -> ClientSubscription:
        """Subscribe to `destination` and wait for the broker's receipt.

        `ack` is `auto`, `client` or `client-individual`. `prefetch` is the broker's credit in
        messages (`activemq.prefetchSize`), `prefetch_bytes` in bytes (`x-prefetch-bytes`).
        `callback`, if given, is called for each message on a task of the subscription (and
        awaited when it returns an awaitable); otherwise iterate the subscription or call `get`.
        At most `max_queued` messages (and `max_queued_bytes`) wait in its buffer: beyond that
        the client stops reading from the broker until the application catches up.
        """
        mode = AckMode(ack)
        sub_id = id if id is not None else f"sub-{next(self._ids)}"
        frame_headers = _own_headers(headers, destination=destination, id=sub_id, ack=mode.value)
        if prefetch is not None:
            frame_headers["activemq.prefetchSize"] = str(prefetch)
        if prefetch_bytes is not None:
            frame_headers["x-prefetch-bytes"] = str(prefetch_bytes)
        if selector is not None:
            frame_headers["selector"] = selector
        subscription = ClientSubscription(
            self,
            id=sub_id,
            destination=destination,
            ack=mode,
            headers=frame_headers,
            callback=callback,
            max_queued=max_queued,
            max_queued_bytes=max_queued_bytes,
        )
        link = await self._writable_link(self.options.receipt_timeout_s, None)
        # Registered before SUBSCRIBE goes out: messages may come before the receipt.
        self._registry.add(subscription)
        subscription.start_dispatch()
        await self._confirm_subscription(subscription, link)
        return subscription

    async def _confirm_subscription(
        self, subscription: ClientSubscription, link: ClientLink
    ) -> None:
        """Send the SUBSCRIBE of a registered subscription and wait for its receipt.

        A connection lost meanwhile is waited out when reconnecting (the new connection restores
        the subscription); any other failure drops the subscription and raises.
        """
        timeout_s = self.options.receipt_timeout_s
        try:
            receipt_id, future = link.send_with_receipt(
                Command.SUBSCRIBE, dict(subscription.headers)
            )
            await link.wait_receipt(
                receipt_id, future, timeout_s, f"SUBSCRIBE to {subscription.destination}"
            )
        except ConnectionLost:
            if not self.options.reconnect:
                await self._drop_subscription(subscription, None)
                raise
            # It stays registered, so the reconnect restores it; wait for that.
            try:
                await self._connector.live_link(timeout_s)
            except ClientError:
                await self._drop_subscription(subscription, None)
                raise
            if subscription.error is not None:
                raise subscription.error from None
        except BaseException as exc:
            error = exc if isinstance(exc, ClientError) else None
            await self._drop_subscription(subscription, error)
            raise

    async def _drop_subscription(
        self, subscription: ClientSubscription, error: ClientError | None
    ) -> None:
        self._registry.remove(subscription)
        subscription.close(error)
        await subscription.stop_dispatch(cancel=True)

    async def unsubscribe(
        self, subscription: ClientSubscription, headers: Mapping[str, str]
    ) -> None:
        """End `subscription` (prefer `ClientSubscription.unsubscribe`)."""
        if not self._registry.remove(subscription):
            subscription.close()
            return
        subscription.close()
        try:
            link = self._connector.current_link()
            if link is not None and link.usable:
                frame_headers = dict(headers)
                frame_headers["id"] = subscription.id
                await self._request(
                    Command.UNSUBSCRIBE,
                    frame_headers,
                    receipt=True,
                    what=f"UNSUBSCRIBE from {subscription.destination}",
                    link=link,
                )
            # Otherwise the subscription ended with its connection and is not restored.
        except ConnectionLost:
            pass
        finally:
            await subscription.stop_dispatch(cancel=False)

    async def ack(
        self, message: Message, *, transaction: str | None = None, receipt: bool = False
    ) -> None:
        """Acknowledge `message` (with `client` acks, every earlier one of its subscription too).

        Raises `ClientError` if the connection that delivered it is gone: the broker then
        redelivers the message.
        """
        await self._acknowledge(Command.ACK, message, transaction, receipt)

    async def nack(
        self, message: Message, *, transaction: str | None = None, receipt: bool = False
    ) -> None:
        """Refuse `message`: the broker redelivers it or moves it to its dead letter queue.

        Not available on STOMP 1.0 connections (raises `ClientError`).
        """
        await self._acknowledge(Command.NACK, message, transaction, receipt)

    async def _acknowledge(
        self, command: Command, message: Message, transaction: str | None, receipt: bool
    ) -> None:
        link = self._connector.current_link()
        if link is None or link.epoch != message.connection_epoch:
            raise ConnectionLost(
                f"cannot {command.value} message {message.message_id}: the connection that "
                "delivered it is gone and the broker redelivers it"
            )
        subscription = self._registry.get(message.subscription)
        if subscription is not None and subscription.ack is AckMode.AUTO:
            raise ClientError(
                f"subscription {subscription.id} uses ack=auto: there is nothing to {command}"
            )
        version = link.version
        if command is Command.NACK and version is Version.V1_0:
            raise ClientError("NACK is not part of STOMP 1.0")
        if version is Version.V1_2:
            headers = {"id": message.ack_id}
        else:
            headers = {"message-id": message.ack_id, "subscription": message.subscription}
        await self._request(
            command,
            headers,
            receipt=receipt,
            what=f"{command.value} of {message.message_id}",
            transaction=transaction,
            link=link,
        )

    async def begin(self, transaction: str | None = None, *, receipt: bool = True) -> str:
        """Begin a transaction and return its id (generated unless given)."""
        tx = transaction if transaction is not None else f"tx-{self._token}-{next(self._ids)}"
        if tx in self._transactions:
            raise ClientError(f"transaction {tx!r} is already open")
        link = await self._connector.live_link(self.options.receipt_timeout_s)
        self._transactions[tx] = link.epoch
        try:
            await self._request(
                Command.BEGIN, {"transaction": tx}, receipt=receipt, what=f"BEGIN {tx}", link=link
            )
        except BaseException:
            self._transactions.pop(tx, None)
            raise
        return tx

    async def commit(self, transaction: str) -> None:
        """Commit `transaction` and wait for the receipt.

        Raises `ConnectionLost` when the connection drops first: the outcome is then unknown.
        """
        await self._end_transaction(Command.COMMIT, transaction)

    async def abort(self, transaction: str) -> None:
        """Abort `transaction` and wait for the receipt.

        Raises `ClientError` if it is not open (which includes one lost with its connection). If
        the connection drops during the abort, this returns: the broker aborts it anyway.
        """
        try:
            await self._end_transaction(Command.ABORT, transaction)
        except ConnectionLost:
            logger.debug("transaction %s ended with its connection", transaction)

    async def _end_transaction(self, command: Command, transaction: str) -> None:
        link = self._check_transaction(transaction, self._connector.current_link())
        try:
            await self._request(
                command,
                {},
                receipt=True,
                what=f"{command.value} {transaction}",
                transaction=transaction,
                link=link,
            )
        finally:
            self._transactions.pop(transaction, None)

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[str]:
        """`async with client.transaction() as tx:` commits on success, aborts on an exception."""
        tx = await self.begin()
        try:
            yield tx
        except BaseException:
            try:
                await self.abort(tx)
            except ClientError as exc:
                logger.debug("abort of %s after an error failed: %s", tx, exc)
            raise
        await self.commit(tx)

    # Closing.

    async def close(self) -> None:
        """Send DISCONNECT, wait (bounded) for its receipt, and close the connection.

        Subscriptions end: iterators finish what is buffered, callback tasks are cancelled, and
        messages that arrive meanwhile for a full buffer are dropped. Safe to call twice.
        """
        connector = self._connector
        if connector.state in (ClientState.CLOSING, ClientState.CLOSED):
            await connector.wait_closed()
            return
        try:
            await connector.close()
            subscriptions = self._registry.take_all()
            for subscription in subscriptions:
                subscription.close()
            for subscription in subscriptions:
                await subscription.stop_dispatch(cancel=True)
        finally:
            self._transactions.clear()
            connector.closed()
            logger.debug("client closed")


def _own_headers(headers: Mapping[str, str] | None, **own: str) -> dict[str, str]:
    """A frame's headers: the caller's without `receipt` (the client sets that), then `own`."""
    frame_headers = dict(headers) if headers else {}
    frame_headers.pop("receipt", None)
    frame_headers.update(own)
    return frame_headers
