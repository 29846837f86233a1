"""`sluice user add|remove|passwd|list --file FILE`: edit the broker's users file.

The password comes from the terminal (asked twice, never echoed) or, with `--password-stdin`,
from the first line of standard input; it is never taken from the command line, where other
users of the machine could see it. The file is rewritten atomically with mode 0600.
"""

from __future__ import annotations

import argparse
import getpass
import sys
from pathlib import Path
from typing import Any

from sluice.cli.common import Runner, UsageError
from sluice.cli.exitcodes import ExitCode

__all__ = ["add_parsers"]


def add_parsers(sub: Any) -> dict[str, Runner]:
    """Add `user` to the subcommand parsers; return its runner by name."""
    u = sub.add_parser("user", help="add, remove, re-password or list the broker's users")
    u.add_argument("action", choices=["add", "remove", "passwd", "list"])
    u.add_argument("name", nargs="?", help="the user (not for list)")
    u.add_argument("--file", type=Path, required=True, help="the users file ([auth] users_file)")
    u.add_argument("--groups", default=None, help="comma-separated groups (add; passwd keeps them)")
    u.add_argument(
        "--password-stdin",
        action="store_true",
        help="read the password from the first line of standard input instead of the terminal",
    )
    return {"user": _run_user}


def _groups(text: str | None) -> tuple[str, ...]:
    from sluice.auth.users import check_name  # noqa: PLC0415 - keeps start-up light

    if text is None:
        return ()
    groups = tuple(g.strip() for g in text.split(",") if g.strip())
    try:
        for group in groups:
            check_name(group, "group name")
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return groups


def _password(from_stdin: bool) -> str:
    if from_stdin:
        line = sys.stdin.readline()
        password = line[:-1] if line.endswith("\n") else line
    else:
        password = getpass.getpass("Password: ")
        if password and getpass.getpass("Password again: ") != password:
            raise UsageError("the passwords differ")
    if not password:
        raise UsageError("empty password refused")
    return password


def _run_user(args: argparse.Namespace) -> int:
    from sluice.auth import users as users_mod  # noqa: PLC0415

    path: Path = args.file
    action: str = args.action
    users = users_mod.load_users(path) if path.exists() else users_mod.UsersFile()
    if action == "list":
        for name in sorted(users.users):
            print(f"{name}\t{','.join(users.users[name].groups)}")
        return ExitCode.OK
    name = args.name
    if name is None:
        raise UsageError(f"user {action} needs a user name")
    try:
        users_mod.check_name(name)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    existing = users.get(name)
    if action == "remove":
        if not users.remove(name):
            print(f"sluice user: no user {name} in {path}", file=sys.stderr)
            return ExitCode.FAILURE
    elif action == "add":
        if existing is not None:
            print(f"sluice user: {name} exists in {path}; use passwd", file=sys.stderr)
            return ExitCode.FAILURE
        groups = _groups(args.groups)
        users.put(users_mod.User(name, groups, _hash(args)))
    else:
        if existing is None:
            print(f"sluice user: no user {name} in {path}", file=sys.stderr)
            return ExitCode.FAILURE
        groups = existing.groups if args.groups is None else _groups(args.groups)
        users.put(users_mod.User(name, groups, _hash(args)))
    users_mod.save_users(path, users)
    print(f"{action}: {name} ({path})", file=sys.stderr)
    return ExitCode.OK


def _hash(args: argparse.Namespace) -> str:
    from sluice.auth.users import hash_password  # noqa: PLC0415

    return hash_password(_password(args.password_stdin))
