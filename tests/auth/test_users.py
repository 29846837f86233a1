"""The users file: scrypt hashes (salted, parameters kept with them, compared in constant time),
the round trip through the file, and the refusals: bad mode, bad names, clear-text passwords."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sluice.auth.identity import Identity
from sluice.auth.users import (
    DEFAULT_PARAMS,
    ScryptParams,
    User,
    UsersFile,
    check_name,
    hash_password,
    load_users,
    save_users,
    verify_password,
)
from sluice.errors import ConfigError

# Cheap parameters for tests: the format is the same.
FAST = ScryptParams(ln=10, r=8, p=1)


def test_a_hash_is_salted_and_verifies_only_its_password() -> None:
    first = hash_password("s3cret", FAST)
    second = hash_password("s3cret", FAST)
    assert first != second  # a new salt each time
    assert "s3cret" not in first
    assert first.startswith("$scrypt$ln=10,r=8,p=1$")
    assert verify_password("s3cret", first)
    assert not verify_password("s3cret!", first)
    assert not verify_password("", first)


def test_the_parameters_travel_with_the_hash_so_they_can_be_raised() -> None:
    old = hash_password("pw", ScryptParams(ln=11, r=4, p=1))
    new = hash_password("pw", FAST)
    assert verify_password("pw", old)
    assert verify_password("pw", new)
    assert DEFAULT_PARAMS.ln >= 15  # what `sluice user` writes


@pytest.mark.parametrize(
    "params", [ScryptParams(9, 8, 1), ScryptParams(21, 8, 1), ScryptParams(20, 32, 1)]
)
def test_weak_or_ruinous_parameters_are_refused(params: ScryptParams) -> None:
    with pytest.raises(ValueError, match="scrypt parameters"):
        hash_password("pw", params)


def test_a_hash_with_ruinous_parameters_never_verifies() -> None:
    # A hand-edited file asking for 2**30 rounds is refused, not run.
    forged = hash_password("pw", FAST).replace("ln=10", "ln=30")
    assert not verify_password("pw", forged)


def test_unknown_users_and_bad_hashes_are_refused() -> None:
    assert not verify_password("pw", None)
    assert not verify_password("pw", "pw")  # a clear-text password is not a hash
    assert not verify_password("x" * 2000, hash_password("pw", FAST))


def test_file_round_trip_with_mode_0600(tmp_path: Path) -> None:
    path = tmp_path / "users.toml"
    users = UsersFile(
        [
            User("alice", ("ops", "billing"), hash_password("alice-pw", FAST)),
            User("bob@example.com", (), hash_password("bob-pw", FAST)),
        ]
    )
    save_users(path, users)
    assert path.stat().st_mode & 0o777 == 0o600
    text = path.read_text()
    assert "alice-pw" not in text
    assert "bob-pw" not in text
    assert [p.name for p in tmp_path.iterdir()] == ["users.toml"]  # no temporary file left
    again = load_users(path)
    assert again.users == users.users
    assert again.authenticate("alice", "alice-pw") == Identity(
        "alice", frozenset({"ops", "billing"})
    )
    assert again.authenticate("alice", "bob-pw") is None
    assert again.authenticate("nobody", "alice-pw") is None


def test_saving_replaces_the_file_atomically_and_fixes_its_mode(tmp_path: Path) -> None:
    path = tmp_path / "users.toml"
    save_users(path, UsersFile([User("a", (), hash_password("pw", FAST))]))
    os.chmod(path, 0o644)
    save_users(path, UsersFile([User("b", (), hash_password("pw", FAST))]))
    assert path.stat().st_mode & 0o777 == 0o600
    assert list(load_users(path).users) == ["b"]


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o660, 0o602])
def test_a_file_others_can_access_is_refused_naming_file_and_mode(
    tmp_path: Path, mode: int
) -> None:
    path = tmp_path / "users.toml"
    save_users(path, UsersFile([User("a", (), hash_password("pw", FAST))]))
    os.chmod(path, mode)
    with pytest.raises(ConfigError) as info:
        load_users(path)
    message = str(info.value)
    assert str(path) in message
    assert f"{mode:04o}" in message
    assert "chmod 600" in message


def test_a_clear_text_password_in_the_file_is_refused_without_echoing_it(tmp_path: Path) -> None:
    path = tmp_path / "users.toml"
    path.write_text('[users.alice]\npassword = "hunter2"\n')
    path.chmod(0o600)
    with pytest.raises(ConfigError, match="not a valid hash") as info:
        load_users(path)
    assert "hunter2" not in str(info.value)


def test_a_missing_or_invalid_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read users file"):
        load_users(tmp_path / "absent.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[users\n")
    bad.chmod(0o600)
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_users(bad)


@pytest.mark.parametrize("name", ["", "a b", "a:b", "a,b", "x" * 129, "-a", "anonymous", "é"])
def test_bad_user_names_are_refused(name: str) -> None:
    with pytest.raises(ValueError):
        check_name(name)
