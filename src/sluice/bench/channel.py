"""`Channel`: a worker process's end of the pipe to the coordinator, JSON objects both ways.

Commands come down (`warmup`, `start`, `mark`, `stop`) and events go up (see `worker`). The pipe
is read without blocking the worker's event loop; nothing received is ever unpickled.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from multiprocessing.connection import Connection
from typing import Any

__all__ = ["Channel"]


class Channel:
    """The worker's end of the pipe: JSON objects both ways, read without blocking the loop."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self._inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        loop = asyncio.get_running_loop()
        loop.add_reader(conn.fileno(), self._readable)

    def _readable(self) -> None:
        try:
            while self.conn.poll():
                self._inbox.put_nowait(json.loads(self.conn.recv_bytes()))
        except (EOFError, OSError):
            # The coordinator is gone: behave as if told to stop.
            asyncio.get_running_loop().remove_reader(self.conn.fileno())
            self._inbox.put_nowait({"cmd": "stop", "reason": "coordinator went away"})

    def send(self, message: dict[str, Any]) -> None:
        """Send one JSON object to the coordinator (ignored if it has gone)."""
        with contextlib.suppress(OSError, ValueError):
            self.conn.send_bytes(json.dumps(message).encode())

    async def receive(self) -> dict[str, Any]:
        """The next command from the coordinator."""
        return await self._inbox.get()

    def close(self) -> None:
        """Stop watching the pipe."""
        with contextlib.suppress(OSError, ValueError):
            asyncio.get_running_loop().remove_reader(self.conn.fileno())
