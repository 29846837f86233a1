"""The working state of `sluice get` in its target directory: part files and their records.

`DIR/<name>.part` holds the bytes of a stream being received. `DIR/.sluice-get/<key>.json` says
which stream it belongs to (`stream_id`, final `name`, `part` file name, and `complete` once
every byte is written and checked), so that a `get` started again can:

- continue a stream the broker redelivers from the middle (its consumer died): the part file is
  cut back to the stream's `resumed_at` offset and written on from there;
- accept the continuation of a stream whose producer died and was started again (the reader is
  told to expect it at the part file's size);
- finish a stream already complete on disk whose end the broker had not yet been told of.

Names come from the stream's `x-stream-name` and are sanitized: base name only, no control or
format characters (Unicode categories Cc and Cf, which include the direction overrides that make
`gpj.exe` read as `exe.jpg`; also line and paragraph separators and lone surrogates), no leading
dots, at most `MAX_NAME_BYTES`. Nothing is ever written outside DIR: part files and records are
opened without following symbolic links, a state directory that is a symbolic link is refused,
and a finished file never replaces an existing one: it takes the next free name
(`report (1).pdf`, ...), and the CLI says so.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import stat
import unicodedata
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import BinaryIO

from sluice.errors import SluiceError

__all__ = [
    "MAX_NAME_BYTES",
    "MAX_RECORDS",
    "STATE_DIR_NAME",
    "GetDir",
    "GetDirError",
    "PartRecord",
    "safe_name",
]

STATE_DIR_NAME = ".sluice-get"
# Records read at start; more are left alone (and reported).
MAX_RECORDS = 1000
MAX_NAME_BYTES = 200
PART_SUFFIX = ".part"
_UNSAFE = re.compile(r"[\x00-\x1f\x7f]")
_ID_CHARS = re.compile(r"[^A-Za-z0-9_-]")
# Control, format (direction overrides, zero-width characters), surrogate, and line and
# paragraph separator characters never reach a file name.
_UNSAFE_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
# Other names tried when a finished file's name is taken: "name (1).ext" up to this number.
MAX_RENAMES = 1000
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
# Hard links are how a file is put in place without replacing one; where the file system has
# none, a checked rename is used instead.
_NO_LINKS = {errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EXDEV, errno.EMLINK}


class GetDirError(SluiceError):
    """The target directory cannot be used safely (a symlinked state directory, no free name)."""


def _strip_unsafe(text: str) -> str:
    text = _UNSAFE.sub("", text)
    if text.isascii():
        return text
    return "".join(c for c in text if unicodedata.category(c) not in _UNSAFE_CATEGORIES)


def safe_name(raw: str | None, stream_id: str) -> str:
    """A file name for a stream, safe to create in the target directory."""
    name = ""
    if raw:
        name = raw.replace("\\", "/").rsplit("/", 1)[-1]
        name = _strip_unsafe(name).strip().lstrip(".")
        encoded = name.encode("utf-8")
        if len(encoded) > MAX_NAME_BYTES:
            name = encoded[:MAX_NAME_BYTES].decode("utf-8", errors="ignore")
    if not name:
        name = "stream-" + (_ID_CHARS.sub("", stream_id)[:64] or _digest(stream_id))
    return name


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]


@dataclass
class PartRecord:
    """Which stream a part file belongs to."""

    stream_id: str
    name: str
    part: str
    complete: bool = False


class GetDir:
    """Part files and records of one target directory."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.state_dir = directory / STATE_DIR_NAME
        self.records: dict[str, PartRecord] = {}

    def load(self) -> list[str]:
        """Read the records; return warnings about those that were left alone."""
        warnings: list[str] = []
        self.directory.mkdir(parents=True, exist_ok=True)
        self._check_state_dir()
        if not self.state_dir.is_dir():
            return warnings
        paths = sorted(self.state_dir.glob("*.json"))
        if len(paths) > MAX_RECORDS:
            warnings.append(
                f"{len(paths)} records in {self.state_dir}: only the first {MAX_RECORDS} are read"
            )
        for path in paths[:MAX_RECORDS]:
            try:
                data = json.loads(_read_nofollow(path))
                record = PartRecord(
                    stream_id=str(data["stream_id"]),
                    name=str(data["name"]),
                    part=str(data["part"]),
                    complete=bool(data.get("complete", False)),
                )
            except (OSError, ValueError, KeyError, TypeError) as exc:
                warnings.append(f"unreadable record {path}: {exc}")
                continue
            if safe_name(record.name, record.stream_id) != record.name or (
                safe_name(record.part, record.stream_id) != record.part
            ):
                warnings.append(f"record {path} names an unsafe file: ignored")
                continue
            if path.name != self._record_path(record.stream_id).name:
                warnings.append(f"record {path} is misnamed: ignored")
                continue
            self.records[record.stream_id] = record
        return warnings

    def _check_state_dir(self) -> None:
        """Refuse a state directory that is a symbolic link (or not a directory)."""
        try:
            info = os.lstat(self.state_dir)
        except FileNotFoundError:
            return
        if not stat.S_ISDIR(info.st_mode):
            raise GetDirError(
                f"{self.state_dir} is a symbolic link or not a directory: refusing to use it"
            )

    def _record_path(self, stream_id: str) -> Path:
        return self.state_dir / (_digest(stream_id) + ".json")

    def part_path(self, record: PartRecord) -> Path:
        """Where the record's bytes are written."""
        return self.directory / record.part

    def final_path(self, record: PartRecord) -> Path:
        """Where the file goes once complete."""
        return self.directory / record.name

    def part_size(self, record: PartRecord) -> int | None:
        """Bytes in the record's part file (None if there is none)."""
        try:
            return os.lstat(self.part_path(record)).st_size
        except FileNotFoundError:
            return None

    def new_record(self, stream_id: str, raw_name: str | None) -> PartRecord:
        """A record (not yet saved) with a part file name no other stream uses."""
        name = safe_name(raw_name, stream_id)
        taken = {r.part for r in self.records.values() if r.stream_id != stream_id}
        for part in (
            name + PART_SUFFIX,
            f"{name}.{_digest(stream_id)[:8]}{PART_SUFFIX}",
            f"{name}.{_digest(stream_id)}{PART_SUFFIX}",
        ):
            if part not in taken and not os.path.lexists(self.directory / part):
                break
        return PartRecord(stream_id, name, part)

    def save(self, record: PartRecord) -> None:
        """Write the record (atomically: to a temporary file, then renamed)."""
        self.state_dir.mkdir(exist_ok=True)
        self._check_state_dir()
        path = self._record_path(record.stream_id)
        tmp = path.with_suffix(".tmp")
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()  # a link left there is removed, never written through
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(json.dumps(asdict(record)))
        os.replace(tmp, path)
        self.records[record.stream_id] = record

    def drop(self, record: PartRecord, *, delete_part: bool) -> None:
        """Forget the record (and delete its part file if asked)."""
        self.records.pop(record.stream_id, None)
        with contextlib.suppress(FileNotFoundError):
            self._record_path(record.stream_id).unlink()
        if delete_part:
            with contextlib.suppress(FileNotFoundError):
                self.part_path(record).unlink()

    def open_part(self, record: PartRecord, offset: int) -> BinaryIO:
        """The part file opened for writing at `offset`, cut to that length."""
        flags = os.O_WRONLY | os.O_CREAT | _O_NOFOLLOW
        fd = os.open(self.part_path(record), flags, 0o644)
        try:
            os.ftruncate(fd, offset)
            os.lseek(fd, offset, os.SEEK_SET)
            return os.fdopen(fd, "wb")
        except BaseException:
            os.close(fd)
            raise

    def tidy(self) -> None:
        """Remove the state directory if no record is left in it."""
        with contextlib.suppress(OSError):
            self.state_dir.rmdir()

    def finalize(self, record: PartRecord) -> Path:
        """Put the part file in place under the final name, or, if a file (or anything) of that
        name exists, under the first free one of `name (1).ext`, ...; never replace a file.
        Returns where it went."""
        part = self.part_path(record)
        for candidate in _candidates(record.name):
            final = self.directory / candidate
            try:
                os.link(part, final, follow_symlinks=False)
            except FileExistsError:
                continue
            except OSError as exc:
                if exc.errno not in _NO_LINKS:
                    raise
                if os.path.lexists(final):
                    continue
                os.rename(part, final)
                return final
            os.unlink(part)
            return final
        raise GetDirError(f"no free name for {record.name} in {self.directory}")


def _candidates(name: str) -> list[str]:
    """`name`, then `stem (1).ext`, `stem (2).ext`, ..."""
    stem, dot, ext = name.rpartition(".")
    if not stem:
        stem, dot, ext = name, "", ""
    return [name] + [f"{stem} ({n}){dot}{ext}" for n in range(1, MAX_RENAMES + 1)]


def _read_nofollow(path: Path) -> str:
    """A record's text, refusing a symbolic link."""
    fd = os.open(path, os.O_RDONLY | _O_NOFOLLOW)
    with os.fdopen(fd, encoding="utf-8") as file:
        return file.read()
