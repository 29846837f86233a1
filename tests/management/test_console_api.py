"""The console's side of the management server, over real HTTP: its files from the package
with the security headers, logins as sessions (the cookie's flags, bounds and expiry, a user
removed by a reload), the CSRF token and the Origin check, `/api/whoami`, and the samples the
charts draw."""

from __future__ import annotations

import base64
import fnmatch
import json
import tomllib
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from http.cookies import SimpleCookie
from pathlib import Path
from typing import Any

import pytest
import stomp

from server.test_auth import PASSWORDS, _write_users
from server.test_tls import Pki
from sluice.auth.identity import Identity
from sluice.config import HttpSettings
from sluice.http.pages import CONTENT_SECURITY_POLICY
from sluice.http.sessions import Sessions
from waiting import wait_until

from .conftest import Managed, start_managed
from .test_auth import ACL
from .test_tls import _https, _secured, _tls

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Answer:
    status: int
    headers: Any
    body: bytes

    @property
    def json(self) -> Any:
        return json.loads(self.body)


def call(
    managed: Managed,
    method: str,
    path: str,
    body: Any = None,
    headers: dict[str, str] | None = None,
) -> Answer:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(
        f"http://127.0.0.1:{managed.server.port}{path}", data=data, method=method
    )
    if data is not None:
        req.add_header("Content-Type", "application/json")
    for name, value in (headers or {}).items():
        req.add_header(name, value)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return Answer(resp.status, resp.headers, resp.read())
    except urllib.error.HTTPError as exc:
        return Answer(exc.code, exc.headers, exc.read())


def log_in(managed: Managed, user: str) -> tuple[dict[str, str], str]:
    """Log in as the console does: the cookie header to send, and the CSRF token."""
    answer = call(managed, "POST", "/api/session", {"login": user, "passcode": PASSWORDS[user]})
    assert answer.status == 200, answer.body
    cookie = SimpleCookie(answer.headers["Set-Cookie"])
    return {"Cookie": f"sluice_session={cookie['sluice_session'].value}"}, answer.json["csrf_token"]


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[Managed]:
    users = tmp_path / "users.toml"
    _write_users(users)
    running = start_managed(
        auth={"users_file": str(users)}, acl=ACL, limits={"login_failure_delay_s": 0}
    )
    try:
        yield running
    finally:
        running.stop()


def test_the_console_is_served_from_the_package_with_security_headers(
    secured: Managed,
) -> None:
    page = call(secured, "GET", "/")
    assert page.status == 200
    assert page.headers["Content-Type"] == "text/html; charset=utf-8"
    assert b'<script type="module" src="/console/app.js">' in page.body
    assert page.headers["Content-Security-Policy"] == CONTENT_SECURITY_POLICY
    assert "script-src 'self'" in CONTENT_SECURITY_POLICY
    assert "frame-ancestors 'none'" in CONTENT_SECURITY_POLICY
    assert page.headers["X-Content-Type-Options"] == "nosniff"
    assert page.headers["Referrer-Policy"] == "no-referrer"
    assert page.headers["X-Frame-Options"] == "DENY"
    script = call(secured, "GET", "/console/app.js")
    assert script.status == 200
    assert script.headers["Content-Type"] == "text/javascript; charset=utf-8"
    again = call(
        secured, "GET", "/console/app.js", headers={"If-None-Match": script.headers["ETag"]}
    )
    assert again.status == 304
    assert call(secured, "GET", "/console/nothing.js").status == 404
    assert call(secured, "GET", "/console/..%2Fapi.py").status == 404
    # The API's answers carry the same headers.
    refused = call(secured, "GET", "/api/overview")
    assert refused.status == 401
    assert refused.headers["Content-Security-Policy"] == CONTENT_SECURITY_POLICY


def test_every_console_file_is_package_data() -> None:
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"
    ]["sluice"]
    folder = ROOT / "src" / "sluice" / "http" / "console"
    files = [f"http/console/{p.name}" for p in folder.iterdir()]
    assert "http/console/index.html" in files
    missing = [f for f in files if not any(fnmatch.fnmatch(f, p) for p in patterns)]
    assert missing == []


def test_login_sets_a_strict_http_only_cookie(secured: Managed) -> None:
    wrong = call(secured, "POST", "/api/session", {"login": "alice", "passcode": "nope"})
    assert wrong.status == 401
    assert wrong.json["error"]["message"] == "access refused: bad login or passcode"
    assert "WWW-Authenticate" not in wrong.headers
    assert secured.broker.stats()["login_failures"] == 1
    assert call(secured, "POST", "/api/session", {"login": "alice"}).status == 400
    answer = call(
        secured, "POST", "/api/session", {"login": "alice", "passcode": PASSWORDS["alice"]}
    )
    assert answer.status == 200
    assert answer.json["user"] == "alice"
    assert answer.json["via"] == "session"
    assert answer.json["broker"] == {"read": True, "write": False, "admin": True}
    set_cookie = answer.headers["Set-Cookie"]
    morsel = SimpleCookie(set_cookie)["sluice_session"]
    assert len(morsel.value) >= 40
    assert morsel["httponly"] is True
    assert morsel["samesite"] == "Strict"
    assert morsel["path"] == "/"
    assert not morsel["secure"]  # plain HTTP here; set over HTTPS
    assert secured.broker.stats()["console_logins"] == 1


def test_a_session_needs_its_csrf_token_to_change_anything(secured: Managed) -> None:
    cookie, token = log_in(secured, "alice")
    assert call(secured, "PUT", "/api/destinations/queue/orders.eu", headers=cookie).status == 403
    wrong = {**cookie, "X-CSRF-Token": "x" * len(token)}
    assert call(secured, "PUT", "/api/destinations/queue/orders.eu", headers=wrong).status == 403
    assert secured.broker.stats()["http_csrf_refused"] == 2
    right = {**cookie, "X-CSRF-Token": token}
    assert call(secured, "PUT", "/api/destinations/queue/orders.eu", headers=right).status == 201
    # Reading needs the cookie only; another session's token is no good.
    assert call(secured, "GET", "/api/overview", headers=cookie).status == 200
    _, other_token = log_in(secured, "alice")
    assert other_token != token
    mixed = {**cookie, "X-CSRF-Token": other_token}
    assert call(secured, "DELETE", "/api/destinations/queue/orders.eu", headers=mixed).status == 403


def test_a_foreign_origin_may_not_change_anything(secured: Managed) -> None:
    port = secured.server.port
    evil = {"Origin": "http://evil.example"}
    login = {"login": "alice", "passcode": PASSWORDS["alice"]}
    assert call(secured, "POST", "/api/session", login, headers=evil).status == 403
    alice = secured.http.as_user("alice", PASSWORDS["alice"])
    basic = {"Authorization": alice_basic()}
    refused = call(secured, "PUT", "/api/destinations/queue/orders.eu", headers={**basic, **evil})
    assert refused.status == 403
    assert refused.json["error"]["message"] == "cross-origin request refused"
    assert secured.broker.stats()["http_cross_origin_refused"] == 2
    # The server's own origin, or none (a client that is not a browser), is fine.
    own = {"Origin": f"http://127.0.0.1:{port}"}
    assert (
        call(secured, "PUT", "/api/destinations/queue/orders.eu", headers={**basic, **own}).status
        == 201
    )
    assert alice.put("/api/destinations/queue/orders.us").status == 201
    # Reading is never refused for its origin (a page elsewhere cannot read the answer).
    assert call(secured, "GET", "/api/overview", headers={**basic, **evil}).status == 200


def alice_basic() -> str:
    return "Basic " + base64.b64encode(f"alice:{PASSWORDS['alice']}".encode()).decode()


def test_whoami_says_what_the_caller_may_do(secured: Managed) -> None:
    bob = secured.http.as_user("bob", PASSWORDS["bob"])
    answer = bob.get("/api/whoami?destination=/queue/orders.eu&destination=/queue/open.x")
    assert answer.status == 200
    assert answer.json == {
        "user": "bob",
        "groups": ["shop"],
        "anonymous": False,
        "via": "credentials",
        "csrf_token": None,
        "broker": {"read": False, "write": False, "admin": False},
        "destinations": {
            "/queue/orders.eu": {"read": False, "write": True, "admin": False},
            "/queue/open.x": {"read": True, "write": True, "admin": True},
        },
    }
    many = "&".join(f"destination=/queue/q{i}" for i in range(101))
    assert bob.get(f"/api/whoami?{many}").status == 400


def test_a_console_request_gets_no_browser_challenge(secured: Managed) -> None:
    plain = call(secured, "GET", "/api/whoami")
    assert plain.status == 401
    assert plain.headers["WWW-Authenticate"].startswith("Basic")
    console = call(secured, "GET", "/api/whoami", headers={"X-Sluice-Console": "1"})
    assert console.status == 401
    assert "WWW-Authenticate" not in console.headers


def test_logout_ends_the_session(secured: Managed) -> None:
    cookie, token = log_in(secured, "alice")
    assert call(secured, "GET", "/api/whoami", headers=cookie).json["csrf_token"] == token
    assert call(secured, "DELETE", "/api/session", headers=cookie).status == 403  # no token
    out = call(secured, "DELETE", "/api/session", headers={**cookie, "X-CSRF-Token": token})
    assert out.status == 200
    assert out.json == {"logged_out": True}
    assert 'sluice_session=""' in out.headers["Set-Cookie"]
    assert call(secured, "GET", "/api/whoami", headers=cookie).status == 401


def test_sessions_are_bounded(tmp_path: Path) -> None:
    users = tmp_path / "users.toml"
    _write_users(users)
    running = start_managed(
        auth={"users_file": str(users)}, http={"console_max_sessions": 2}, acl=ACL
    )
    try:
        first, _ = log_in(running, "alice")
        second, _ = log_in(running, "alice")
        assert call(running, "GET", "/api/whoami", headers=first).status == 200  # used last
        third, _ = log_in(running, "bob")
        assert call(running, "GET", "/api/whoami", headers=second).status == 401
        assert call(running, "GET", "/api/whoami", headers=first).status == 200
        assert call(running, "GET", "/api/whoami", headers=third).status == 200
        assert running.broker.stats()["console_sessions_evicted"] == 1
    finally:
        running.stop()


def test_sessions_expire_idle_and_in_all() -> None:
    now = [0.0]
    counted: list[str] = []
    settings = HttpSettings(console_session_idle_s=10, console_session_max_s=25)
    sessions = Sessions(settings, counted.append, clock=lambda: now[0])
    token, _ = sessions.open(Identity("alice"), "127.0.0.1")
    now[0] = 9.0
    assert sessions.find(token) is not None  # used: idle again from here
    now[0] = 18.0
    assert sessions.find(token) is not None
    now[0] = 26.0  # within the idle time, past the whole life
    assert sessions.find(token) is None
    idle, _ = sessions.open(Identity("bob"), "127.0.0.1")
    now[0] = 36.5
    assert sessions.find(idle) is None
    assert sessions.find("not a token") is None
    assert len(sessions) == 0
    assert counted == ["console_logins", "console_logins"]


def test_a_user_removed_by_a_reload_loses_the_session(secured: Managed, tmp_path: Path) -> None:
    cookie, _ = log_in(secured, "bob")
    assert call(secured, "GET", "/api/whoami", headers=cookie).status == 200
    server = secured.broker.server
    _write_users(Path(str(server.config.auth.users_file)), ("alice", "carol"))
    secured.broker.call(lambda: server.reload_auth(server.config))
    assert call(secured, "GET", "/api/whoami", headers=cookie).status == 401


def test_the_console_can_be_turned_off(tmp_path: Path) -> None:
    running = start_managed(http={"console": False})
    try:
        assert call(running, "GET", "/").status == 404
        assert call(running, "GET", "/console/app.js").status == 404
        assert call(running, "GET", "/api/overview").status == 200
    finally:
        running.stop()


def test_history_keeps_the_samples_for_the_charts(managed: Managed) -> None:
    http = managed.http
    assert http.post("/api/destinations/queue/h/messages", {"body": "x"}).status == 201
    server = managed.server
    managed.broker.call(server.rates.sample)
    managed.broker.call(server.rates.sample)
    history = http.get("/api/overview/history").json
    assert history["interval_s"] == 5.0
    assert len(history["samples"]) == 2
    last = history["samples"][-1]
    assert last["messages_ready"] == 1
    assert last["memory_bytes"] > 0
    assert set(last) == {
        "at_ms",
        "messages_in",
        "delivered",
        "acked",
        "messages_ready",
        "messages_in_flight",
        "memory_bytes",
        "store_bytes",
    }
    assert http.get("/api/store").json["history"] == []


def test_the_console_never_writes_html_from_strings() -> None:
    folder = ROOT / "src" / "sluice" / "http" / "console"
    scripts = sorted(folder.glob("*.js"))
    assert len(scripts) >= 10
    risky = ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "Function(")
    found = [
        f"{path.name}: {word}"
        for path in scripts
        for word in risky
        if word in path.read_text(encoding="utf-8")
    ]
    assert found == []
    # Nor inline script or style in the page (the CSP would refuse them).
    page = (folder / "index.html").read_text(encoding="utf-8")
    assert "<script>" not in page
    assert "style=" not in page


def test_over_https_the_cookie_is_secure(tmp_path: Path) -> None:
    (tmp_path / "pki").mkdir()
    pki = Pki(tmp_path / "pki")
    running = _secured(tmp_path, _tls(pki, "optional"))
    try:
        https = _https(running, pki)
        answer = https.post("/api/session", {"login": "alice", "passcode": PASSWORDS["alice"]})
        assert answer.status == 200
        morsel = SimpleCookie(answer.headers["Set-Cookie"])["sluice_session"]
        assert morsel["secure"] is True
        assert morsel["httponly"] is True
        assert answer.headers["Content-Security-Policy"] == CONTENT_SECURITY_POLICY
    finally:
        running.stop()


def test_a_browser_must_reach_a_loopback_server_by_a_loopback_name(managed: Managed) -> None:
    port = managed.server.port
    browser = {"Sec-Fetch-Site": "same-origin"}
    rebound = {**browser, "Host": f"evil.example:{port}"}
    refused = call(managed, "GET", "/api/overview", headers=rebound)
    assert refused.status == 403
    assert "loopback" in refused.json["error"]["message"]
    assert (
        call(managed, "POST", "/api/session", {"login": "a", "passcode": "b"}, rebound).status
        == 403
    )
    assert managed.broker.stats()["http_host_refused"] == 2
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", "localhost"):
        assert (
            call(managed, "GET", "/api/overview", headers={**browser, "Host": host}).status == 200
        )
    # A client that is not a browser (no Sec-Fetch-Site) may name the host it likes.
    assert call(managed, "GET", "/api/overview", headers={"Host": "broker.example"}).status == 200


def test_console_logins_go_through_the_throttle(tmp_path: Path) -> None:
    users = tmp_path / "users.toml"
    _write_users(users)
    running = start_managed(
        auth={"users_file": str(users)},
        limits={
            "login_failure_delay_s": 0,
            "login_lockout_failures": 3,
            "login_lockout_window_s": 60,
        },
    )
    try:
        wrong = {"login": "alice", "passcode": "guess"}
        for _ in range(3):
            assert call(running, "POST", "/api/session", wrong).status == 401
        right = {"login": "alice", "passcode": PASSWORDS["alice"]}
        locked = call(running, "POST", "/api/session", right)
        assert locked.status == 401
        assert "too many failed logins" in locked.json["error"]["message"]
        stats = running.broker.stats()
        assert stats["login_failures"] == 3
        assert stats["login_refused_locked_out"] == 1
        # Basic auth meets the same lockout: one throttle for every way in.
        assert running.http.as_user("alice", PASSWORDS["alice"]).get("/api/whoami").status == 401
    finally:
        running.stop()


def test_the_overview_sums_what_the_destinations_show(managed: Managed) -> None:
    http = managed.http
    for i in range(5):
        assert http.post("/api/destinations/queue/a/messages", {"body": f"a{i}"}).status == 201
    assert http.post("/api/destinations/queue/b/messages", {"body": "b"}).status == 201
    assert http.put("/api/destinations/topic/t").status == 201
    consumer = stomp.Connection12([("127.0.0.1", managed.broker.port)])
    consumer.connect(wait=True)
    try:
        consumer.subscribe("/queue/a", id="1", ack="client", headers={"activemq.prefetchSize": "2"})
        wait_until(
            lambda: http.get("/api/destinations/queue/a").json["messages_in_flight"] == 2,
            what="two messages in flight",
        )
        items = http.get("/api/destinations").json["items"]
        overview = http.get("/api/overview").json["destinations"]
        assert overview == {
            "queues": 2,
            "topics": 1,
            "messages_ready": sum(d["messages_ready"] for d in items),
            "messages_in_flight": sum(d["messages_in_flight"] for d in items),
        }
        assert (overview["messages_ready"], overview["messages_in_flight"]) == (4, 2)
    finally:
        consumer.disconnect()
