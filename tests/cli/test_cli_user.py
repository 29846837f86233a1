"""`sluice user` edits the users file (mode 0600, no clear text), refuses empty names and
passwords; `sluice broker` refuses a users file others can read and a listener beyond loopback
without users; SIGHUP reloads the users file and closes a removed user's connection."""

from __future__ import annotations

import queue
import signal
from pathlib import Path
from typing import Any

import stomp

from brokerproc import BrokerProcess
from sluice.auth.users import load_users
from waiting import wait_until

from .conftest import sluice, stderr_lines


def _add(users: Path, name: str, password: str, *extra: str) -> None:
    done = sluice(
        "user", "add", name, "--file", str(users), "--password-stdin", *extra,
        stdin=password.encode() + b"\n",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr


def test_add_list_passwd_remove(tmp_path: Path) -> None:
    users = tmp_path / "users.toml"
    _add(users, "alice", "first-Pw", "--groups", "ops,billing")
    _add(users, "bob", "bob-Pw")
    assert users.stat().st_mode & 0o777 == 0o600
    assert "first-Pw" not in users.read_text()
    listed = sluice("user", "list", "--file", str(users))
    assert listed.stdout.decode().splitlines() == ["alice\tops,billing", "bob\t"]
    changed = sluice(
        "user", "passwd", "alice", "--file", str(users), "--password-stdin",
        stdin=b"second-Pw\n",
    )  # fmt: skip
    assert changed.returncode == 0, changed.stderr
    alice = load_users(users)
    assert alice.authenticate("alice", "second-Pw") is not None
    assert alice.authenticate("alice", "first-Pw") is None
    assert alice.users["alice"].groups == ("ops", "billing")  # passwd keeps the groups
    removed = sluice("user", "remove", "bob", "--file", str(users))
    assert removed.returncode == 0
    assert list(load_users(users).users) == ["alice"]
    again = sluice("user", "remove", "bob", "--file", str(users))
    assert again.returncode == 1
    assert "no user bob" in stderr_lines(again)[-1]


def test_empty_names_passwords_and_duplicates_are_refused(tmp_path: Path) -> None:
    users = tmp_path / "users.toml"
    empty_password = sluice(
        "user", "add", "alice", "--file", str(users), "--password-stdin", stdin=b"\n"
    )
    assert empty_password.returncode == 2
    assert "empty password" in stderr_lines(empty_password)[-1]
    empty_name = sluice("user", "add", "", "--file", str(users), "--password-stdin", stdin=b"x\n")
    assert empty_name.returncode == 2
    assert "empty user name" in stderr_lines(empty_name)[-1]
    bad_group = sluice(
        "user", "add", "a", "--groups", "o ps", "--file", str(users), "--password-stdin",
        stdin=b"x\n",
    )  # fmt: skip
    assert bad_group.returncode == 2
    assert not users.exists()
    _add(users, "alice", "pw")
    twice = sluice("user", "add", "alice", "--file", str(users), "--password-stdin", stdin=b"x\n")
    assert twice.returncode == 1


def test_the_broker_refuses_a_users_file_others_can_read(tmp_path: Path) -> None:
    users = tmp_path / "users.toml"
    _add(users, "alice", "pw")
    users.chmod(0o640)
    config = tmp_path / "sluice.toml"
    config.write_text('[auth]\nusers_file = "users.toml"\n[store]\nkind = "memory"\n')
    done = sluice("broker", "--config", str(config), "--stomp", "127.0.0.1:0", timeout=30)
    assert done.returncode == 1
    line = stderr_lines(done)[-1]
    assert str(users) in line
    assert "mode 0640" in line


def test_the_broker_refuses_to_listen_beyond_loopback_without_users(tmp_path: Path) -> None:
    done = sluice("broker", "--store", "memory", "--stomp", "0.0.0.0:0", timeout=30)
    assert done.returncode == 1
    line = stderr_lines(done)[-1]
    assert "beyond loopback" in line
    assert "allow_anonymous = true" in line


class _Frames(stomp.ConnectionListener):  # type: ignore[misc]
    def __init__(self) -> None:
        self.errors: queue.Queue[Any] = queue.Queue()
        self.receipts: queue.Queue[Any] = queue.Queue()
        self.disconnected = False

    def on_error(self, frame: Any) -> None:
        self.errors.put(frame)

    def on_receipt(self, frame: Any) -> None:
        self.receipts.put(frame)

    def on_disconnected(self) -> None:
        self.disconnected = True


def _login(port: int, user: str, password: str) -> tuple[Any, _Frames]:
    conn = stomp.Connection12([("127.0.0.1", port)])
    frames = _Frames()
    conn.set_listener("f", frames)
    conn.connect(user, password, wait=True)
    return conn, frames


def test_sighup_reloads_users_and_closes_a_removed_users_connection(tmp_path: Path) -> None:
    users = tmp_path / "users.toml"
    _add(users, "alice", "alice-pw")
    _add(users, "bob", "bob-pw")
    config = '[auth]\nusers_file = "users.toml"\n[store]\nkind = "memory"\n'
    broker = BrokerProcess(config, tmp_path).start()
    try:
        alice, alice_frames = _login(broker.port, "alice", "alice-pw")
        _bob, bob_frames = _login(broker.port, "bob", "bob-pw")
        assert sluice("user", "remove", "bob", "--file", str(users)).returncode == 0
        assert broker.proc is not None
        broker.proc.send_signal(signal.SIGHUP)
        assert bob_frames.errors.get(timeout=20).headers["message"] == "user bob was removed"
        wait_until(lambda: bob_frames.disconnected, what="bob's connection closed")
        alice.send("/queue/after-reload", "x", headers={"receipt": "r"})
        assert alice_frames.receipts.get(timeout=20).headers["receipt-id"] == "r"
        alice.disconnect()
        wait_until(lambda: "reloaded the users file" in broker.log_text, what="reload logged")
        assert "bob-pw" not in broker.log_text
        assert "alice-pw" not in broker.log_text
    finally:
        assert broker.stop() == 0
