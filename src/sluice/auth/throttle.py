"""Failed-login throttling: a lockout window per login name and per client address.

`login_lockout_failures` failures within `login_lockout_window_s` for one key lock it: every
login of that name, or from that address, is refused without checking the password until the
oldest of those failures is older than the window. Each key keeps at most that many failure
times, and at most `max_login_failure_records` keys are kept (the least recently failed are
forgotten, and counted). The clock is injected, so tests need no sleep. Thread-safe: logins are
checked on worker threads.
"""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from collections.abc import Callable

from sluice.config import Limits

__all__ = ["LoginThrottle"]


class LoginThrottle:
    """Remembers recent failed logins by name and by address, and says who is locked out."""

    def __init__(self, limits: Limits, clock: Callable[[], float]) -> None:
        self.max_failures = limits.login_lockout_failures
        self.window_s = limits.login_lockout_window_s
        self.max_records = limits.max_login_failure_records
        self.clock = clock
        self.forgotten = 0
        self._failures: OrderedDict[tuple[str, str], deque[float]] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._failures)

    def _locked(self, key: tuple[str, str], now: float) -> bool:
        times = self._failures.get(key)
        if times is None:
            return False
        while times and now - times[0] >= self.window_s:
            times.popleft()
        if not times:
            del self._failures[key]
            return False
        return len(times) >= self.max_failures

    def locked_out(self, login: str | None, address: str) -> bool:
        """Whether a login by this name or from this address is refused for now."""
        now = self.clock()
        with self._lock:
            by_user = login is not None and self._locked(("user", login), now)
            return by_user or self._locked(("address", address), now)

    def failed(self, login: str | None, address: str) -> bool:
        """Record a failed login; tell whether it locks the name or the address out."""
        now = self.clock()
        keys = [("address", address)]
        if login:
            keys.append(("user", login))
        locks = False
        with self._lock:
            for key in keys:
                times = self._failures.get(key)
                if times is None:
                    times = self._failures[key] = deque(maxlen=self.max_failures)
                    while len(self._failures) > self.max_records:
                        self._failures.popitem(last=False)
                        self.forgotten += 1
                else:
                    self._failures.move_to_end(key)
                times.append(now)
                locks = locks or self._locked(key, now)
        return locks

    def succeeded(self, login: str) -> None:
        """A login of this name succeeded: forget its failures (not its address's)."""
        with self._lock:
            self._failures.pop(("user", login), None)
