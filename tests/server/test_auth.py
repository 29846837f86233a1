"""Authentication and authorization, attacked over real sockets with stomp.py, our own client
and raw frames: bad passwords, unknown users, empty credentials, lockouts (an injected clock, no
sleeps), every permission refused per frame type, a removed user's connection closed on reload,
and the passcode kept out of ERROR frames and logs."""

from __future__ import annotations

import asyncio
import logging
import queue
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import stomp

from conftest import RunningBroker, start_broker
from rawstomp import RawStomp
from sluice import config as config_mod
from sluice.auth.users import ScryptParams, User, UsersFile, hash_password, save_users
from sluice.client import BrokerErrorFrame, Client
from sluice.errors import ConfigError
from waiting import wait_until

FAST = ScryptParams(ln=10, r=8, p=1)
PASSWORDS = {"alice": "alice-Pw-1", "bob": "bob-Pw-2", "carol": "carol-Pw-3"}
GROUPS = {"alice": ("ops",), "bob": ("shop",), "carol": ()}
ACL: list[dict[str, Any]] = [
    {"destination": "/queue/orders.>", "read": ["ops"], "write": ["shop"], "admin": ["ops"]},
    {"destination": "/topic/prices.secret", "read": ["alice"]},
    {"destination": "/topic/prices.>", "read": ["ops", "shop"], "write": ["ops"], "admin": ["*"]},
    {"destination": "/queue/open.>", "read": ["*"], "write": ["*"], "admin": ["*"]},
]


class Clock:
    """The lockout clock, moved by the test."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _write_users(path: Path, names: tuple[str, ...] = ("alice", "bob", "carol")) -> None:
    users = UsersFile(User(n, GROUPS[n], hash_password(PASSWORDS[n], FAST)) for n in names)
    save_users(path, users)


@pytest.fixture
def users_file(tmp_path: Path) -> Path:
    path = tmp_path / "users.toml"
    _write_users(path)
    return path


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def secured(users_file: Path, clock: Clock) -> Iterator[RunningBroker]:
    """A broker with users and ACLs; failed logins answered at once, locked after 3."""
    running = start_broker(
        auth={"users_file": str(users_file)},
        acl=ACL,
        limits={
            "login_failure_delay_s": 0,
            "login_lockout_failures": 3,
            "login_lockout_window_s": 60,
        },
        login_clock=clock,
    )
    try:
        yield running
    finally:
        running.stop()


def run(coro_fn: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(coro_fn(), timeout=60))


def _creds(user: str) -> str:
    return f"login:{user}\npasscode:{PASSWORDS[user]}\n"


def _raw_login(broker: RunningBroker, extra: str, version: str = "1.2") -> RawStomp:
    raw = RawStomp(broker.port)
    raw.send(f"CONNECT\naccept-version:{version}\nhost:localhost\n{extra}\n\0".encode())
    return raw


def _refused(broker: RunningBroker, extra: str) -> str:
    """CONNECT with these headers; the ERROR's message (the connection must close)."""
    raw = _raw_login(broker, extra)
    frame = raw.frame()
    assert frame.command == "ERROR", frame
    assert raw.closed()
    return frame.headers["message"]


class Collector(stomp.ConnectionListener):  # type: ignore[misc]
    """stomp.py's frames, handed to the test thread."""

    def __init__(self) -> None:
        self.frames: queue.Queue[tuple[str, Any]] = queue.Queue()
        self.disconnected = False

    def on_message(self, frame: Any) -> None:
        self.frames.put(("MESSAGE", frame))

    def on_receipt(self, frame: Any) -> None:
        self.frames.put(("RECEIPT", frame))

    def on_error(self, frame: Any) -> None:
        self.frames.put(("ERROR", frame))

    def on_disconnected(self) -> None:
        self.disconnected = True

    def next(self, timeout: float = 10.0) -> tuple[str, Any]:
        return self.frames.get(timeout=timeout)


def _stomppy(broker: RunningBroker, user: str | None, **kwargs: Any) -> tuple[Any, Collector]:
    conn = stomp.Connection12([("127.0.0.1", broker.port)], **kwargs)
    collector = Collector()
    conn.set_listener("c", collector)
    if user is None:
        conn.connect(wait=True)
    else:
        conn.connect(user, PASSWORDS[user], wait=True)
    return conn, collector


# -- authentication ------------------------------------------------------------------------------


def test_users_log_in_with_stomppy_and_our_client(secured: RunningBroker) -> None:
    conn, _ = _stomppy(secured, "alice")
    assert conn.is_connected()
    conn.disconnect()

    async def main() -> None:
        async with await Client.connect(
            secured.address, login="bob", passcode=PASSWORDS["bob"], reconnect=False
        ) as client:
            await client.send("/queue/open.x", b"hello")

    run(main)
    assert secured.stats()["logins"] == 2


@pytest.mark.parametrize(
    ("headers", "message", "counter"),
    [
        ("login:alice\npasscode:wrong-secret\n", "bad login or passcode", "login_failures"),
        ("login:mallory\npasscode:wrong-secret\n", "bad login or passcode", "login_failures"),
        ("login:\npasscode:\n", "empty login or passcode", "login_refused_empty_credentials"),
        ("login:alice\npasscode:\n", "empty login or passcode", "login_refused_empty_credentials"),
        ("", "needs a login and passcode", "login_refused_no_credentials"),
    ],
)
def test_bad_credentials_are_refused(
    secured: RunningBroker,
    headers: str,
    message: str,
    counter: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    got = _refused(secured, headers)
    assert message in got
    assert "wrong-secret" not in got
    wait_until(lambda: secured.stats().get(counter) == 1, what=counter)
    assert secured.stats()["closed_auth_failed"] == 1
    assert "wrong-secret" not in caplog.text


def test_stomppy_and_our_client_see_the_refusal(secured: RunningBroker) -> None:
    conn = stomp.Connection12([("127.0.0.1", secured.port)])
    with pytest.raises(stomp.exception.ConnectFailedException):
        conn.connect("alice", "not-her-password", wait=True)

    async def main() -> None:
        with pytest.raises(BrokerErrorFrame) as info:
            await Client.connect(secured.address, login="nobody", passcode="guess", reconnect=False)
        assert "bad login or passcode" in info.value.message
        assert "guess" not in info.value.message
        with pytest.raises(BrokerErrorFrame, match="empty login or passcode"):
            await Client.connect(secured.address, login="", passcode="", reconnect=False)

    run(main)


def test_lockout_after_repeated_failures_per_user(secured: RunningBroker, clock: Clock) -> None:
    for _ in range(3):
        assert "bad login" in _refused(secured, "login:alice\npasscode:guess\n")
    # Locked: even the right password is refused, without checking it.
    assert "too many failed logins" in _refused(secured, _creds("alice"))
    stats = secured.stats()
    assert stats["login_failures"] == 3
    assert stats["login_lockouts"] == 1  # one failure locked (the name and the address)
    assert stats["login_refused_locked_out"] == 1
    clock.now += 61  # the window passes
    raw = _raw_login(secured, _creds("alice"))
    assert raw.frame().command == "CONNECTED"


def test_lockout_per_address_whatever_names_are_tried(secured: RunningBroker) -> None:
    for name in ("u1", "u2", "u3"):
        _refused(secured, f"login:{name}\npasscode:guess\n")
    # bob never failed, but this address did.
    assert "too many failed logins" in _refused(secured, _creds("bob"))


def test_a_failed_login_is_answered_late(users_file: Path) -> None:
    delay = 0.3
    broker = start_broker(
        auth={"users_file": str(users_file)}, limits={"login_failure_delay_s": delay}
    )
    try:
        started = time.monotonic()
        _refused(broker, "login:alice\npasscode:guess\n")
        assert time.monotonic() - started >= delay
    finally:
        broker.stop()


def test_without_users_a_login_gives_no_rights(tmp_path: Path) -> None:
    # No users file: every client is anonymous, whatever login it claims.
    broker = start_broker(acl=[{"destination": "/queue/a", "write": ["alice"]}])
    try:
        raw = RawStomp(broker.port)
        raw.connect(extra="login:alice\npasscode:x\n")
        raw.send(b"SEND\ndestination:/queue/a\n\nx\0")
        error = raw.frame()
        assert error.command == "ERROR"
        assert "write permission on /queue/a" in error.headers["message"]
    finally:
        broker.stop()


def test_a_users_file_others_can_read_stops_the_start(users_file: Path) -> None:
    users_file.chmod(0o644)
    with pytest.raises(ConfigError) as info:
        start_broker(auth={"users_file": str(users_file)})
    assert str(users_file) in str(info.value)
    assert "0644" in str(info.value)


# -- authorization -------------------------------------------------------------------------------


def _denied(raw: RawStomp, permission: str, destination: str) -> None:
    error = raw.frame()
    assert error.command == "ERROR", error
    assert error.headers["message"] == (
        f"access denied: {permission} permission on {destination} is not granted"
    )
    assert raw.closed()


def _connected(broker: RunningBroker, user: str, extra: str = "") -> RawStomp:
    raw = RawStomp(broker.port)
    raw.connect(extra=_creds(user) + extra)
    return raw


def test_send_without_write_is_refused(secured: RunningBroker) -> None:
    # alice (ops) may read orders, not write them.
    raw = _connected(secured, "alice")
    raw.send(b"SEND\ndestination:/queue/orders.eu\nreceipt:r1\n\nx\0")
    error = raw.frame()
    assert error.headers["receipt-id"] == "r1"
    assert "write permission on /queue/orders.eu" in error.headers["message"]
    assert secured.stats()["access_denied_write"] == 1
    assert secured.stats()["closed_access_denied"] == 1


def test_subscribe_without_read_is_refused_plain_durable_at_an_offset_and_as_a_range(
    secured: RunningBroker,
) -> None:
    extras = (
        "",
        "activemq.subscriptionName:d1\n",
        "x-offset:earliest\n",
        "x-offset:1\nx-range-end:9\n",  # a range read (the Spark source's blocks)
    )
    for extra in extras:
        raw = _connected(secured, "bob", "client-id:c1\n")
        raw.send(f"SUBSCRIBE\nid:1\ndestination:/topic/prices.secret\n{extra}\n\0".encode())
        _denied(raw, "read", "/topic/prices.secret")
    assert secured.stats()["access_denied_read"] == 4


def test_a_wildcard_subscription_reaching_a_forbidden_topic_is_refused(
    secured: RunningBroker,
) -> None:
    raw = _connected(secured, "bob")
    raw.send(b"SUBSCRIBE\nid:1\ndestination:/topic/prices.*\n\n\0")
    _denied(raw, "read", "/topic/prices.*")
    # alice may read every topic it reaches.
    ok = _connected(secured, "alice")
    ok.send(b"SUBSCRIBE\nid:1\ndestination:/topic/prices.*\nreceipt:s\n\n\0")
    assert ok.frame().headers["receipt-id"] == "s"


def test_creating_a_destination_needs_admin(secured: RunningBroker) -> None:
    # bob may write orders but not create them; once alice (ops, admin) has, bob may send.
    raw = _connected(secured, "bob")
    raw.send(b"SEND\ndestination:/queue/orders.new\n\nx\0")
    _denied(raw, "admin", "/queue/orders.new")
    alice = _connected(secured, "alice")
    alice.send(b"SUBSCRIBE\nid:1\ndestination:/queue/orders.new\nack:auto\nreceipt:s\n\n\0")
    assert alice.frame().headers["receipt-id"] == "s"
    bob = _connected(secured, "bob")
    bob.send(b"SEND\ndestination:/queue/orders.new\nreceipt:r\n\nfor alice\0")
    assert bob.frame().headers["receipt-id"] == "r"
    message = alice.frame()
    assert message.command == "MESSAGE"
    assert message.body == b"for alice"
    assert secured.stats()["access_denied_admin"] == 1


def test_a_send_inside_a_transaction_is_checked_before_commit(secured: RunningBroker) -> None:
    raw = _connected(secured, "carol")
    raw.send(b"BEGIN\ntransaction:t1\nreceipt:b\n\n\0")
    assert raw.frame().headers["receipt-id"] == "b"
    raw.send(b"SEND\ndestination:/queue/open.t\ntransaction:t1\n\nfine\0")
    raw.send(b"SEND\ndestination:/queue/orders.eu\ntransaction:t1\n\nnot allowed\0")
    _denied(raw, "write", "/queue/orders.eu")
    # The connection closed: the transaction was aborted, nothing of it is visible.
    reader = _connected(secured, "carol")
    reader.send(b"SUBSCRIBE\nid:1\ndestination:/queue/open.t\nreceipt:s\n\n\0")
    assert reader.frame().headers["receipt-id"] == "s"
    with pytest.raises(TimeoutError):
        reader.frame(timeout=0.3)


def test_earlier_receipted_work_is_kept_before_the_error(secured: RunningBroker) -> None:
    conn, col = _stomppy(secured, "carol")
    conn.send("/queue/open.kept", "kept", headers={"persistent": "true", "receipt": "r1"})
    conn.send("/queue/orders.eu", "refused", headers={"receipt": "r2"})
    kind, frame = col.next()
    assert (kind, frame.headers["receipt-id"]) == ("RECEIPT", "r1")
    kind, frame = col.next()
    assert kind == "ERROR"
    assert frame.headers["message"] == (
        "access denied: write permission on /queue/orders.eu is not granted"
    )
    assert frame.headers["receipt-id"] == "r2"

    async def main() -> None:
        async with await Client.connect(
            secured.address, login="bob", passcode=PASSWORDS["bob"], reconnect=False
        ) as client:
            sub = await client.subscribe("/queue/open.kept")
            message = await sub.get(timeout=10)
            assert message is not None
            assert message.body == b"kept"

    run(main)


def test_our_client_sees_refused_frames(secured: RunningBroker) -> None:
    async def main() -> None:
        async with await Client.connect(
            secured.address, login="carol", passcode=PASSWORDS["carol"], reconnect=False
        ) as client:
            with pytest.raises(BrokerErrorFrame, match=r"read permission on /queue/orders\.eu"):
                await client.subscribe("/queue/orders.eu")
        async with await Client.connect(
            secured.address, login="carol", passcode=PASSWORDS["carol"], reconnect=False
        ) as client:
            with pytest.raises(BrokerErrorFrame, match=r"write permission on /topic/prices\.x"):
                await client.send("/topic/prices.x", b"x")

    run(main)


def test_a_stream_needs_write_to_send_and_read_to_receive(secured: RunningBroker) -> None:
    async def main() -> None:
        async with await Client.connect(
            secured.address, login="carol", passcode=PASSWORDS["carol"], reconnect=False
        ) as client:
            with pytest.raises(BrokerErrorFrame, match=r"write permission on /queue/orders\.files"):
                await client.send_stream("/queue/orders.files", [b"chunk"] * 3)

    run(main)
    raw = _connected(secured, "carol")
    raw.send(
        b"SUBSCRIBE\nid:1\ndestination:/queue/orders.files\nack:client-individual\n"
        b"x-max-open-groups:1\n\n\0"
    )
    _denied(raw, "read", "/queue/orders.files")


# -- reload --------------------------------------------------------------------------------------


def _reload(broker: RunningBroker, users_file: Path, acl: list[dict[str, Any]]) -> None:
    cfg = config_mod.load(
        env={},
        overrides={"stomp": {"port": 0}, "auth": {"users_file": str(users_file)}, "acl": acl},  # type: ignore[dict-item]
    )
    broker.call(lambda: broker.server.reload_auth(cfg))


def test_a_removed_users_connection_is_closed_on_reload(
    secured: RunningBroker, users_file: Path
) -> None:
    _bob, bob_col = _stomppy(secured, "bob")
    alice, alice_col = _stomppy(secured, "alice")
    _write_users(users_file, ("alice", "carol"))
    _reload(secured, users_file, ACL)
    kind, frame = bob_col.next()
    assert kind == "ERROR"
    assert frame.headers["message"] == "user bob was removed"
    wait_until(lambda: bob_col.disconnected, what="bob disconnected")
    # alice keeps her connection.
    alice.send("/queue/open.still", "here", headers={"receipt": "r"})
    kind, frame = alice_col.next()
    assert (kind, frame.headers["receipt-id"]) == ("RECEIPT", "r")
    assert secured.stats()["closed_user_removed"] == 1
    # And bob can no longer log in.
    assert "bad login" in _refused(secured, _creds("bob"))
    alice.disconnect()


def test_an_ack_is_refused_once_read_is_revoked(secured: RunningBroker, users_file: Path) -> None:
    raw = _connected(secured, "carol")
    raw.send(b"SUBSCRIBE\nid:1\ndestination:/queue/open.acks\nack:client\nreceipt:s\n\n\0")
    assert raw.frame().headers["receipt-id"] == "s"
    raw.send(b"SEND\ndestination:/queue/open.acks\n\nm\0")
    message = raw.frame()
    assert message.command == "MESSAGE"
    narrower = [{"destination": "/queue/open.>", "write": ["*"]}]
    _reload(secured, users_file, narrower)
    raw.send(f"ACK\nid:{message.headers['ack']}\n\n\0".encode())
    _denied(raw, "read", "/queue/open.acks")


def test_a_user_past_max_connections_per_user_is_refused(users_file: Path) -> None:
    """Two connections for alice at most: the third login is refused naming the limit (and
    counted), bob is not affected, and alice may connect again once one of hers closed."""
    broker = start_broker(
        auth={"users_file": str(users_file)}, limits={"max_connections_per_user": 2}
    )
    try:
        first, second = _connected(broker, "alice"), _connected(broker, "alice")
        message = _refused(broker, _creds("alice"))
        assert message == "limit max_connections_per_user=2 reached for user alice"
        assert broker.stats()["limit_max_connections_per_user"] == 1
        _connected(broker, "bob").close()
        conn = stomp.Connection12([("127.0.0.1", broker.port)])
        with pytest.raises(stomp.exception.ConnectFailedException):
            conn.connect("alice", PASSWORDS["alice"], wait=True)

        async def our_client() -> None:
            with pytest.raises(BrokerErrorFrame, match="max_connections_per_user=2"):
                await Client.connect(
                    broker.address, login="alice", passcode=PASSWORDS["alice"], reconnect=False
                )

        run(our_client)
        assert broker.stats()["limit_max_connections_per_user"] == 3
        first.close()
        wait_until(
            lambda: broker.call(lambda: broker.server.context.user_connections["alice"]) == 1,
            what="alice's first connection counted out",
        )
        third = _connected(broker, "alice")
        third.close()
        second.close()
    finally:
        broker.stop()


def test_subscriptions_whose_read_is_revoked_are_ended_on_reload(
    secured: RunningBroker, users_file: Path
) -> None:
    """A reload that takes `read` away ends the subscriptions relying on it (plain and wildcard;
    stomp.py and a raw connection): an ERROR naming the destination, the connection closed,
    counted; a subscription still allowed goes on."""
    plain, plain_col = _stomppy(secured, "carol")
    plain.subscribe("/queue/open.revoked", id="1", ack="auto")
    wildcard_raw = _connected(secured, "alice")
    wildcard_raw.send(b"SUBSCRIBE\nid:w\ndestination:/topic/prices.>\nreceipt:s\n\n\0")
    assert wildcard_raw.frame().command == "RECEIPT"
    kept = _connected(secured, "carol")
    kept.send(b"SUBSCRIBE\nid:k\ndestination:/queue/open.kept\nreceipt:s\n\n\0")
    assert kept.frame().command == "RECEIPT"
    denied_before = secured.stats().get("access_denied_read", 0)

    narrower = [
        {"destination": "/queue/open.kept", "read": ["*"], "write": ["*"]},
        {"destination": "/queue/open.>", "write": ["*"]},
        {"destination": "/topic/prices.>", "write": ["ops"]},
    ]
    _reload(secured, users_file, narrower)

    kind, frame = plain_col.next()
    assert kind == "ERROR"
    assert frame.headers["message"] == (
        "access denied: read permission on /queue/open.revoked is not granted"
    )
    wait_until(lambda: plain_col.disconnected, what="the revoked stomp.py subscriber closed")
    _denied(wildcard_raw, "read", "/topic/prices.>")
    assert secured.stats()["access_denied_read"] == denied_before + 2
    # The subscription still allowed keeps receiving.
    kept.send(b"SEND\ndestination:/queue/open.kept\n\nstill\0")
    message = kept.frame()
    assert (message.command, message.body) == ("MESSAGE", b"still")
