"""`sluice put FILE DEST` and `sluice get DEST DIR`: files as streams, resumable.

put. The file goes as one stream of chunks, each with `x-dedup-id` `<stream id>:<seq>`. Its
progress is kept in a sidecar state file, `<state dir>/<key>.json`, where the key is derived
from the file's absolute path and the destination, and the file's size and mtime are recorded.
The stream id is random at the first run and kept in the state file. A run that fails (broker
gone, connection lost, interrupted) leaves the state file; the same command run again, on the
same unchanged file, continues the same stream from the last receipted chunk (chunks sent but not
receipted are sent again, and the broker drops those it has through their dedup ids). Once the
end chunk is receipted the state file is deleted: a later put of the same file is a new stream.
A changed file (size or mtime) starts a new stream. With `--transactional` a failed run leaves
nothing visible, and the next run sends the whole file again in one transaction, with the same
stream id and dedup ids (so a COMMIT whose receipt was lost is not repeated).

get. Streams are written to `DIR/<name>.part` and renamed to `DIR/<name>` once the SHA-256 has
matched; see `sluice.cli.getdir` for how a restarted get continues a part file.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sluice.cli.common import Runner, add_client_args, client_options
from sluice.cli.exitcodes import ExitCode
from sluice.cli.getdir import GetDir, PartRecord
from sluice.cli.progress import Progress, format_bytes
from sluice.errors import SluiceError

if TYPE_CHECKING:
    from sluice.client.streams import StreamResume

__all__ = ["TransferError", "add_parsers", "run_get", "run_put"]

# The put state file is written at most this often while chunks are receipted.
STATE_SAVE_INTERVAL_S = 0.2
# Sizes are binary whichever way they are written: 64k, 64KB and 64KiB are 65536 bytes.
_SIZE = re.compile(r"(\d+)\s*(|b|k|kb|kib|m|mb|mib|g|gb|gib)")
_SIZE_UNITS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3}


class TransferError(SluiceError):
    """A put or get failed; the message is the one-line reason."""


def _size(text: str) -> int:
    match = _SIZE.fullmatch(text.strip().lower())
    if match is None:
        raise argparse.ArgumentTypeError(f"expected a size such as 1048576, 256KiB or 4MiB: {text}")
    return int(match.group(1)) * _SIZE_UNITS[match.group(2).removesuffix("b").removesuffix("i")]


def _count(minimum: int) -> Any:
    def parse(text: str) -> int:
        if not text.isdigit() or int(text) < minimum:
            raise argparse.ArgumentTypeError(f"expected an integer of at least {minimum}: {text}")
        return int(text)

    return parse


def _default_state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "sluice" / "put"


def add_parsers(sub: Any) -> dict[str, Runner]:
    """Add `put` and `get` to the subcommand parsers; return their runners by name."""
    from sluice.client.streams import (  # noqa: PLC0415
        DEFAULT_CHUNK_BYTES,
        DEFAULT_STREAM_PREFETCH_BYTES,
        DEFAULT_STREAM_WINDOW,
    )

    p = sub.add_parser("put", help="send a file as a stream (resumable)")
    add_client_args(p)
    p.add_argument("file", type=Path)
    p.add_argument("destination")
    p.add_argument(
        "--chunk-size",
        type=_size,
        default=DEFAULT_CHUNK_BYTES,
        help="bytes per chunk (default %(default)s)",
    )
    p.add_argument(
        "--transactional",
        action="store_true",
        help="send every chunk in one transaction: the file appears whole or not at all",
    )
    p.add_argument(
        "--window",
        type=_count(1),
        default=DEFAULT_STREAM_WINDOW,
        help="chunks sent ahead of their receipts (default %(default)s)",
    )
    p.add_argument(
        "--state-dir",
        type=Path,
        default=None,
        help="where progress is kept to resume (default $XDG_STATE_HOME/sluice/put)",
    )
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar or summary")

    g = sub.add_parser("get", help="receive streams into files in a directory (resumable)")
    add_client_args(g)
    g.add_argument("destination")
    g.add_argument("directory", type=Path)
    g.add_argument(
        "-n", "--count", type=_count(0), default=1, help="files to receive (0: until timeout)"
    )
    g.add_argument(
        "--timeout", type=float, default=None, help="seconds to wait for each stream to start"
    )
    g.add_argument(
        "--prefetch-bytes",
        type=_size,
        default=DEFAULT_STREAM_PREFETCH_BYTES,
        help="the broker's byte credit (default %(default)s)",
    )
    g.add_argument("-q", "--quiet", action="store_true", help="no progress bar or summaries")
    return {"put": run_put, "get": run_get}


def _say(args: argparse.Namespace, text: str) -> None:
    if not args.quiet:
        print(text, file=sys.stderr, flush=True)


def _progress_enabled(args: argparse.Namespace) -> bool:
    return not args.quiet and sys.stderr.isatty()


# -- put --------------------------------------------------------------------------------------


class _PutState:
    """The sidecar state of one put: which stream, and how far the broker has it."""

    def __init__(self, path: Path, identity: dict[str, Any]) -> None:
        self.path = path
        self.identity = identity
        self.stream_id = ""
        self.next_seq = 0
        self.offset = 0
        self.done = False
        self._saved_s = 0.0

    def load(self) -> bool:
        """Read a state left by a failed run of this put; False if none applies."""
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return False
        except (OSError, ValueError):
            return False
        if not isinstance(data, dict) or data.get("identity") != self.identity:
            return False
        try:
            self.stream_id = str(data["stream_id"])
            self.next_seq = int(data["next_seq"])
            self.offset = int(data["offset"])
        except (KeyError, TypeError, ValueError):
            return False
        return bool(self.stream_id) and self.next_seq >= 0 and self.offset >= 0

    def save(self, *, force: bool = True) -> None:
        """Write the state (atomically), at most every `STATE_SAVE_INTERVAL_S` unless forced."""
        now = time.monotonic()
        if not force and now - self._saved_s < STATE_SAVE_INTERVAL_S:
            return
        self._saved_s = now
        self.path.parent.mkdir(parents=True, exist_ok=True)
        data = {
            "identity": self.identity,
            "stream_id": self.stream_id,
            "next_seq": self.next_seq,
            "offset": self.offset,
        }
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data), encoding="utf-8")
        os.replace(tmp, self.path)

    def delete(self) -> None:
        """The stream is complete: forget it."""
        self.done = True
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()


def _put_file(file: Path) -> tuple[Path, os.stat_result]:
    """The file to put, resolved, and what `stat` says of it; `TransferError` if not a file."""
    path = file.resolve()
    try:
        info = path.stat()
    except OSError as exc:
        raise TransferError(f"{file}: {exc.strerror}") from None
    if not path.is_file():
        raise TransferError(f"{file} is not a regular file")
    return path, info


def _put_state(args: argparse.Namespace, path: Path, info: os.stat_result) -> _PutState:
    """The state of this put: left by a failed run of the same put, or a new stream's."""
    import uuid  # noqa: PLC0415

    identity = {
        "path": str(path),
        "destination": args.destination,
        "size": info.st_size,
        "mtime_ns": info.st_mtime_ns,
        "chunk_size": args.chunk_size,
        "transactional": args.transactional,
    }
    state_dir = args.state_dir if args.state_dir is not None else _default_state_dir()
    key = hashlib.sha256(f"{path}\0{args.destination}".encode()).hexdigest()[:32]
    state = _PutState(state_dir / f"{key}.json", identity)
    if not state.load():
        state.stream_id = uuid.uuid4().hex
        state.next_seq = 0
        state.offset = 0
    if args.transactional:
        # A transaction that did not commit left nothing: send it all again.
        state.next_seq, state.offset = 0, 0
    state.save()
    return state


def _resume_point(args: argparse.Namespace, state: _PutState, path: Path) -> StreamResume | None:
    """Where the stream continues (a `StreamResume`), or None for a stream from its start."""
    from sluice.client import StreamResume, hash_prefix  # noqa: PLC0415
    from sluice.errors import ClientError  # noqa: PLC0415

    if state.next_seq == 0:
        return None
    try:
        hasher = hash_prefix(path, state.offset)
    except ClientError as exc:
        raise TransferError(str(exc)) from None
    _say(args, f"continuing stream {state.stream_id} at chunk {state.next_seq}")
    return StreamResume(state.next_seq, state.offset, hasher)


def run_put(args: argparse.Namespace) -> int:
    """`sluice put FILE DEST`."""
    from sluice.client import BlockingClient, StreamOptions, StreamProgress  # noqa: PLC0415
    from sluice.client.streams import STREAM_NAME, STREAM_SIZE  # noqa: PLC0415
    from sluice.errors import ClientError  # noqa: PLC0415

    path, info = _put_file(args.file)
    state = _put_state(args, path, info)
    resume = _resume_point(args, state, path)
    progress = Progress(
        path.name, info.st_size, sys.stderr, enabled=_progress_enabled(args), start=state.offset
    )

    def on_progress(done: StreamProgress) -> None:
        progress.update(done.offset_end)
        if done.end:
            state.delete()
        elif not args.transactional:
            state.next_seq = done.seq + 1
            state.offset = done.offset_end
            state.save(force=False)

    options = StreamOptions(
        chunk_size=args.chunk_size,
        transactional=args.transactional,
        stream_id=state.stream_id,
        headers={STREAM_NAME: path.name, STREAM_SIZE: str(info.st_size)},
        window=args.window,
        resume=resume,
        on_progress=on_progress,
    )
    try:
        with (
            BlockingClient(args.broker, **client_options(args)) as client,
            path.open("rb") as file,
        ):
            file.seek(state.offset)
            sent = client.send_stream(args.destination, file, options)
    except ClientError as exc:
        raise TransferError(
            f"{exc}; run the same command again to continue"
            + ("" if args.transactional else f" from chunk {state.next_seq}")
        ) from None
    finally:
        progress.close()
        if not state.done:
            state.save()
    state.delete()
    _say(
        args,
        f"sent {path.name} to {args.destination}: {format_bytes(sent.length)} in {sent.chunks}"
        f" chunks, {format_bytes(progress.average_rate())}/s, stream {sent.stream_id}"
        f" sha256 {sent.sha256}",
    )
    return ExitCode.OK


# -- get --------------------------------------------------------------------------------------


class _Getter:
    """One `sluice get` run: streams from the reader into part files, renamed when complete."""

    def __init__(self, args: argparse.Namespace, folder: GetDir) -> None:
        self.args = args
        self.folder = folder
        self.received = 0
        self.failures = 0

    def prepare(self, reader: Any) -> None:
        """Finish what a previous run left complete; expect continuations of the others."""
        folder = self.folder
        for record in list(folder.records.values()):
            size = folder.part_size(record)
            if record.complete:
                if size is not None:
                    final = folder.finalize(record)
                    _say(
                        self.args,
                        f"completed {final} (left by an earlier run){_renamed(record, final)}",
                    )
                continue
            if size is None:
                folder.drop(record, delete_part=False)
                continue
            reader.expect(record.stream_id, size)

    def receive(self, stream: Any) -> None:
        """Write one stream; raises `TransferError` when it cannot be continued here."""
        record = self._record_for(stream)
        if record is None:
            return
        progress = Progress(
            record.name,
            stream.size_hint,
            sys.stderr,
            enabled=_progress_enabled(self.args),
            start=stream.resumed_at,
        )
        if self._write(stream, record, progress):
            self._complete(stream, record, progress)

    def _record_for(self, stream: Any) -> PartRecord | None:
        """The part file record `stream` goes to; None if an earlier run already wrote it."""
        from sluice.client import hash_prefix  # noqa: PLC0415

        folder = self.folder
        record = folder.records.get(stream.id)
        if record is not None and record.complete:
            # Written and checked by an earlier run: only the broker did not know.
            stream.skip()
            folder.drop(record, delete_part=False)
            return None
        if stream.resumed_at == 0:
            if record is None:
                record = folder.new_record(stream.id, stream.name)
            folder.save(record)
            return record
        size = folder.part_size(record) if record is not None else None
        if record is None or size is None or size < stream.resumed_at:
            have = "no part of it" if size is None else f"only {size} bytes of it"
            raise TransferError(
                f"stream {stream.id} ({stream.name}) resumes at offset {stream.resumed_at}"
                f" but {self.args.directory} holds {have}: run get on the directory that"
                " holds its start"
            )
        stream.seed_sha256(hash_prefix(folder.part_path(record), stream.resumed_at))
        _say(self.args, f"resuming {record.name} at offset {stream.resumed_at}")
        return record

    def _write(self, stream: Any, record: PartRecord, progress: Progress) -> bool:
        """Write the stream's bytes into its part file and close `progress`; False if the
        stream failed (said why)."""
        from sluice.client import StreamAborted, StreamCorrupted  # noqa: PLC0415
        from sluice.client.errors import ConnectionLost  # noqa: PLC0415

        folder = self.folder
        try:
            with folder.open_part(record, stream.resumed_at) as file:
                for data in stream:
                    file.write(data)
                    progress.update(stream.position)
                file.flush()
                os.fsync(file.fileno())
        except StreamAborted as exc:
            progress.close()
            print(
                f"sluice get: {exc}; {folder.part_path(record)} is kept: the stream goes on there"
                " if its producer resumes it",
                file=sys.stderr,
            )
            return False
        except StreamCorrupted as exc:
            progress.close()
            folder.drop(record, delete_part=True)
            self.failures += 1
            print(f"sluice get: {exc}; {record.part} deleted", file=sys.stderr)
            return False
        except ConnectionLost as exc:
            progress.close()
            print(f"sluice get: {exc}", file=sys.stderr)
            return False
        progress.close()
        return True

    def _complete(self, stream: Any, record: PartRecord, progress: Progress) -> None:
        """The stream is written and checked: acknowledge its end and rename its part file."""
        from sluice.client.errors import ConnectionLost  # noqa: PLC0415

        folder = self.folder
        record.complete = True
        folder.save(record)
        try:
            stream.finish()
        except ConnectionLost:
            # The end comes again, as a resumed stream the complete record swallows.
            final = folder.finalize(record)
        else:
            final = folder.finalize(record)
            folder.drop(record, delete_part=False)
        self.received += 1
        checked = "sha256 ok" if stream.verified else "sha256 not checked"
        _say(
            self.args,
            f"received {final} ({format_bytes(stream.length or 0)}, {checked},"
            f" {format_bytes(progress.average_rate())}/s){_renamed(record, final)}",
        )


def _renamed(record: PartRecord, final: Path) -> str:
    """Words for a file saved under another name than its stream's, because that one was taken."""
    if final.name == record.name:
        return ""
    return f"; {record.name} exists and was left alone, saved as {final.name}"


def run_get(args: argparse.Namespace) -> int:
    """`sluice get DEST DIR`."""
    from sluice.client import BlockingClient  # noqa: PLC0415

    folder = GetDir(args.directory)
    for warning in folder.load():
        print(f"sluice get: {warning}", file=sys.stderr)
    getter = _Getter(args, folder)
    try:
        with (
            BlockingClient(args.broker, **client_options(args)) as client,
            client.stream_reader(
                args.destination, prefetch_bytes=args.prefetch_bytes, on_gap="skip"
            ) as reader,
        ):
            getter.prepare(reader)
            while args.count == 0 or getter.received < args.count:
                stream = reader.next_stream(args.timeout)
                if stream is None:
                    if args.count == 0:
                        break
                    dropped = f", {getter.failures} corrupt" if getter.failures else ""
                    raise TransferError(
                        f"no stream within {args.timeout:g} s"
                        f" (received {getter.received} of {args.count}{dropped})"
                    )
                getter.receive(stream)
            skipped = reader.skipped_chunks
    finally:
        folder.tidy()
    if getter.failures or skipped:
        raise TransferError(
            f"{getter.failures} corrupt streams and {skipped} chunks out of place were dropped"
            f" (received {getter.received})"
        )
    return ExitCode.OK
