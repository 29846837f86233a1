"""A STOMP peer over aiohttp's client WebSocket, for tests that need exact messages on the wire:
raw text or binary messages out, parsed frames back, and the type of each message received."""

from __future__ import annotations

import asyncio
import ssl
from typing import Any

import aiohttp

from sluice.stomp.codec import FrameParser, StompLimits
from sluice.stomp.frames import Frame, HeartBeat, Version

ALL_SUBPROTOCOLS = ("v10.stomp", "v11.stomp", "v12.stomp")


class WsClosed(Exception):
    """The broker closed the WebSocket; `code` and `reason` are its close frame's."""

    def __init__(self, code: int | None, reason: str) -> None:
        super().__init__(f"WebSocket closed: {code} {reason}")
        self.code = code
        self.reason = reason


class WsStomp:
    """One WebSocket to a broker's `/stomp`."""

    def __init__(self, session: aiohttp.ClientSession, ws: aiohttp.ClientWebSocketResponse):
        self.session = session
        self.ws = ws
        self.parser = FrameParser(StompLimits(), Version.V1_2)
        self.heartbeats = 0
        # The type of every message received: "text" or "binary".
        self.kinds: list[str] = []
        self.close_code: int | None = None
        self.close_reason = ""

    @classmethod
    async def open(
        cls,
        url: str,
        *,
        protocols: tuple[str, ...] = ALL_SUBPROTOCOLS,
        headers: dict[str, str] | None = None,
        ssl_context: ssl.SSLContext | None = None,
        **kwargs: Any,
    ) -> WsStomp:
        session = aiohttp.ClientSession()
        try:
            ws = await session.ws_connect(
                url,
                protocols=protocols,
                headers=headers,
                ssl=ssl_context if ssl_context is not None else True,
                autoping=True,
                **kwargs,
            )
        except BaseException:
            await session.close()
            raise
        return cls(session, ws)

    @property
    def protocol(self) -> str | None:
        """The subprotocol the broker echoed."""
        return self.ws.protocol

    async def send_text(self, text: str) -> None:
        await self.ws.send_str(text)

    async def send_bytes(self, data: bytes) -> None:
        await self.ws.send_bytes(data)

    async def connect(
        self, *, login: str | None = None, passcode: str | None = None, heart_beat: str = "0,0"
    ) -> Frame:
        lines = ["CONNECT", "accept-version:1.2", "host:localhost", f"heart-beat:{heart_beat}"]
        if login is not None:
            lines += [f"login:{login}", f"passcode:{passcode}"]
        await self.send_text("\n".join(lines) + "\n\n\0")
        return await self.frame()

    async def _read(self, timeout: float) -> None:
        msg = await asyncio.wait_for(self.ws.receive(), timeout)
        if msg.type is aiohttp.WSMsgType.TEXT:
            self.kinds.append("text")
            self.parser.feed(msg.data.encode())
        elif msg.type is aiohttp.WSMsgType.BINARY:
            self.kinds.append("binary")
            self.parser.feed(msg.data)
        else:
            # The close frame's code (the client's own `close_code` may say 1006 when the
            # broker drops the connection right after sending it).
            close_frame = msg.type is aiohttp.WSMsgType.CLOSE
            self.close_code = msg.data if close_frame else self.ws.close_code
            self.close_reason = str(msg.extra or "")
            raise WsClosed(self.close_code, self.close_reason)

    async def frame(self, timeout: float = 10.0) -> Frame:
        """The next frame (heart-beats counted and skipped); raises `WsClosed` or a timeout."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            event = self.parser.next_event()
            if isinstance(event, HeartBeat):
                self.heartbeats += 1
                continue
            if event is not None:
                return event
            await self._read(max(0.01, deadline - loop.time()))

    async def heartbeat(self, timeout: float = 10.0) -> None:
        """Wait for the next heart-beat from the broker."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        seen = self.heartbeats
        while self.heartbeats == seen:
            event = self.parser.next_event()
            if isinstance(event, HeartBeat):
                self.heartbeats += 1
            elif event is not None:
                raise AssertionError(f"a frame instead of a heart-beat: {event}")
            else:
                await self._read(max(0.01, deadline - loop.time()))

    async def closed(self, timeout: float = 10.0) -> WsClosed:
        """Frames until the broker closes; the close."""
        while True:
            try:
                await self.frame(timeout)
            except WsClosed as exc:
                return exc

    async def close(self) -> None:
        await self.ws.close()
        await self.session.close()
