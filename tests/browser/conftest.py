"""Browser fixtures: Debian's headless Chromium driven through chromedriver by Selenium
(`chromium`), and a static file server on 127.0.0.1 for the pages under test and the
JavaScript libraries they load (`static_server`). Never a browser download: without
`/usr/bin/chromium` and `/usr/bin/chromedriver` (`make test` installs both) the tests are
skipped with that reason. JavaScript libraries come from the npm registry at pinned versions
(`js/package.json` and its lockfile; `make test` runs `npm ci`)."""

from __future__ import annotations

import shutil
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).parent
# What `npm ci` in js/ installs.
NODE_MODULES = HERE / "js" / "node_modules"
PAGES = HERE / "pages"
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"

_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8"}


@dataclass
class StaticServer:
    """Files served at fixed paths from 127.0.0.1."""

    port: int

    @property
    def origin(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def url(self, path: str) -> str:
        return self.origin + path


def _handler(files: Mapping[str, Path]) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = files.get(self.path.split("?", 1)[0])
            if path is None:
                self.send_error(HTTPStatus.NOT_FOUND)
                return
            body = path.read_bytes()
            self.send_response(HTTPStatus.OK)
            self.send_header("Content-Type", _TYPES.get(path.suffix, "application/octet-stream"))
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


@pytest.fixture
def static_server() -> Iterator[Callable[[Mapping[str, Path]], StaticServer]]:
    """A factory: `static_server({"/page.html": path, ...})` serves exactly those files on
    127.0.0.1 (port 0) until the test ends."""
    servers: list[ThreadingHTTPServer] = []

    def start(files: Mapping[str, Path]) -> StaticServer:
        missing = [str(path) for path in files.values() if not path.is_file()]
        if missing:
            pytest.fail(f"files to serve are missing (`make test` runs npm ci): {missing}")
        server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(dict(files)))
        servers.append(server)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return StaticServer(server.server_address[1])

    try:
        yield start
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()


@pytest.fixture
def chromium() -> Iterator[Any]:
    """Headless Chromium through chromedriver (a Selenium WebDriver); `save_screenshot(path)`
    writes a PNG."""
    for binary in (CHROMIUM, CHROMEDRIVER):
        if shutil.which(binary) is None:
            pytest.skip(
                f"{binary} is not installed (Debian's chromium and chromium-driver; "
                "`make test` installs them)"
            )
    from selenium import webdriver  # noqa: PLC0415
    from selenium.webdriver.chrome.service import Service  # noqa: PLC0415

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in (
        "--headless=new",
        "--no-sandbox",  # as root
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1280,900",
        "--no-first-run",
        "--disable-extensions",
    ):
        options.add_argument(argument)
    driver = webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))
    try:
        driver.set_script_timeout(30)
        yield driver
    finally:
        driver.quit()
