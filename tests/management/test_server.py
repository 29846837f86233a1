"""The management server itself: started on the broker's loop, health and readiness, errors
as JSON with stable codes (never a 500 for bad input), and the OpenAPI document kept honest:
every route is in it and everything in it is a route."""

from __future__ import annotations

import asyncio
import json

import pytest

from conftest import start_broker
from sluice.errors import SluiceError
from sluice.http import ManagementServer
from sluice.http.app import openapi_document

from .conftest import Managed


def test_healthz_and_readyz(managed: Managed) -> None:
    health = managed.http.get("/healthz")
    assert health.status == 200
    assert health.json == {"status": "ok"}
    ready = managed.http.get("/readyz")
    assert ready.status == 200
    assert ready.json == {"status": "ready"}


def test_readyz_says_why_not_ready(managed: Managed) -> None:
    def fail_store() -> None:
        managed.broker.server.broker.store_failed = True
        managed.broker.server.broker.store_failure = "journal sync failed: Input/output error"

    managed.broker.call(fail_store)
    ready = managed.http.get("/readyz")
    assert ready.status == 503
    assert ready.json["status"] == "not_ready"
    assert any("Input/output error" in reason for reason in ready.json["reasons"])
    # Alive all the same.
    assert managed.http.get("/healthz").status == 200


def test_errors_are_json_with_codes(managed: Managed) -> None:
    cases = [
        ("GET", "/nothing/here", 404, "not_found"),
        ("POST", "/api/overview", 405, "method_not_allowed"),
        ("GET", "/api/destinations/queue/absent", 404, "destination_not_found"),
        ("GET", "/api/destinations/exchange/x", 400, "invalid_destination"),
        ("GET", "/api/destinations?limit=0", 400, "bad_request"),
        ("GET", "/api/destinations?limit=abc", 400, "bad_request"),
        ("GET", "/api/destinations?sort=colour", 400, "bad_request"),
        ("GET", "/api/destinations?order=up", 400, "bad_request"),
        ("GET", "/api/destinations?kind=exchange", 400, "bad_request"),
        ("DELETE", "/api/connections/abc", 400, "bad_request"),
        ("DELETE", "/api/connections/999999", 404, "connection_not_found"),
        ("DELETE", "/api/subscriptions/t/c/n", 404, "subscription_not_found"),
        ("PUT", "/api/destinations/topic/a.*", 400, "invalid_destination"),
        ("DELETE", "/api/destinations/queue/absent/messages", 404, "destination_not_found"),
    ]
    for method, path, status, code in cases:
        reply = managed.http.request(method, path)
        assert reply.status == status, (method, path, reply.text)
        assert reply.json["error"]["code"] == code, (method, path, reply.text)
        assert reply.json["error"]["message"]


def test_a_body_too_large_is_413(managed: Managed) -> None:
    reply = managed.http.request("PUT", "/api/destinations/queue/big", "x" * 100_000)
    assert reply.status == 413
    assert reply.json["error"]["code"] == "payload_too_large"


def test_openapi_lists_every_route_and_nothing_else(managed: Managed) -> None:
    served = managed.http.get("/api/openapi.json")
    assert served.status == 200
    document = served.json
    assert document["openapi"].startswith("3.")
    assert document == json.loads(json.dumps(openapi_document()))
    documented = {
        (method.upper(), path)
        for path, item in document["paths"].items()
        for method in item
        if method in ("get", "put", "post", "delete", "patch")
    }
    routes = {
        (route.method, route.resource.canonical)
        for route in managed.server.app.router.routes()
        if route.resource is not None
    }
    assert documented == routes


def test_the_port_taken_is_a_clear_error(managed: Managed) -> None:
    other = start_broker(http={"port": managed.server.port})
    try:

        async def start() -> None:
            await ManagementServer(other.server).start()

        with pytest.raises(SluiceError, match=r"cannot listen for HTTP on 127\.0\.0\.1:\d+"):
            asyncio.run_coroutine_threadsafe(start(), other.loop).result(30)
    finally:
        other.stop()
