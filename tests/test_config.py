"""Configuration: the disk settings of [store], their checks, and the old names they replace."""

from __future__ import annotations

from pathlib import Path

import pytest

from sluice import config as config_mod
from sluice.config import MiB, StoreFullPolicy
from sluice.errors import ConfigError


def test_store_disk_settings_default_to_the_free_disk_less_two_files() -> None:
    cfg = config_mod.load(env={})
    assert cfg.store.max_bytes == 0
    assert cfg.store.store_full is StoreFullPolicy.BLOCK
    assert cfg.store.reserve_bytes == 0
    assert cfg.store.disk_reserve_bytes == 2 * cfg.store.journal_file_bytes


def test_store_disk_settings_from_toml_and_environment(tmp_path: Path) -> None:
    path = tmp_path / "sluice.toml"
    path.write_text('[store]\nmax_bytes = 1000000000\nstore_full = "error"\n')
    cfg = config_mod.load(path, env={"SLUICE_STORE__RESERVE_BYTES": str(96 * MiB)})
    assert cfg.store.max_bytes == 1_000_000_000
    assert cfg.store.store_full is StoreFullPolicy.ERROR
    assert cfg.store.disk_reserve_bytes == 96 * MiB


def test_old_limit_names_are_aliases(tmp_path: Path) -> None:
    path = tmp_path / "sluice.toml"
    path.write_text("[limits]\nstore_limit_bytes = 12345\nsend_fail_if_no_space = true\n")
    cfg = config_mod.load(path, env={})
    assert cfg.store.max_bytes == 12345
    assert cfg.store.store_full is StoreFullPolicy.ERROR
    env = {"SLUICE_LIMITS__SEND_FAIL_IF_NO_SPACE": "false"}
    assert config_mod.load(path, env=env).store.store_full is StoreFullPolicy.BLOCK


@pytest.mark.parametrize(
    ("section", "text", "complaint"),
    [
        ("store", 'store_full = "drop"', "invalid value 'drop' for store_full"),
        ("store", "max_bytes = -1", "store.max_bytes must not be negative"),
        ("store", f"reserve_bytes = {MiB}", "must hold at least one journal file"),
        ("limits", 'send_fail_if_no_space = "maybe"', "for send_fail_if_no_space"),
        ("limits", "store_limit_bytes = true", "for store_limit_bytes"),
    ],
)
def test_bad_disk_settings_are_refused(
    tmp_path: Path, section: str, text: str, complaint: str
) -> None:
    path = tmp_path / "sluice.toml"
    path.write_text(f"[{section}]\n{text}\n")
    with pytest.raises(ConfigError, match=complaint):
        config_mod.load(path, env={})
