"""The users file: user names, their groups and scrypt password hashes, in TOML.

```toml
# Sluice users, written by `sluice user`. Keep this file readable by its owner only.
format = 1

[users."alice"]
groups = ["ops", "billing"]
password = "$scrypt$ln=15,r=8,p=3$<salt, base64>$<key, base64>"
```

A password is never stored: only scrypt's key derived from it with a random 16-byte salt. The
cost parameters travel with each hash (`ln` is log2 of N), so they can be raised later: old
hashes still verify with their own parameters, and `sluice user passwd` rewrites a hash with the
current ones. Keys are compared in constant time, and an unknown user costs as much as a known
one, so timing tells neither apart.

The file holds secrets, so it is refused when group or others have any access to it, and it is
written atomically (a temporary file with mode 0600 in the same directory, synced, then renamed
over the old one). Everything read from it is bounded: its size, the names, the number of groups,
and scrypt parameters a hand-edited file could make ruinous.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import json
import os
import re
import secrets
import stat
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sluice.auth.identity import ANONYMOUS_USER, Identity
from sluice.errors import ConfigError

__all__ = [
    "DEFAULT_PARAMS",
    "ScryptParams",
    "User",
    "UsersFile",
    "check_name",
    "hash_password",
    "load_users",
    "save_users",
    "verify_password",
]

FORMAT = 1
# A users file larger than this is refused before it is read.
MAX_USERS_FILE_BYTES = 16 * 1024 * 1024
MAX_GROUPS_PER_USER = 256
# Passwords longer than this are refused, never hashed.
MAX_PASSWORD_BYTES = 1024
SALT_BYTES = 16
KEY_BYTES = 32
# User and group names: letters, digits and `_ . @ + -`, starting with a letter or digit. No
# spaces, colons, commas, quotes or control characters: names appear in logs and ACL lists.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@+-]{0,127}")
_HASH = re.compile(
    r"\$scrypt\$ln=(?P<ln>\d{1,2}),r=(?P<r>\d{1,3}),p=(?P<p>\d{1,3})"
    r"\$(?P<salt>[A-Za-z0-9+/=]{1,64})\$(?P<key>[A-Za-z0-9+/=]{1,128})"
)


@dataclass(frozen=True)
class ScryptParams:
    """scrypt's cost: N = 2**ln, block size r, parallelism p. Memory is 128 * r * N bytes."""

    ln: int
    r: int
    p: int

    def check(self) -> None:
        """Refuse parameters that are too weak to mean anything or too costly to run."""
        if not (10 <= self.ln <= 20 and 1 <= self.r <= 32 and 1 <= self.p <= 16):
            raise ValueError(f"scrypt parameters out of bounds: ln={self.ln} r={self.r} p={self.p}")
        if self.memory_bytes > 256 * 1024 * 1024:
            raise ValueError("scrypt parameters need more than 256 MiB")

    @property
    def memory_bytes(self) -> int:
        """What one derivation allocates."""
        return 128 * self.r * (1 << self.ln)


# OWASP's scrypt setting of the same cost as N=2**17, r=8, p=1, with 32 MiB per derivation
# instead of 128 MiB (a login is checked on a worker thread; several may run at once).
DEFAULT_PARAMS = ScryptParams(ln=15, r=8, p=3)


@dataclass(frozen=True)
class User:
    """One user of the file: name, groups, and the password hash (never the password)."""

    name: str
    groups: tuple[str, ...]
    password_hash: str

    @property
    def identity(self) -> Identity:
        """Who a connection that logs in as this user is."""
        return Identity(self.name, frozenset(self.groups))


def check_name(name: str, what: str = "user name") -> str:
    """Return `name` if it is a valid user or group name; raise ValueError saying why not."""
    if not name:
        raise ValueError(f"empty {what}")
    if not _NAME.fullmatch(name):
        raise ValueError(
            f"invalid {what} {name[:40]!r}: use up to 128 letters, digits and _ . @ + -, "
            "starting with a letter or digit"
        )
    if what == "user name" and name == ANONYMOUS_USER:
        raise ValueError(f"{ANONYMOUS_USER!r} is reserved for clients without credentials")
    return name


def _derive(password: bytes, salt: bytes, params: ScryptParams) -> bytes:
    return hashlib.scrypt(
        password,
        salt=salt,
        n=1 << params.ln,
        r=params.r,
        p=params.p,
        maxmem=params.memory_bytes + 1024 * 1024,
        dklen=KEY_BYTES,
    )


def _password_bytes(password: str) -> bytes:
    data = password.encode("utf-8")
    if not data:
        raise ValueError("empty password")
    if len(data) > MAX_PASSWORD_BYTES:
        raise ValueError(f"password longer than {MAX_PASSWORD_BYTES} bytes")
    return data


def hash_password(password: str, params: ScryptParams = DEFAULT_PARAMS) -> str:
    """A new salted scrypt hash of `password`, with its parameters."""
    params.check()
    salt = secrets.token_bytes(SALT_BYTES)
    key = _derive(_password_bytes(password), salt, params)
    b64 = base64.b64encode
    return (
        f"$scrypt$ln={params.ln},r={params.r},p={params.p}${b64(salt).decode()}${b64(key).decode()}"
    )


def _parse_hash(text: str) -> tuple[ScryptParams, bytes, bytes]:
    match = _HASH.fullmatch(text)
    if match is None:
        raise ValueError("not a $scrypt$ password hash")
    params = ScryptParams(int(match["ln"]), int(match["r"]), int(match["p"]))
    params.check()
    salt = base64.b64decode(match["salt"], validate=True)
    key = base64.b64decode(match["key"], validate=True)
    if len(salt) < 8 or len(key) < 16:
        raise ValueError("password hash with too short a salt or key")
    return params, salt, key


# Verified against for unknown users, so that they cost as much as known ones.
_DUMMY_SALT = secrets.token_bytes(SALT_BYTES)


def verify_password(password: str, password_hash: str | None) -> bool:
    """Whether `password` matches `password_hash` (None: an unknown user, checked against a
    dummy so it takes as long, and refused)."""
    try:
        data = _password_bytes(password)
    except ValueError:
        return False
    if password_hash is None:
        _derive(data, _DUMMY_SALT, DEFAULT_PARAMS)
        return False
    try:
        params, salt, key = _parse_hash(password_hash)
    except ValueError:
        return False
    return hmac.compare_digest(_derive(data, salt, params), key)


class UsersFile:
    """The users of one file, by name."""

    def __init__(self, users: Iterable[User] = ()) -> None:
        self.users: dict[str, User] = {user.name: user for user in users}

    def __contains__(self, name: object) -> bool:
        return name in self.users

    def __len__(self) -> int:
        return len(self.users)

    def get(self, name: str) -> User | None:
        """The user with this name, if any."""
        return self.users.get(name)

    def put(self, user: User) -> None:
        """Add or replace a user."""
        self.users[user.name] = user

    def remove(self, name: str) -> bool:
        """Remove a user; tell whether there was one."""
        return self.users.pop(name, None) is not None

    def authenticate(self, login: str, passcode: str) -> Identity | None:
        """The identity of `login` if `passcode` is its password; None otherwise."""
        user = self.users.get(login)
        if not verify_password(passcode, user.password_hash if user is not None else None):
            return None
        assert user is not None
        return user.identity


def _check_mode(path: Path, mode: int) -> None:
    if mode & 0o077:
        raise ConfigError(
            f"users file {path} has mode {stat.S_IMODE(mode):04o}: group and others must have "
            f"no access to it (it holds password hashes); run: chmod 600 {path}"
        )


def _user_from(name: Any, table: Any, path: Path) -> User:
    where = f"users file {path}"
    if not isinstance(name, str) or not isinstance(table, Mapping):
        raise ConfigError(f"{where}: each user is a table [users.NAME]")
    try:
        check_name(name)
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    unknown = set(table) - {"groups", "password"}
    if unknown:
        raise ConfigError(f"{where}: user {name}: unknown key {sorted(unknown)[0]!r}")
    groups = table.get("groups", [])
    if not isinstance(groups, list) or len(groups) > MAX_GROUPS_PER_USER:
        raise ConfigError(
            f"{where}: user {name}: groups must be a list of at most {MAX_GROUPS_PER_USER} names"
        )
    for group in groups:
        try:
            check_name(group if isinstance(group, str) else "", "group name")
        except ValueError as exc:
            raise ConfigError(f"{where}: user {name}: {exc}") from None
    password = table.get("password")
    if not isinstance(password, str):
        raise ConfigError(f"{where}: user {name} has no password hash")
    try:
        _parse_hash(password)
    except ValueError as exc:
        # Never echo the value: it could be a password someone wrote in clear by mistake.
        raise ConfigError(f"{where}: user {name}: password is not a valid hash ({exc})") from None
    return User(name, tuple(groups), password)


def load_users(path: Path) -> UsersFile:
    """Read and check a users file; raise `ConfigError` naming the file (and its mode when group
    or others may access it)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError as exc:
        raise ConfigError(f"cannot read users file {path}: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise ConfigError(f"users file {path} is not a regular file")
        _check_mode(path, info.st_mode)
        if info.st_size > MAX_USERS_FILE_BYTES:
            raise ConfigError(f"users file {path} is larger than {MAX_USERS_FILE_BYTES} bytes")
        raw = f.read(MAX_USERS_FILE_BYTES + 1)
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"users file {path} is not valid TOML: {exc}") from None
    if data.get("format", FORMAT) != FORMAT:
        raise ConfigError(f"users file {path}: unknown format {data.get('format')!r}")
    users = data.get("users", {})
    if not isinstance(users, Mapping):
        raise ConfigError(f"users file {path}: [users] must be a table")
    return UsersFile(_user_from(name, table, path) for name, table in users.items())


def _toml_string(text: str) -> str:
    # Names and hashes are plain ASCII (checked); JSON's quoting is valid TOML for them.
    return json.dumps(text)


def _render(users: UsersFile) -> str:
    lines = [
        "# Sluice users, written by `sluice user`. Keep this file readable by its owner only.",
        f"format = {FORMAT}",
    ]
    for name in sorted(users.users):
        user = users.users[name]
        groups = ", ".join(_toml_string(g) for g in user.groups)
        lines += [
            "",
            f"[users.{_toml_string(name)}]",
            f"groups = [{groups}]",
            f"password = {_toml_string(user.password_hash)}",
        ]
    return "\n".join(lines) + "\n"


def save_users(path: Path, users: UsersFile) -> None:
    """Write the users file atomically with mode 0600: a new file beside it, synced, renamed."""
    directory = path.parent
    tmp = directory / f".{path.name}.{secrets.token_hex(8)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), 0o600)  # whatever the umask
            f.write(_render(users).encode("utf-8"))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    with contextlib.suppress(OSError):
        dir_fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
