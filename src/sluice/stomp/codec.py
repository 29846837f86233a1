"""STOMP wire format, reading: an incremental frame parser (the encoder is `encoding`).

`FrameParser` takes bytes as they arrive and hands out `Frame` and `HeartBeat` events. It follows
STOMP 1.0, 1.1 and 1.2 (header escaping differs per version, and CONNECT/CONNECTED are never
escaped). Nothing here does I/O.

The parser is the broker's hot path. It keeps one bytearray with a read offset (consumed bytes are
dropped once per `feed`, not once per frame), searches with `bytearray.find`, and remembers where a
search stopped so that a frame arriving in many small pieces is not scanned again from its start.
A body is copied once, out of a memoryview of the buffer (a bytearray slice would copy it twice:
into the slice, then into the `bytes`); the view is released before `feed` resizes the buffer.
A large body announced by `content-length` that has not all arrived (`large_body_bytes`, 64 KiB by
default) leaves the buffer: the chunks fed from then on are kept as they are (copied only if they
are not `bytes`) and joined once when the body is complete, instead of growing the buffer read by
read and copying the body out of it.
It never holds more than `max_frame_bytes` of a partial frame (plus the chunk just fed): an oversize
frame, header block or announced `content-length` is rejected as soon as it is known.

A frame refused once its header lines are known names its `receipt` header in the error
(`RemoteProtocolError.receipt_id`), when that header can be read, for the ERROR's `receipt-id`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sluice.errors import FrameLimitExceeded, RemoteProtocolError
from sluice.stomp.frames import (
    BODY_COMMANDS,
    MAX_LENGTH_DIGITS,
    RAW_COMMANDS,
    Command,
    Frame,
    HeartBeat,
    Version,
    preview,
)

__all__ = ["LARGE_BODY_BYTES", "FrameParser", "StompLimits"]

_KiB = 1024
_MiB = 1024 * _KiB
# A body at least this large that arrives in pieces is gathered in a list (see the module doc).
LARGE_BODY_BYTES = 64 * _KiB

# A consumed buffer larger than this is replaced, not cleared, so its memory goes back at once.
_SHRINK_ABOVE = 64 * _KiB
# Pieces of a large body smaller than this are gathered into one array (see `_feed_part`).
_SMALL_PART = 16 * _KiB
_LF = 10
_CR = 13
_COMMANDS: dict[str, Command] = {c.value: c for c in Command}
_UNESCAPES: dict[Version, dict[str, str] | None] = {
    Version.V1_0: None,
    Version.V1_1: {"n": "\n", "c": ":", "\\": "\\"},
    Version.V1_2: {"r": "\r", "n": "\n", "c": ":", "\\": "\\"},
}
_HEARTBEAT = HeartBeat()

# Setting the slots through their descriptors builds a Frame in half the time of the frozen
# dataclass __init__ (which goes through object.__setattr__ per field); the result is identical.
_new_object = object.__new__
_frame_slots = vars(Frame)
_set_command: Callable[[Frame, Command], None] = _frame_slots["command"].__set__
_set_headers: Callable[[Frame, dict[str, str]], None] = _frame_slots["headers"].__set__
_set_body: Callable[[Frame, bytes], None] = _frame_slots["body"].__set__


def _make_frame(command: Command, headers: dict[str, str], body: bytes) -> Frame:
    frame: Frame = _new_object(Frame)
    _set_command(frame, command)
    _set_headers(frame, headers)
    _set_body(frame, body)
    return frame


@dataclass(frozen=True)
class StompLimits:
    """Bounds on one inbound frame.

    `max_frame_bytes` counts the whole frame, from the first byte of the command through the NUL
    terminator. `max_header_bytes` counts the command line and the header lines with their line
    ends, but not the blank line that closes them. `max_headers` counts header lines, repeats
    included. `frame_limit_name` is the setting an oversize frame's error names (the broker
    applies a smaller frame bound before a connection is CONNECTED, under its own name).
    """

    max_frame_bytes: int = 64 * _MiB
    max_header_bytes: int = 64 * _KiB
    max_headers: int = 1000
    frame_limit_name: str = "max_frame_bytes"


def _unescape(text: str, table: dict[str, str], command: Command) -> str:
    if "\\" not in text:
        return text
    out: list[str] = []
    start = 0
    find = text.find
    while True:
        index = find("\\", start)
        if index < 0:
            out.append(text[start:])
            return "".join(out)
        out.append(text[start:index])
        code = text[index + 1 : index + 2]
        replacement = table.get(code)
        if replacement is None:
            what = f"undefined escape sequence \\{code}" if code else "incomplete escape sequence"
            raise RemoteProtocolError(f"{what} in a header of the {command} frame")
        out.append(replacement)
        start = index + 2


def _receipt_hint(lines: list[str], table: dict[str, str] | None, command: Command) -> str | None:
    """The `receipt` header among a refused frame's header lines, or None if it cannot be read."""
    for line in lines[1:]:
        key, sep, value = line.partition(":")
        if sep and key == "receipt":  # the first of repeated headers wins
            if table is None or command in RAW_COMMANDS:
                return value
            try:
                return _unescape(value, table, command)
            except RemoteProtocolError:
                return None
    return None


class FrameParser:
    """Incremental STOMP frame parser: `feed` bytes, then call `next_event` until it returns None.

    `version` selects the header escaping rules and may be changed once the version is negotiated.
    Errors raise `RemoteProtocolError` (limits raise its subclass `FrameLimitExceeded`); after an
    error the parser raises the same error on every call.

    Memory bound: if the caller drains `next_event` after every `feed`, the buffer never holds more
    than `limits.max_frame_bytes` plus the size of the chunk fed last.
    """

    __slots__ = (
        "_body_length",
        "_body_offset",
        "_buf",
        "_command",
        "_error",
        "_headers",
        "_large_body_bytes",
        "_line_checked",
        "_parts",
        "_parts_bytes",
        "_pos",
        "_scan",
        "_unescapes",
        "_version",
        "_view",
        "limits",
    )

    def __init__(
        self,
        limits: StompLimits,
        version: Version = Version.V1_2,
        *,
        large_body_bytes: int = LARGE_BODY_BYTES,
    ) -> None:
        self.limits = limits
        self._large_body_bytes = max(1, large_body_bytes)
        # The pieces of a large body still arriving (None otherwise), and their total size.
        self._parts: list[bytes | bytearray] | None = None
        self._parts_bytes = 0
        self._version = version
        self._unescapes = _UNESCAPES[version]
        self._buf = bytearray()
        # Start of the frame (or heart-beat) being parsed; bytes before it are consumed.
        self._pos = 0
        # Where the next search resumes, relative to _pos (blank line, then NUL).
        self._scan = 0
        # Set once the header block of the current frame has been parsed.
        self._command: Command | None = None
        self._headers: dict[str, str] = {}
        self._body_offset = 0
        self._body_length = -1
        # Whether the command line of the current frame has been seen and found valid.
        self._line_checked = False
        self._error: RemoteProtocolError | None = None
        # A view of _buf for copying bodies out, made when first needed after each `feed`.
        self._view: memoryview | None = None

    @property
    def version(self) -> Version:
        """The STOMP version whose escaping rules apply to the frames still to be parsed."""
        return self._version

    @version.setter
    def version(self, version: Version) -> None:
        self._version = version
        self._unescapes = _UNESCAPES[version]

    @property
    def buffered_bytes(self) -> int:
        """Bytes received but not yet returned as events."""
        buffered = len(self._buf) - self._pos
        if self._parts is not None:
            buffered += self._body_offset + self._parts_bytes
        return buffered

    def release(self) -> None:
        """Drop every byte held (the connection is gone): the buffer, its view, a large body's
        pieces. Fed again, the parser starts from nothing."""
        view = self._view
        if view is not None:
            view.release()
            self._view = None
        self._buf = bytearray()
        self._pos = 0
        self._scan = 0
        self._parts = None
        self._parts_bytes = 0
        self._command = None
        self._headers = {}
        self._line_checked = False

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        """Append received bytes. Parsing happens in `next_event`."""
        if self._parts is not None:
            rest = self._feed_part(data)
            if rest is None:
                return
            data = rest
        buf = self._buf
        view = self._view
        if view is not None:
            # A bytearray with a view exported cannot be resized.
            view.release()
            self._view = None
        if self._pos:
            # One compaction per feed keeps per-frame work free of buffer moves.
            del buf[: self._pos]
            self._pos = 0
        buf += data

    def _drop_consumed(self, buf: bytearray) -> None:
        view = self._view
        if view is not None:
            view.release()
            self._view = None
        if len(buf) > _SHRINK_ABOVE:
            # A new array: the old one's allocation goes back to the allocator at once.
            self._buf = bytearray()
        else:
            buf.clear()
        self._pos = 0

    def _feed_part(self, data: bytes | bytearray | memoryview) -> memoryview | None:
        """Take what a large body still lacks from `data`; return the rest, if any."""
        parts = self._parts
        assert parts is not None
        need = self._body_length - self._parts_bytes
        size = len(data)
        if size <= need:
            if size < _SMALL_PART:
                # Small pieces (a peer trickling its body) go into one growing array: a `bytes`
                # object per piece would cost more than the bytes themselves.
                last = parts[-1] if parts else None
                if type(last) is bytearray and len(last) < _SMALL_PART:
                    last += data
                else:
                    parts.append(bytearray(data))
            else:
                # Chunks handed in as bytes are immutable: keep them, copy nothing yet.
                parts.append(data if type(data) is bytes else bytes(data))
            self._parts_bytes += size
            return None
        view = memoryview(data)
        if need:
            parts.append(view[:need].tobytes())
            self._parts_bytes += need
        return view[need:]

    def next_event(self) -> Frame | HeartBeat | None:
        """Return the next complete frame or heart-beat, or None if more bytes are needed."""
        if self._error is not None:
            raise self._error.with_traceback(None)
        try:
            return self._next_event()
        except RemoteProtocolError as exc:
            self._error = exc
            raise

    def _next_event(self) -> Frame | HeartBeat | None:
        """The next heart-beat or whole frame from the buffer, or None until more bytes come.
        Inline for the same reason as `_parse_headers`: it runs once per frame."""
        buf = self._buf
        pos = self._pos
        end = len(buf)
        if pos >= end:
            if pos:
                # All consumed: give the memory back now, not at the next feed (a peer that
                # goes quiet after a large frame would otherwise keep its buffer).
                self._drop_consumed(buf)
            return None
        command = self._command
        if command is None:
            first = buf[pos]
            if first in (_LF, _CR):
                return self._end_of_lines(buf, pos, end)
            if not self._parse_headers(buf, pos, end):
                return None
            command = self._command
            assert command is not None
        elif self._parts is not None:
            return self._large_body(buf, pos, end, command)
        body_start = pos + self._body_offset
        length = self._body_length
        if length >= 0:
            nul = body_start + length
            if nul >= end:
                if length >= self._large_body_bytes:
                    self._start_large_body(buf, body_start, end)
                return None
            if buf[nul] != 0:
                raise self._refuse(
                    RemoteProtocolError(
                        f"{command} frame is not terminated by NUL after its content-length octets"
                    )
                )
        elif command in BODY_COMMANDS:
            limit = pos + self.limits.max_frame_bytes
            nul = buf.find(0, pos + self._scan, limit)
            if nul < 0:
                if end >= limit:
                    raise self._refuse(
                        FrameLimitExceeded(
                            self.limits.frame_limit_name,
                            self.limits.max_frame_bytes,
                            f"{command} frame without NUL within the limit",
                        )
                    )
                self._scan = end - pos
                return None
        else:
            # A frame that may not carry a body must have its NUL right after the blank line.
            if body_start >= end:
                return None
            if buf[body_start] != 0:
                raise self._refuse(RemoteProtocolError(f"frame {command} must not have a body"))
            nul = body_start
        if nul > body_start:
            view = self._view
            if view is None:
                view = self._view = memoryview(buf)
            body = view[body_start:nul].tobytes()
        else:
            body = b""
        frame = _make_frame(command, self._headers, body)
        self._pos = nul + 1
        self._scan = 0
        # _headers, _body_offset and _body_length are set again before their next use.
        self._command = None
        self._line_checked = False
        return frame

    def _start_large_body(self, buf: bytearray, body_start: int, end: int) -> None:
        """Move the part of a large body that has arrived out of the buffer."""
        parts: list[bytes | bytearray] = []
        if end > body_start:
            view = self._view
            if view is None:
                view = self._view = memoryview(buf)
            parts.append(view[body_start:end].tobytes())
        self._parts = parts
        self._parts_bytes = end - body_start
        # The header block is parsed and the body gone: nothing buffered belongs to this frame.
        self._pos = end

    def _large_body(self, buf: bytearray, pos: int, end: int, command: Command) -> Frame | None:
        """The frame of a large body once all of it and its NUL have arrived."""
        parts = self._parts
        assert parts is not None
        if self._parts_bytes < self._body_length or pos >= end:
            return None
        if buf[pos] != 0:
            raise self._refuse(
                RemoteProtocolError(
                    f"{command} frame is not terminated by NUL after its content-length octets"
                )
            )
        first = parts[0] if len(parts) == 1 else None
        body = first if type(first) is bytes else b"".join(parts)
        self._parts = None
        self._parts_bytes = 0
        frame = _make_frame(command, self._headers, body)
        self._pos = pos + 1
        self._scan = 0
        self._command = None
        self._line_checked = False
        return frame

    def _end_of_lines(self, buf: bytearray, pos: int, end: int) -> HeartBeat | None:
        """Consume the EOLs at a frame boundary as one heart-beat."""
        index = pos
        while index < end:
            byte = buf[index]
            if byte == _LF:
                index += 1
            elif byte == _CR:
                if index + 1 >= end:
                    break
                if buf[index + 1] != _LF:
                    raise RemoteProtocolError("CR not followed by LF between frames")
                index += 2
            else:
                break
        if index == pos:
            return None
        self._pos = index
        return _HEARTBEAT

    def _parse_headers(self, buf: bytearray, pos: int, end: int) -> bool:
        """Find and parse the command line and headers; False if the blank line has not come.

        Long on purpose: it runs once per frame on the hot path, and every check is inline
        (no helper calls) so that parsing stays cheap; each block is commented."""
        limits = self.limits
        max_header_bytes = limits.max_header_bytes
        # The blank line is LF LF or LF CR LF; any that is within the limit lies in this window.
        window_end = pos + max_header_bytes + 2
        search_end = end if end < window_end else window_end
        start = pos + self._scan
        index = buf.find(b"\n\n", start, search_end)
        crlf = buf.find(b"\n\r\n", start, index + 2 if index >= 0 else search_end)
        if crlf >= 0:
            index = crlf
            body_start = crlf + 3
        elif index >= 0:
            body_start = index + 2
        else:
            if end >= window_end:
                raise FrameLimitExceeded(
                    "max_header_bytes", max_header_bytes, "no end of headers within the limit"
                )
            if end - pos > limits.max_frame_bytes:
                raise FrameLimitExceeded(
                    limits.frame_limit_name,
                    limits.max_frame_bytes,
                    "no end of headers within the limit",
                )
            if not self._line_checked:
                self._line_checked = self._check_command_line(buf, pos, end)
            # Resume two bytes back: a blank-line pattern may straddle the end of the data.
            self._scan = max(search_end - pos - 2, 0)
            return False
        if index + 1 - pos > max_header_bytes:
            raise FrameLimitExceeded(
                "max_header_bytes", max_header_bytes, f"header block of {index + 1 - pos} bytes"
            )
        try:
            text = buf[pos:index].decode()
        except UnicodeDecodeError:
            raise RemoteProtocolError("frame header is not valid UTF-8") from None
        lines = text.split("\n")
        if "\r" in text:
            lines = [line[:-1] if line[-1:] == "\r" else line for line in lines]
        command = _COMMANDS.get(lines[0])
        if command is None:
            raise RemoteProtocolError(f"unknown command {preview(lines[0])}")
        try:
            count = len(lines) - 1
            if count > limits.max_headers:
                raise FrameLimitExceeded("max_headers", limits.max_headers, f"{count} headers")
            headers: dict[str, str] = {}
            if count:
                table = self._unescapes
                if table is not None and "\\" in text and command not in RAW_COMMANDS:
                    self._parse_escaped(lines, headers, table, command)
                else:
                    setdefault = headers.setdefault  # first of repeated headers wins
                    for line in lines[1:]:
                        key, sep, value = line.partition(":")
                        if not sep:
                            raise RemoteProtocolError(f"header line without ':' in {command} frame")
                        setdefault(key, value)
            length = -1
            declared = headers.get("content-length")
            if declared is not None:
                if not (declared.isdigit() and declared.isascii()):
                    raise RemoteProtocolError(f"invalid content-length {preview(declared)}")
                if (
                    len(declared) > MAX_LENGTH_DIGITS
                    and len(declared.lstrip("0")) > MAX_LENGTH_DIGITS
                ):
                    raise FrameLimitExceeded(
                        limits.frame_limit_name, limits.max_frame_bytes, "content-length too large"
                    )
                length = int(declared)
                if length and command not in BODY_COMMANDS:
                    raise RemoteProtocolError(f"frame {command} must not have a body")
                frame_bytes = body_start - pos + length + 1
                if frame_bytes > limits.max_frame_bytes:
                    raise FrameLimitExceeded(
                        limits.frame_limit_name,
                        limits.max_frame_bytes,
                        f"content-length announces a frame of {frame_bytes} bytes",
                    )
            elif body_start - pos >= limits.max_frame_bytes:
                raise FrameLimitExceeded(
                    limits.frame_limit_name,
                    limits.max_frame_bytes,
                    "headers leave no room for the NUL",
                )
        except RemoteProtocolError as exc:
            exc.receipt_id = _receipt_hint(lines, self._unescapes, command)
            raise
        self._command = command
        self._headers = headers
        self._body_offset = body_start - pos
        self._body_length = length
        self._scan = body_start - pos
        return True

    def _refuse(self, error: RemoteProtocolError) -> RemoteProtocolError:
        """`error`, naming the receipt of the frame whose headers were parsed."""
        error.receipt_id = self._headers.get("receipt")
        return error

    @staticmethod
    def _parse_escaped(
        lines: list[str], headers: dict[str, str], table: dict[str, str], command: Command
    ) -> None:
        for i in range(1, len(lines)):
            key, sep, value = lines[i].partition(":")
            if not sep:
                raise RemoteProtocolError(f"header line without ':' in {command} frame")
            key = _unescape(key, table, command)
            if key not in headers:
                headers[key] = _unescape(value, table, command)

    @staticmethod
    def _check_command_line(buf: bytearray, pos: int, end: int) -> bool:
        """Reject an unknown command as soon as its line is complete, before the headers arrive.

        Returns whether the line was complete (and valid).
        """
        newline = buf.find(b"\n", pos, end)
        if newline < 0:
            return False
        name = bytes(buf[pos:newline]).removesuffix(b"\r").decode("latin-1")
        if name not in _COMMANDS:
            raise RemoteProtocolError(f"unknown command {preview(name)}")
        return True
