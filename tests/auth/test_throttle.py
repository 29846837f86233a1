"""Failed-login throttling with an injected clock: lockout per login name and per address,
the window passing, success forgetting a name's failures, and the bounded memory of it all."""

from __future__ import annotations

from sluice.auth.identity import ANONYMOUS, Identity, Refusal
from sluice.auth.login import BAD_CREDENTIALS, LOCKED_OUT, Authenticator
from sluice.auth.throttle import LoginThrottle
from sluice.auth.users import ScryptParams, User, UsersFile, hash_password
from sluice.config import Limits

LIMITS = Limits(login_lockout_failures=3, login_lockout_window_s=60.0, max_login_failure_records=4)
FAST = ScryptParams(ln=10, r=8, p=1)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_name_is_locked_after_its_failures_until_the_window_passes() -> None:
    clock = Clock()
    throttle = LoginThrottle(LIMITS, clock)
    assert not throttle.failed("alice", "10.0.0.1")
    assert not throttle.failed("alice", "10.0.0.2")
    assert throttle.failed("alice", "10.0.0.3")  # the third locks
    assert throttle.locked_out("alice", "10.0.0.9")
    assert not throttle.locked_out("bob", "10.0.0.9")
    clock.now += 59.9
    assert throttle.locked_out("alice", "10.0.0.9")
    clock.now += 0.2
    assert not throttle.locked_out("alice", "10.0.0.9")


def test_an_address_is_locked_whatever_names_it_tries() -> None:
    throttle = LoginThrottle(LIMITS, Clock())
    for name in ("u1", "u2", "u3"):
        throttle.failed(name, "10.0.0.1")
    assert throttle.locked_out("alice", "10.0.0.1")
    assert not throttle.locked_out("alice", "10.0.0.2")


def test_success_forgets_the_names_failures() -> None:
    throttle = LoginThrottle(LIMITS, Clock())
    throttle.failed("alice", "a1")
    throttle.failed("alice", "a2")
    throttle.succeeded("alice")
    assert not throttle.failed("alice", "a3")


def test_remembered_failures_are_bounded() -> None:
    throttle = LoginThrottle(LIMITS, Clock())
    for n in range(100):
        throttle.failed(f"user{n}", f"10.0.0.{n}")
    assert len(throttle) <= LIMITS.max_login_failure_records
    assert throttle.forgotten > 0


def _authenticator(clock: Clock, *, allow_anonymous: bool = False) -> Authenticator:
    users = UsersFile([User("alice", ("ops",), hash_password("right", FAST))])
    return Authenticator(users, allow_anonymous=allow_anonymous, limits=LIMITS, clock=clock)


def test_a_locked_out_name_is_refused_even_with_the_right_password() -> None:
    clock = Clock()
    auth = _authenticator(clock)
    outcomes = [auth("alice", "wrong", "10.0.0.1") for _ in range(3)]
    assert all(isinstance(o, Refusal) and o.reason == BAD_CREDENTIALS for o in outcomes)
    assert [o.locks for o in outcomes if isinstance(o, Refusal)] == [False, False, True]
    locked = auth("alice", "right", "10.0.0.2")
    assert isinstance(locked, Refusal)
    assert locked.reason == LOCKED_OUT
    assert locked.counter == "login_refused_locked_out"
    clock.now += 61
    assert auth("alice", "right", "10.0.0.2") == Identity("alice", frozenset({"ops"}))


def test_empty_and_missing_credentials() -> None:
    auth = _authenticator(Clock())
    for login, passcode in (("", "right"), ("alice", ""), ("", "")):
        refusal = auth(login, passcode, "h")
        assert isinstance(refusal, Refusal)
        assert refusal.counter == "login_refused_empty_credentials"
    missing = auth(None, None, "h")
    assert isinstance(missing, Refusal)
    assert missing.counter == "login_refused_no_credentials"
    assert _authenticator(Clock(), allow_anonymous=True)(None, None, "h") == ANONYMOUS


def test_without_a_users_file_everyone_is_anonymous() -> None:
    auth = Authenticator(None, allow_anonymous=False, limits=LIMITS, clock=Clock())
    assert auth("alice", "anything", "h") == ANONYMOUS
