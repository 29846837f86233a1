"""A broker with its management server on the broker's own loop (port 0), and a small HTTP
client over the standard library, so the tests speak real HTTP to a real broker."""

from __future__ import annotations

import asyncio
import base64
import json
import ssl
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from conftest import RunningBroker, start_broker
from sluice.http import ManagementServer


@dataclass
class Reply:
    """An HTTP answer: its status, headers and body (parsed when it is JSON)."""

    status: int
    headers: dict[str, str]
    text: str

    @property
    def json(self) -> Any:
        return json.loads(self.text)


class Http:
    """Requests to one management server, with basic auth when given a user; over HTTPS with
    a client `context` (which may hold a client certificate)."""

    def __init__(
        self,
        port: int,
        user: str | None = None,
        password: str | None = None,
        context: ssl.SSLContext | None = None,
    ) -> None:
        self.port = port
        self.base = f"{'https' if context else 'http'}://127.0.0.1:{port}"
        self.user = user
        self.password = password
        self.context = context

    def as_user(self, user: str, password: str) -> Http:
        return Http(self.port, user, password, self.context)

    def with_context(self, context: ssl.SSLContext) -> Http:
        """The same server over HTTPS with this client context."""
        return Http(self.port, self.user, self.password, context)

    def request(self, method: str, path: str, body: Any = None) -> Reply:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.base + path, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        if self.user is not None:
            token = base64.b64encode(f"{self.user}:{self.password}".encode()).decode()
            req.add_header("Authorization", f"Basic {token}")
        try:
            with urllib.request.urlopen(req, timeout=30, context=self.context) as resp:
                return Reply(resp.status, dict(resp.headers), resp.read().decode())
        except urllib.error.HTTPError as exc:
            return Reply(exc.code, dict(exc.headers), exc.read().decode())

    def get(self, path: str) -> Reply:
        return self.request("GET", path)

    def get_bytes(self, path: str) -> tuple[int, dict[str, str], bytes]:
        """A GET whose answer is bytes (a download): status, headers, body."""
        req = urllib.request.Request(self.base + path)
        if self.user is not None:
            token = base64.b64encode(f"{self.user}:{self.password}".encode()).decode()
            req.add_header("Authorization", f"Basic {token}")
        try:
            with urllib.request.urlopen(req, timeout=30, context=self.context) as resp:
                return resp.status, dict(resp.headers), resp.read()
        except urllib.error.HTTPError as exc:
            return exc.code, dict(exc.headers), exc.read()

    def put(self, path: str) -> Reply:
        return self.request("PUT", path)

    def delete(self, path: str) -> Reply:
        return self.request("DELETE", path)

    def post(self, path: str, body: Any) -> Reply:
        return self.request("POST", path, body)


@dataclass
class Managed:
    """A running broker and its management server."""

    broker: RunningBroker
    server: ManagementServer
    http: Http

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.server.stop(), self.broker.loop).result(30)
        self.broker.stop()


def start_managed(**overrides: Any) -> Managed:
    """`start_broker(**overrides)`, then a management server on its loop (port 0)."""
    overrides.setdefault("http", {})
    overrides["http"] = {"port": 0, **overrides["http"]}
    running = start_broker(**overrides)

    async def start() -> ManagementServer:
        server = ManagementServer(running.server)
        await server.start()
        return server

    try:
        server = asyncio.run_coroutine_threadsafe(start(), running.loop).result(30)
    except BaseException:
        running.stop()
        raise
    return Managed(running, server, Http(server.port))


@pytest.fixture
def managed() -> Iterator[Managed]:
    """A broker on the memory store with its management server."""
    running = start_managed()
    try:
        yield running
    finally:
        running.stop()
