"""STOMP wire format, writing: frames and header blocks encoded per version.

`encode_frame` turns a command, headers and body into bytes; `encode_headers` and `assemble_frame`
let a caller encode a message's header block once and send it many times. Headers are escaped as
STOMP 1.0, 1.1 or 1.2 requires, except on CONNECT, STOMP and CONNECTED, which are never escaped.
Nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from sluice.errors import LocalProtocolError
from sluice.stomp.frames import (
    BODY_COMMANDS,
    CONTENT_LENGTH_COMMANDS,
    MAX_LENGTH_DIGITS,
    RAW_COMMANDS,
    Command,
    Version,
    preview,
)

__all__ = ["HEARTBEAT_BYTES", "assemble_frame", "encode_frame", "encode_headers", "escape_value"]

HEARTBEAT_BYTES = b"\n"
# Read for every header escaped: on Python 3.11 an enum member read through its class costs
# several times a global read.
_V1_1, _V1_2 = Version.V1_1, Version.V1_2


def escape_value(value: str, version: Version) -> str:
    """Escape a header value for a frame other than CONNECT/CONNECTED.

    1.2 escapes backslash, CR, LF and colon; 1.1 all but CR; 1.0 nothing. Raises
    `LocalProtocolError` for a value the version cannot carry (a line break in 1.0, or a CR at the
    end in 1.0/1.1, which a reader would take for part of a CRLF).
    """
    if version is _V1_2:
        if "\\" in value or "\r" in value or "\n" in value:
            value = (
                value.replace("\\", "\\\\")
                .replace("\r", "\\r")
                .replace("\n", "\\n")
                .replace(":", "\\c")
            )
        elif ":" in value:
            # The common case (message ids, URLs): one replace instead of four.
            value = value.replace(":", "\\c")
        return value
    if value.endswith("\r"):
        raise LocalProtocolError(f"STOMP {version.value} cannot carry a header ending in CR")
    if version is _V1_1:
        if "\\" in value or "\n" in value or ":" in value:
            value = value.replace("\\", "\\\\").replace("\n", "\\n").replace(":", "\\c")
        return value
    if "\n" in value:
        raise LocalProtocolError("STOMP 1.0 cannot carry a line feed in a header")
    return value


def _escape_key(key: str, version: Version) -> str:
    if "\\" in key or "\r" in key or "\n" in key or ":" in key:
        key = key.replace("\\", "\\\\").replace("\n", "\\n").replace(":", "\\c")
        if version is Version.V1_2:
            key = key.replace("\r", "\\r")
    return key


def _encode_text(text: str) -> bytes:
    try:
        return text.encode()
    except UnicodeEncodeError as exc:
        # Lone surrogates, typically from bytes decoded with surrogateescape.
        raise LocalProtocolError(f"header text is not encodable as UTF-8: {exc.reason}") from None


def _check_raw(key: str, value: str, command: Command) -> None:
    """Raise if an unescaped header would not read back the same."""
    if ":" in key or "\n" in key or "\n" in value or value.endswith("\r"):
        raise LocalProtocolError(
            f"header {preview(key)} of {command} cannot be sent unescaped "
            "(colon in key, line feed, or CR at the end)"
        )


def _header_lines(
    items: Iterable[tuple[str, str]], escape: bool, version: Version, command: Command
) -> list[str]:
    lines = [f"{key}:{value}" for key, value in items]
    if not lines:
        return lines
    # Usual case: nothing needs escaping or checking, proven with a few scans over the whole block.
    block = "\n".join(lines)
    if (
        block.count(":") == len(lines)
        and block.count("\n") == len(lines) - 1
        and "\\" not in block
        and "\r" not in block
    ):
        return lines
    if escape:
        # A key may end in CR (the colon follows it); only a value's last CR would be lost.
        return [f"{_escape_key(k, version)}:{escape_value(v, version)}" for k, v in items]
    for key, value in items:
        _check_raw(key, value, command)
    return lines


def encode_headers(
    headers: Mapping[str, str] | Iterable[tuple[str, str]], version: Version
) -> bytes:
    """Encode header lines (`key:value` and LF each), escaped as `version` requires.

    For callers that cache the header block of a message and send it many times (see
    `assemble_frame`). Not for CONNECT/CONNECTED, which are never escaped.
    """
    items = list(headers.items() if isinstance(headers, Mapping) else headers)
    if not items:
        return b""
    lines = _header_lines(items, version.escapes_headers, version, Command.SEND)
    return _encode_text("\n".join(lines) + "\n")


def encode_frame(
    command: Command,
    headers: Mapping[str, str] | Iterable[tuple[str, str]],
    body: bytes = b"",
    version: Version = Version.V1_2,
    *,
    content_length: bool = True,
) -> bytes:
    """Encode one frame.

    Headers are escaped per `version`, except on CONNECT, STOMP and CONNECTED. With
    `content_length` (the default) a `content-length` header is added when the body is not empty
    or the command is SEND, MESSAGE or ERROR, unless `headers` already has one. Raises
    `LocalProtocolError` for a body on a command that may not carry one, a `content-length` that
    does not match the body, or a NUL in a body sent without `content-length`.
    """
    if type(headers) is dict or isinstance(headers, Mapping):
        items: Iterable[tuple[str, str]] = headers.items()
        declared = headers.get("content-length")
    else:
        items = list(headers)
        declared = next((v for k, v in items if k == "content-length"), None)
    if body and command not in BODY_COMMANDS:
        raise LocalProtocolError(f"frame {command} must not have a body")
    escape = version is not Version.V1_0 and command not in RAW_COMMANDS
    lines = _header_lines(items, escape, version, command)
    if declared is not None:
        if not (
            len(declared) <= MAX_LENGTH_DIGITS
            and declared.isascii()
            and declared.isdigit()
            and int(declared) == len(body)
        ):
            raise LocalProtocolError(
                f"content-length {preview(declared)} does not match a body of {len(body)} bytes"
            )
    elif content_length and (body or command in CONTENT_LENGTH_COMMANDS):
        lines.append(f"content-length:{len(body)}")
    elif b"\0" in body:
        raise LocalProtocolError("a body containing NUL needs a content-length header")
    if lines:
        head = f"{command.value}\n" + "\n".join(lines) + "\n\n"
    else:
        head = f"{command.value}\n\n"
    return b"".join((_encode_text(head), body, b"\0"))


def assemble_frame(
    command: Command, header_block: bytes, body: bytes = b"", *, content_length: bool = True
) -> bytes:
    """Build a frame from a header block made by `encode_headers`, plus the body.

    `content-length` is appended as in `encode_frame` unless the block already has one; the block
    is trusted to suit the version in use.
    """
    if body and command not in BODY_COMMANDS:
        raise LocalProtocolError(f"frame {command} must not have a body")
    has_length = header_block.startswith(b"content-length:") or (
        b"\ncontent-length:" in header_block
    )
    parts = [command.value.encode(), b"\n", header_block]
    if not has_length:
        if content_length and (body or command in CONTENT_LENGTH_COMMANDS):
            parts.append(b"content-length:%d\n" % len(body))
        elif b"\0" in body:
            raise LocalProtocolError("a body containing NUL needs a content-length header")
    parts += (b"\n", body, b"\0")
    return b"".join(parts)
