"""The web console's files, served from the package (`sluice/http/console/`, package data: no
CDN, nothing fetched at run time), and the security headers of every answer of the server.

The console is plain HTML, CSS and JavaScript modules, with no build step: `/` is its page,
`/console/NAME` its other files. They are read once, when the server starts; a name that is
not one of them is a 404. Every answer (the API's too) carries a restrictive
Content-Security-Policy (scripts and styles from this server only, no inline script, no
framing), `X-Content-Type-Options: nosniff`, `Referrer-Policy: no-referrer` and
`X-Frame-Options: DENY`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib import resources

from aiohttp import web

__all__ = ["CONTENT_SECURITY_POLICY", "ConsoleFiles", "security_headers"]

CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; object-src 'none'; frame-ancestors 'none'; "
    "base-uri 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
}
_TYPES = {
    ".html": "text/html",
    ".js": "text/javascript",
    ".css": "text/css",
    ".svg": "image/svg+xml",
}
PREFIX = "/console/"


@dataclass(frozen=True)
class _File:
    body: bytes
    content_type: str
    etag: str


class ConsoleFiles:
    """The console's files, read from the package once."""

    def __init__(self) -> None:
        self._files: dict[str, _File] = {}
        folder = resources.files("sluice.http").joinpath("console")
        for entry in folder.iterdir():
            suffix = "." + entry.name.rpartition(".")[2]
            content_type = _TYPES.get(suffix)
            if content_type is None or not entry.is_file():
                continue
            body = entry.read_bytes()
            etag = '"' + hashlib.sha256(body).hexdigest()[:32] + '"'
            self._files[entry.name] = _File(body, content_type, etag)

    def is_open(self, request: web.Request) -> bool:
        """Whether a request asks for a file of the console (answered without credentials:
        the page asks for them itself)."""
        return request.method == "GET" and (request.path == "/" or request.path.startswith(PREFIX))

    def _answer(self, request: web.Request, name: str) -> web.Response:
        found = self._files.get(name)
        if found is None:
            raise web.HTTPNotFound()
        headers = {"ETag": found.etag, "Cache-Control": "no-cache"}
        if request.headers.get("If-None-Match") == found.etag:
            return web.Response(status=304, headers=headers)
        return web.Response(
            body=found.body, content_type=found.content_type, charset="utf-8", headers=headers
        )

    async def index(self, request: web.Request) -> web.Response:
        """The console's page."""
        return self._answer(request, "index.html")

    async def file(self, request: web.Request) -> web.Response:
        """One of its files."""
        return self._answer(request, request.match_info["name"])

    def routes(self) -> list[web.RouteDef]:
        """`/` and `/console/NAME`."""
        return [
            web.get("/", self.index, allow_head=False),
            web.get(PREFIX + "{name}", self.file, allow_head=False),
        ]


async def security_headers(request: web.Request, response: web.StreamResponse) -> None:
    """Add the security headers to an answer (those it set itself stay)."""
    for name, value in SECURITY_HEADERS.items():
        response.headers.setdefault(name, value)
