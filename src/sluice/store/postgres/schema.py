"""The PostgreSQL store's tables, their versioned migrations, and the encodings of what goes in
them. `docs/postgres-store.md` describes every table for operators.

Migrations are ordered lists of SQL statements; `MIGRATIONS[n]` takes the schema from version n
to n + 1. `migrate()` applies the missing ones at open, in one transaction, under an advisory lock
(two brokers opening the same database at once apply them once), and refuses a database written
by a newer Sluice. Everything lives in one PostgreSQL schema (`sluice` by default), so the
database may hold other things.

Headers are bytea in the journal's header layout (`u32 count`, then `count` pairs of `u32 length |
UTF-8 bytes`, little endian, see `docs/store-format.md`), checked against their lengths before
anything is sliced. A body larger than `CHUNK_BYTES` is kept in rows of `message_chunks`, never
in one huge value.

There are no foreign keys: the store's one writer keeps the references whole (a message's chunks
are deleted by the statement that deletes it, `batch.py`), and a key check per inserted row (a
lock on the destination's row, written to the WAL) would cost every send.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

import psycopg
from psycopg import sql

from sluice.errors import StoreError

CHUNK_BYTES = 256 * 1024
"""Bodies above this size are stored in chunks of at most this many bytes."""

# A key for pg_advisory_xact_lock: migrations of one database run one at a time.
_MIGRATION_LOCK = 0x5175_1CE0

MIGRATIONS: tuple[tuple[str, ...], ...] = (
    # 0 -> 1: the first schema.
    (
        """CREATE TABLE destinations (
            id bigint PRIMARY KEY,
            name text NOT NULL UNIQUE,
            live boolean NOT NULL,
            last_seq bigint NOT NULL DEFAULT 0,
            dispatch_mark bigint NOT NULL DEFAULT 0
        )""",
        """CREATE TABLE messages (
            id bigint PRIMARY KEY,
            dest_id bigint NOT NULL,
            seq bigint,
            txno bigint,
            message_id text NOT NULL,
            timestamp_ms bigint NOT NULL,
            expires_ms bigint NOT NULL,
            priority smallint NOT NULL,
            persistent boolean NOT NULL,
            size bigint NOT NULL,
            headers bytea NOT NULL,
            body bytea,
            chunks integer NOT NULL DEFAULT 0,
            UNIQUE (dest_id, seq)
        )""",
        "CREATE INDEX messages_open_tx ON messages (txno) WHERE txno IS NOT NULL",
        """CREATE TABLE message_chunks (
            message bigint NOT NULL,
            n integer NOT NULL,
            data bytea NOT NULL,
            PRIMARY KEY (message, n)
        )""",
        """CREATE TABLE dedup_ids (
            dest_id bigint NOT NULL,
            pos bigint NOT NULL,
            dedup_id text NOT NULL,
            PRIMARY KEY (dest_id, pos)
        )""",
        """CREATE TABLE subscriptions (
            client_id text NOT NULL,
            name text NOT NULL,
            destination text NOT NULL,
            selector text,
            cursor bigint NOT NULL,
            PRIMARY KEY (client_id, name)
        )""",
    ),
    # 1 -> 2: the number of the writer's last committed batch, written by every batch: after a
    # lost connection it tells whether the COMMIT in flight took effect.
    (
        "CREATE TABLE writer_batch (batch bigint NOT NULL)",
        "INSERT INTO writer_batch VALUES (0)",
    ),
)

SCHEMA_VERSION = len(MIGRATIONS)
"""The version this Sluice writes."""


def migrate(conn: psycopg.Connection[tuple[object, ...]], schema: str) -> list[str]:
    """Create the schema or bring it to `SCHEMA_VERSION`, in the connection's current transaction
    (the caller commits). Returns a report line per migration applied."""
    return migrate_to(conn, schema, SCHEMA_VERSION)


def migrate_to(conn: psycopg.Connection[tuple[object, ...]], schema: str, target: int) -> list[str]:
    """`migrate`, up to version `target` (tests of the migrations)."""
    ident = sql.Identifier(schema)
    conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
    conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(ident))
    conn.execute(sql.SQL("SET LOCAL search_path TO {}").format(ident))
    conn.execute("CREATE TABLE IF NOT EXISTS schema_version (version integer NOT NULL)")
    row = conn.execute("SELECT version FROM schema_version").fetchone()
    if row is None:
        conn.execute("INSERT INTO schema_version VALUES (0)")
        version = 0
    else:
        version = int(str(row[0]))
    if version > target:
        raise StoreError(
            f"the PostgreSQL schema {schema!r} is at version {version}, written by a newer "
            f"Sluice; this one knows versions up to {target}"
        )
    report = []
    for step in range(version, target):
        for statement in MIGRATIONS[step]:
            conn.execute(statement)
        report.append(f"postgres: schema {schema!r} migrated from version {step} to {step + 1}")
    conn.execute("UPDATE schema_version SET version = %s", (target,))
    return report


# -- headers -----------------------------------------------------------------------------------

_U32 = struct.Struct("<I")


def encode_headers(headers: dict[str, str]) -> bytes:
    """The journal's header layout: count, then (key, value) as length-prefixed UTF-8."""
    parts = [_U32.pack(len(headers))]
    for key, value in headers.items():
        k, v = key.encode(), value.encode()
        parts += [_U32.pack(len(k)), k, _U32.pack(len(v)), v]
    return b"".join(parts)


def decode_headers(data: bytes, where: str) -> dict[str, str]:
    """Decode `encode_headers`; every length is checked before it is used. Raises StoreError
    naming `where` when the bytes do not hold a header block."""
    view = memoryview(data)
    end = len(view)
    if end < 4:
        raise StoreError(f"headers of {where} truncated")
    (count,) = _U32.unpack_from(view, 0)
    if count * 8 > end - 4:
        raise StoreError(f"headers of {where}: count {count} exceeds the {end} bytes")
    pos = 4
    out: dict[str, str] = {}
    try:
        for _ in range(count):
            texts = []
            for _ in range(2):
                if pos + 4 > end:
                    raise StoreError(f"headers of {where} truncated at byte {pos}")
                (length,) = _U32.unpack_from(view, pos)
                pos += 4
                if length > end - pos:
                    raise StoreError(f"headers of {where}: length {length} at byte {pos} too long")
                texts.append(str(view[pos : pos + length], "utf-8"))
                pos += length
            out[texts[0]] = texts[1]
    except UnicodeDecodeError as exc:
        raise StoreError(f"headers of {where}: invalid UTF-8") from exc
    if pos != end:
        raise StoreError(f"headers of {where}: {end - pos} bytes after the last header")
    return out


def chunks_of(body: bytes) -> Iterator[bytes]:
    """A large body in pieces of at most `CHUNK_BYTES`."""
    view = memoryview(body)
    for start in range(0, len(view), CHUNK_BYTES):
        yield bytes(view[start : start + CHUNK_BYTES])
