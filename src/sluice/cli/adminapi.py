"""The management API's client under `sluice admin`: requests over HTTP(S) with the standard
library, answers as JSON (`AdminApi.call`), and downloads written out as they come, a block at
a time (`AdminApi.download`), checked against their `Content-Length` and, for a stream, the
SHA-256 the broker gives."""

from __future__ import annotations

import base64
import hashlib
import http.client
import json
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, BinaryIO, TypeVar

from sluice.cli.common import UsageError
from sluice.client.tls import client_context
from sluice.errors import SluiceError, reason_of

__all__ = ["AdminApi", "AdminError", "Downloaded", "destination_path"]

TIMEOUT_S = 60.0
# Items asked for per page when listing everything.
_PAGE = 1000
# A download is read and written this much at a time.
DOWNLOAD_BLOCK_BYTES = 256 * 1024


T = TypeVar("T")


class AdminError(SluiceError):
    """The management API refused a request, or could not be reached; the message says why."""


@dataclass(frozen=True)
class Downloaded:
    """What a download wrote: its length, its SHA-256, the answer's headers."""

    length: int
    sha256: str
    headers: dict[str, str]


class AdminApi:
    """Requests to one management server."""

    def __init__(
        self,
        url: str,
        user: str | None,
        password: str | None,
        tls: dict[str, str | None] | None = None,
    ) -> None:
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise UsageError(f"--url must be http://HOST:PORT or https://HOST:PORT, got {url!r}")
        self.base = url.rstrip("/")
        tls = tls or {}
        self._context: ssl.SSLContext | None = None
        if parsed.scheme == "https":
            self._context = client_context(**tls)
        elif any(value is not None for value in tls.values()):
            raise UsageError("--ca, --cert and --key are for an https:// URL")
        self._auth = None
        if user is not None:
            token = base64.b64encode(f"{user}:{password or ''}".encode()).decode()
            self._auth = f"Basic {token}"

    def call(self, method: str, path: str, body: Any = None) -> Any:
        """The JSON answer of a request (with `body` as JSON); raises `AdminError` with the
        API's message."""
        data = json.dumps(body).encode() if body is not None else None
        return self._request(method, path, data, lambda reply: json.loads(reply.read()))

    def download(self, path: str, sink: BinaryIO) -> Downloaded:
        """GET a body and write it to `sink` a block at a time; `AdminError` if it comes short
        of its `Content-Length` (the broker cut it: the queue changed under it)."""

        def copy(reply: http.client.HTTPResponse) -> Downloaded:
            expected = reply.length
            digest = hashlib.sha256()
            received = 0
            while block := reply.read(DOWNLOAD_BLOCK_BYTES):
                try:
                    sink.write(block)
                except OSError as exc:
                    raise AdminError(f"cannot write the download: {exc.strerror or exc}") from None
                digest.update(block)
                received += len(block)
            if expected is not None and received != expected:
                raise AdminError(
                    f"the download from {self.base} was cut short after {received} of "
                    f"{expected} bytes; see the broker's log"
                )
            return Downloaded(received, digest.hexdigest(), dict(reply.headers))

        return self._request("GET", path, None, copy)

    def _request(
        self,
        method: str,
        path: str,
        data: bytes | None,
        consume: Callable[[http.client.HTTPResponse], T],
    ) -> T:
        # The scheme was checked to be http(s) in __init__.
        request = urllib.request.Request(self.base + path, data=data, method=method)  # noqa: S310
        if data is not None:
            request.add_header("Content-Type", "application/json")
        if self._auth is not None:
            request.add_header("Authorization", self._auth)
        try:
            with urllib.request.urlopen(  # noqa: S310
                request, timeout=TIMEOUT_S, context=self._context
            ) as reply:
                return consume(reply)
        except urllib.error.HTTPError as exc:
            raise AdminError(_error_text(exc)) from None
        except urllib.error.URLError as exc:
            cause = exc.reason
            reason = reason_of(cause) if isinstance(cause, BaseException) else str(cause)
            raise AdminError(f"cannot reach {self.base}: {reason}") from None
        except http.client.RemoteDisconnected:
            why = " (over TLS: the server may have refused the client certificate)"
            raise AdminError(
                f"{self.base} closed the connection without an answer"
                + (why if self._context is not None else "")
            ) from None
        except ssl.SSLError as exc:
            # TLS 1.3: a server that refuses the client's certificate says so after the
            # handshake, when the answer is read.
            raise AdminError(f"TLS with {self.base} failed: {reason_of(exc)}") from None
        except (OSError, ValueError, http.client.HTTPException) as exc:
            raise AdminError(f"bad answer from {self.base}: {exc}") from None

    def all_items(self, path: str) -> list[dict[str, Any]]:
        """Every item of a paged list."""
        items: list[dict[str, Any]] = []
        while True:
            page = self.call("GET", f"{path}?offset={len(items)}&limit={_PAGE}")
            items.extend(page["items"])
            if not page["items"] or len(items) >= page["total"]:
                return items


def _error_text(exc: urllib.error.HTTPError) -> str:
    try:
        error = json.loads(exc.read())["error"]
        return f"{error['message']} ({error['code']}, HTTP {exc.code})"
    except (ValueError, KeyError, TypeError, OSError):
        return f"HTTP {exc.code} {exc.reason}"


def destination_path(name: str) -> str:
    """The API's path of a destination named `/queue/NAME` or `/topic/NAME`."""
    for kind in ("queue", "topic"):
        prefix = f"/{kind}/"
        if name.startswith(prefix) and len(name) > len(prefix):
            return f"/api/destinations/{kind}/" + urllib.parse.quote(name[len(prefix) :], safe="")
    raise UsageError(f"a destination is /queue/NAME or /topic/NAME, got {name!r}")
