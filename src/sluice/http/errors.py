"""API errors: an HTTP status and a stable code, answered as
`{"error": {"code": "...", "message": "..."}}`. Bad input is a 4xx; a 500 means a bug."""

from __future__ import annotations

import enum
from typing import Any

from aiohttp import web

__all__ = ["ApiError", "ErrorCode", "error_response"]


class ErrorCode(enum.Enum):
    """The codes clients may rely on, with their HTTP status."""

    BAD_REQUEST = ("bad_request", 400)
    INVALID_DESTINATION = ("invalid_destination", 400)
    INVALID_SELECTOR = ("invalid_selector", 400)
    INVALID_DEFINITIONS = ("invalid_definitions", 400)
    UNAUTHORIZED = ("unauthorized", 401)
    FORBIDDEN = ("forbidden", 403)
    NOT_FOUND = ("not_found", 404)
    DESTINATION_NOT_FOUND = ("destination_not_found", 404)
    CONNECTION_NOT_FOUND = ("connection_not_found", 404)
    SUBSCRIPTION_NOT_FOUND = ("subscription_not_found", 404)
    MESSAGE_NOT_FOUND = ("message_not_found", 404)
    STREAM_NOT_FOUND = ("stream_not_found", 404)
    METHOD_NOT_ALLOWED = ("method_not_allowed", 405)
    NOT_A_QUEUE = ("not_a_queue", 409)
    DESTINATION_IN_USE = ("destination_in_use", 409)
    SUBSCRIPTION_IN_USE = ("subscription_in_use", 409)
    STREAM_INCOMPLETE = ("stream_incomplete", 409)
    PAYLOAD_TOO_LARGE = ("payload_too_large", 413)
    LIMIT_EXCEEDED = ("limit_exceeded", 409)
    INTERNAL_ERROR = ("internal_error", 500)
    UNAVAILABLE = ("unavailable", 503)

    @property
    def code(self) -> str:
        """The code as it appears in the JSON."""
        return self.value[0]

    @property
    def status(self) -> int:
        """The HTTP status it is answered with."""
        return self.value[1]


class ApiError(Exception):
    """A request the API refuses; `message` is fit for the client."""

    def __init__(
        self,
        code: ErrorCode,
        message: str,
        headers: dict[str, str] | None = None,
        problems: list[str] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.headers = headers or {}
        # Each thing wrong with the request, when there are several (`"problems"` in the JSON).
        self.problems = problems


def error_response(
    code: ErrorCode,
    message: str,
    headers: dict[str, str] | None = None,
    problems: list[str] | None = None,
) -> web.Response:
    """The JSON answer of an error."""
    error: dict[str, Any] = {"code": code.code, "message": message}
    if problems is not None:
        error["problems"] = problems
    return web.json_response({"error": error}, status=code.status, headers=headers)
