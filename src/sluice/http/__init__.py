"""The management HTTP server, on the broker's own event loop: the JSON API under `/api/`
(its OpenAPI document at `/api/openapi.json`), Prometheus metrics at `/metrics`, the
health checks `/healthz` and `/readyz` (DESIGN.md section 11, docs/operations.md), and the web
console at `/` (docs/console.md).

It checks who calls with the same users, throttle and `[[acl]]` rules as STOMP, asks the core
for what it shows (`sluice.core.views`) and for what it changes, and never reaches into the
objects behind them. It sits beside `sluice.server`: it knows the server only through the
`Managed` protocol (`context.py`), which the application hands it.
"""

from sluice.http.app import ManagementServer
from sluice.http.context import Managed

__all__ = ["Managed", "ManagementServer"]
