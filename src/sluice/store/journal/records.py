"""The journal's record types as Python values: what each record says, not how it is laid out.

`format.py` turns them into bytes and back (and re-exports them); `docs/store-format.md` is the
byte layout.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass

FORMAT_VERSION = 2
# Version 1 files are read as they are: they differ only in never holding FILES_RETIRED records.
READABLE_VERSIONS = frozenset({1, 2})


class RecordType(enum.IntEnum):
    """The type byte of a record."""

    FILE_HEADER = 1
    ADD = 2
    REMOVE = 3
    REMOVE_RANGE = 4
    TX_BEGIN = 5
    TX_COMMIT = 6
    TX_ABORT = 7
    SUB_PUT = 8
    SUB_DELETE = 9
    SUB_CURSOR = 10
    DEST_DELETE = 11
    DISPATCH_MARK = 12
    DEST_STATE = 13
    CHECKPOINT = 14
    DEST_SEQ = 15
    PADDING = 16
    FILES_RETIRED = 17


class FormatError(ValueError):
    """A payload does not follow the layout of its record type."""


# -- decoded records ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FileHeader:
    """First record of every file."""

    file_no: int
    store_id: bytes
    created_ms: int
    version: int = FORMAT_VERSION


@dataclass(frozen=True, slots=True)
class AddMeta:
    """The fields of an ADD record that the index needs (everything but headers and body)."""

    destination: str
    seq: int
    txno: int
    ordinal: int
    size: int
    timestamp_ms: int
    dedup_id: str
    copy: bool = False


@dataclass(frozen=True, slots=True)
class Remove:
    """A message was consumed (at commit when `txno` is set)."""

    txno: int
    destination: str
    seq: int


@dataclass(frozen=True, slots=True)
class RemoveRange:
    """Every message of a destination up to `upto_seq` was dropped."""

    destination: str
    upto_seq: int


@dataclass(frozen=True, slots=True)
class TxBegin:
    """A transaction number starts; `txid` is the client's name for it."""

    txno: int
    txid: str


@dataclass(frozen=True, slots=True)
class TxCommit:
    """The transaction's adds become visible with these sequences, in add order."""

    txno: int
    seqs: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class TxAbort:
    """The transaction is dropped."""

    txno: int


@dataclass(frozen=True, slots=True)
class SubPut:
    """A durable subscription was created or replaced."""

    client_id: str
    name: str
    destination: str
    selector: str | None
    cursor: int


@dataclass(frozen=True, slots=True)
class SubDelete:
    """A durable subscription was dropped."""

    client_id: str
    name: str


@dataclass(frozen=True, slots=True)
class SubCursor:
    """A durable subscription's cursor moved."""

    client_id: str
    name: str
    cursor: int


@dataclass(frozen=True, slots=True)
class DestDelete:
    """A destination and all its messages were dropped."""

    destination: str


@dataclass(frozen=True, slots=True)
class DispatchMark:
    """Messages of the destination up to `seq` may have been dispatched."""

    destination: str
    seq: int


@dataclass(frozen=True, slots=True)
class DestState:
    """A destination's state re-asserted at the head so older files can be dropped."""

    destination: str
    last_seq: int
    dispatch_mark: int
    dedup_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class DestSeq:
    """The destination's last sequence is at least `seq` (adds cancelled before their write
    still used their sequences; written at the next checkpoint)."""

    destination: str
    seq: int


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """The index was committed with the journal complete up to this position."""

    file_no: int
    offset: int
    time_ms: int


@dataclass(frozen=True, slots=True)
class Padding:
    """Bytes a repair overwrote because the records there were damaged; replay skips them."""

    payload_bytes: int


@dataclass(frozen=True, slots=True)
class FilesRetired:
    """Every data file collected (deleted or archived) so far, as inclusive number ranges.

    Written, and synced, before the files named for the first time are removed, so a rebuild
    can tell a file that collection removed from one that was lost."""

    ranges: tuple[tuple[int, int], ...]

    @classmethod
    def of(cls, numbers: Iterable[int]) -> FilesRetired:
        """The ranges covering `numbers`."""
        ranges: list[tuple[int, int]] = []
        for n in sorted(set(numbers)):
            if ranges and ranges[-1][1] == n - 1:
                ranges[-1] = (ranges[-1][0], n)
            else:
                ranges.append((n, n))
        return cls(tuple(ranges))

    def numbers(self) -> set[int]:
        """Every file number the ranges cover."""
        return {n for first, last in self.ranges for n in range(first, last + 1)}

    def covers(self, file_no: int) -> bool:
        """Whether collection removed data file `file_no`."""
        return any(first <= file_no <= last for first, last in self.ranges)


Record = (
    FileHeader
    | AddMeta
    | Remove
    | RemoveRange
    | TxBegin
    | TxCommit
    | TxAbort
    | SubPut
    | SubDelete
    | SubCursor
    | DestDelete
    | DispatchMark
    | DestState
    | DestSeq
    | Checkpoint
    | Padding
    | FilesRetired
)
