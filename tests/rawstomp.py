"""A minimal blocking STOMP peer over a raw socket, for tests that need exact bytes on the wire."""

from __future__ import annotations

import socket
import time

from sluice.stomp.codec import FrameParser, StompLimits
from sluice.stomp.frames import Frame, HeartBeat, Version


class RawStomp:
    """Send literal bytes; read back parsed frames with a deadline."""

    def __init__(
        self,
        port: int,
        *,
        version: Version = Version.V1_2,
        timeout: float = 10.0,
        rcvbuf: int | None = None,
    ):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf is not None:
            # Before connecting: a window shrunk later can stall the sender (silly-window rules).
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(timeout)
        self.sock.connect(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.parser = FrameParser(StompLimits(), version)
        self.timeout = timeout
        self.heartbeats = 0

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def connect(self, version: str = "1.2", extra: str = "") -> Frame:
        self.send(f"CONNECT\naccept-version:{version}\nhost:localhost\n{extra}\n\0".encode())
        frame = self.frame()
        assert frame.command == "CONNECTED", frame
        negotiated = frame.headers.get("version", "1.0")
        self.parser.version = {"1.0": Version.V1_0, "1.1": Version.V1_1}.get(
            negotiated, Version.V1_2
        )
        return frame

    def frame(self, timeout: float | None = None) -> Frame:
        """The next frame (heart-beats are counted and skipped); raises on timeout or EOF."""
        deadline = time.monotonic() + (timeout if timeout is not None else self.timeout)
        while True:
            event = self.parser.next_event()
            if isinstance(event, HeartBeat):
                self.heartbeats += 1
                continue
            if event is not None:
                return event
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("no frame before the deadline")
            self.sock.settimeout(remaining)
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("connection closed by the broker")
            self.parser.feed(data)

    def closed(self, timeout: float | None = None) -> bool:
        """Wait for the broker to close the connection (frames before the close are dropped)."""
        deadline = time.monotonic() + (timeout if timeout is not None else self.timeout)
        while time.monotonic() < deadline:
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                return False
            except ConnectionResetError:
                return True
            if not data:
                return True
            self.parser.feed(data)
        return False

    def close(self) -> None:
        self.sock.close()
