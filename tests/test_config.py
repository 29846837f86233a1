"""Configuration: the disk settings of [store], their checks, and the old names they replace;
[auth], [[acl]], [[listeners]], [latency] and the WebSocket keys of [http]."""

from __future__ import annotations

from pathlib import Path

import pytest

from sluice import config as config_mod
from sluice.config import ClientCertPolicy, MiB, StoreFullPolicy
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


# -- [auth] and [[acl]] ---------------------------------------------------------------------------


def test_auth_and_acl_are_read(tmp_path: Path) -> None:
    path = tmp_path / "sluice.toml"
    path.write_text(
        '[auth]\nusers_file = "users.toml"\nallow_anonymous = true\n'
        '[[acl]]\ndestination = "/queue/orders.>"\nread = ["ops", "billing"]\nwrite = ["shop"]\n'
        'admin = ["ops"]\n'
        '[[acl]]\ndestination = "/topic/>"\nread = ["*"]\n'
    )
    cfg = config_mod.load(path, env={})
    # A relative users file is found beside the configuration file.
    assert cfg.auth == config_mod.AuthSettings(tmp_path / "users.toml", allow_anonymous=True)
    assert cfg.acl == (
        config_mod.AclRule("/queue/orders.>", ("ops", "billing"), ("shop",), ("ops",)),
        config_mod.AclRule("/topic/>", read=("*",)),
    )


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ('[auth]\nusers_file = ""\n', "users_file must be a file name"),
        ("[auth]\nallow_anonymous = 3\n", "allow_anonymous must be true or false"),
        ("[auth]\nuser_file = 'x'\n", "unknown setting 'user_file'"),
        ('[[acl]]\ndestination = "orders"\n', 'needs destination = "/queue/..."'),
        ('[[acl]]\ndestination = "/queue/a.>.b"\n', "'>' may only be the last word"),
        ('[[acl]]\ndestination = "/queue/a"\nread = "ops"\n', "read must be a list"),
        ('[[acl]]\ndestination = "/queue/a"\nwrite = [""]\n', "write must be a list"),
        ('[[acl]]\ndestination = "/queue/a"\nreed = ["x"]\n', "rule 1: unknown setting 'reed'"),
        ('[acl]\ndestination = "/queue/a"\n', "[[acl]] must be an array of tables"),
    ],
)
def test_bad_auth_and_acl_settings_are_named(tmp_path: Path, toml: str, message: str) -> None:
    path = tmp_path / "sluice.toml"
    path.write_text(toml)
    with pytest.raises(ConfigError) as info:
        config_mod.load(path, env={})
    assert message in str(info.value)


@pytest.mark.parametrize("host", ["0.0.0.0", "192.168.1.10", "::", "", "broker.example.com"])
def test_listening_beyond_loopback_without_users_is_refused(host: str) -> None:
    with pytest.raises(ConfigError) as info:
        config_mod.load(env={}, overrides={"stomp": {"host": host}})
    message = str(info.value)
    assert "beyond loopback" in message
    assert "users_file" in message
    assert "allow_anonymous = true" in message


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1", "localhost"])
def test_loopback_without_users_is_allowed(host: str) -> None:
    assert config_mod.load(env={}, overrides={"stomp": {"host": host}}).stomp.host == host


def test_beyond_loopback_with_users_or_anonymous_allowed(tmp_path: Path) -> None:
    allowed = {"stomp": {"host": "0.0.0.0"}, "auth": {"allow_anonymous": True}}
    assert config_mod.load(env={}, overrides=allowed).auth.allow_anonymous
    users = {"stomp": {"host": "0.0.0.0"}, "auth": {"users_file": str(tmp_path / "u.toml")}}
    assert config_mod.load(env={}, overrides=users).auth.users_file == tmp_path / "u.toml"
    env = {"SLUICE_STOMP__HOST": "0.0.0.0", "SLUICE_AUTH__ALLOW_ANONYMOUS": "true"}
    assert config_mod.load(env=env).auth.allow_anonymous


def test_login_limits_and_connect_timeout_live_in_limits() -> None:
    limits = config_mod.load(env={}).limits
    assert limits.connect_timeout_s == 30.0
    assert limits.login_lockout_failures >= 1
    with pytest.raises(ConfigError, match="login_lockout_failures"):
        config_mod.load(env={}, overrides={"limits": {"login_lockout_failures": 0}})


# -- [[listeners]] and TLS -----------------------------------------------------------------------


def _pem_files(directory: Path) -> None:
    # Only their existence is checked here; what they hold is `sluice.auth.tls`'s business.
    for name in ("server.pem", "server.key", "ca.pem"):
        (directory / name).write_text("x")


def test_listeners_replace_stomp(tmp_path: Path) -> None:
    _pem_files(tmp_path)
    path = tmp_path / "sluice.toml"
    path.write_text(
        "[[listeners]]\nport = 61613\n\n"
        '[[listeners]]\nhost = "127.0.0.1"\nport = 61612\n'
        'tls = { cert = "server.pem", key = "server.key", ca = "ca.pem", '
        'client_cert = "required", crl = "ca.pem" }\n'
    )
    cfg = config_mod.load(path, env={})
    plain, tls = cfg.stomp_listeners
    assert (plain.port, plain.tls) == (61613, None)
    assert tls.tls is not None
    # Relative to the configuration file.
    assert tls.tls.cert == tmp_path / "server.pem"
    assert tls.tls.client_cert is ClientCertPolicy.REQUIRED
    assert tls.tls.crl == tmp_path / "ca.pem"
    assert config_mod.load(env={}).stomp_listeners == (config_mod.Listener(),)


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ('[[listeners]]\nport = 1\ntls = { cert = "server.pem" }\n', "tls needs key"),
        (
            '[[listeners]]\nport = 1\ntls = { cert = "nope.pem", key = "server.key" }\n',
            r"cannot read the certificate \(tls.cert\) .*nope.pem: No such file",
        ),
        (
            '[[listeners]]\nport = 1\ntls = { cert = "server.pem", key = "gone.key" }\n',
            r"cannot read the private key \(tls.key\)",
        ),
        (
            '[[listeners]]\nport = 1\ntls = { cert = "server.pem", key = "server.key", '
            'client_cert = "required" }\n',
            "client_cert = 'required' needs tls.ca",
        ),
        (
            '[[listeners]]\nport = 1\ntls = { cert = "server.pem", key = "server.key", '
            'client_cert = "maybe" }\n',
            "client_cert must be none, optional or required",
        ),
        (
            '[[listeners]]\nport = 1\ntls = { cert = "server.pem", key = "server.key", '
            'crl = "ca.pem" }\n',
            "tls.crl checks client certificates, which tls.client_cert = 'none' never asks for",
        ),
        (
            '[[listeners]]\nport = 1\ntls = { cert = "server.pem", key = "server.key", '
            'ca = "ca.pem", client_cert = "required", crl = "gone-crl.pem" }\n',
            r"cannot read the revocation list \(tls.crl\)",
        ),
        ("[[listeners]]\nport = 7000\n[[listeners]]\nport = 7000\n", "listed twice"),
        ("[[listeners]]\nport = 70000\n", "port out of range"),
        ("[[listeners]]\nhost = 'localhost'\n", "needs port"),
        ("[[listeners]]\nport = 1\nssl = true\n", "unknown setting 'ssl'"),
        ("[stomp]\nport = 1\n[[listeners]]\nport = 2\n", r"\[\[listeners\]\] replaces \[stomp\]"),
        ('[stomp]\ntls = { cert = "a", key = "b" }\n', "tls goes in a"),
        (
            "[[listeners]]\nport = 1\n[[listeners]]\nhost = '0.0.0.0'\nport = 2\n",
            "listens beyond loopback",
        ),
    ],
)
def test_bad_listeners_are_named(tmp_path: Path, toml: str, message: str) -> None:
    _pem_files(tmp_path)
    path = tmp_path / "sluice.toml"
    path.write_text(toml)
    with pytest.raises(ConfigError, match=message):
        config_mod.load(path, env={})


def test_http_tls_is_a_listeners_tls(tmp_path: Path) -> None:
    _pem_files(tmp_path)
    path = tmp_path / "sluice.toml"
    path.write_text(
        '[http]\nport = 8443\ntls = { cert = "server.pem", key = "server.key", ca = "ca.pem", '
        'client_cert = "optional" }\n'
    )
    tls = config_mod.load(path, env={}).http.tls
    assert tls is not None
    assert (tls.cert, tls.key, tls.ca) == (
        tmp_path / "server.pem",
        tmp_path / "server.key",
        tmp_path / "ca.pem",
    )
    assert tls.client_cert is ClientCertPolicy.OPTIONAL
    assert config_mod.load(env={}).http.tls is None
    # Files that are not there do not matter while the management server is off.
    config_mod.load(
        env={}, overrides={"http": {"enabled": False, "tls": {"cert": "/no/c", "key": "/no/k"}}}
    )


@pytest.mark.parametrize(
    ("tls", "message"),
    [
        ('{ cert = "server.pem" }', r"\[http\]: tls needs key"),
        ('{ cert = "nope.pem", key = "server.key" }', r"\[http\]: cannot read the certificate"),
        (
            '{ cert = "server.pem", key = "server.key", client_cert = "required" }',
            "client_cert = 'required' needs tls.ca",
        ),
        (
            '{ cert = "server.pem", key = "server.key", crl = "ca.pem" }',
            "tls.crl checks client certificates",
        ),
        ('{ cert = "server.pem", key = "server.key", verify = true }', "unknown tls setting"),
        ('"server.pem"', "tls must be a table"),
    ],
)
def test_bad_http_tls_is_named(tmp_path: Path, tls: str, message: str) -> None:
    _pem_files(tmp_path)
    path = tmp_path / "sluice.toml"
    path.write_text(f"[http]\ntls = {tls}\n")
    with pytest.raises(ConfigError, match=message):
        config_mod.load(path, env={})


def test_http_tls_beyond_loopback_still_needs_users(tmp_path: Path) -> None:
    # A client certificate is a login of the users file: without one, TLS changes nothing.
    _pem_files(tmp_path)
    path = tmp_path / "sluice.toml"
    path.write_text(
        '[http]\nhost = "0.0.0.0"\ntls = { cert = "server.pem", key = "server.key", '
        'ca = "ca.pem", client_cert = "required" }\n'
    )
    with pytest.raises(ConfigError, match=r"http\.host = '0\.0\.0\.0' listens beyond loopback"):
        config_mod.load(path, env={})


def test_stomp_from_the_command_line_conflicts_with_listeners(tmp_path: Path) -> None:
    path = tmp_path / "sluice.toml"
    path.write_text("[[listeners]]\nport = 2\n")
    with pytest.raises(ConfigError, match="--stomp"):
        config_mod.load(path, env={}, overrides={"stomp": {"port": 0}})


# -- [latency] ------------------------------------------------------------------------------------


def test_latency_hops_are_off_by_default_and_read_from_toml_and_environment(
    tmp_path: Path,
) -> None:
    assert config_mod.load(env={}).latency == config_mod.LatencySettings(False, None)
    path = tmp_path / "sluice.toml"
    path.write_text('[store]\nkind = "journal"\n[latency]\nhops = true\nhops_file = "h.json"\n')
    cfg = config_mod.load(path, env={})
    assert cfg.latency.hops
    assert cfg.latency.hops_file == Path("h.json")
    env = {"SLUICE_LATENCY__HOPS_FILE": "/tmp/other.json"}
    assert config_mod.load(path, env=env).latency.hops_file == Path("/tmp/other.json")


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ('[latency]\nhops_file = "h.json"\n', "only with latency.hops = true"),
        ('[store]\nkind = "memory"\n[latency]\nhops = true\n', "needs store.kind = 'journal'"),
        ('[latency]\nhops = "often"\n', "invalid value 'often' for hops"),
        ("[latency]\nevery = 2\n", "unknown setting 'every'"),
    ],
)
def test_bad_latency_settings_are_refused(tmp_path: Path, text: str, complaint: str) -> None:
    path = tmp_path / "sluice.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=complaint):
        config_mod.load(path, env={})


def test_websocket_settings_from_file_and_environment(tmp_path: Path) -> None:
    assert config_mod.load(env={}).ws_max_message_bytes == config_mod.Limits().max_frame_bytes
    path = tmp_path / "sluice.toml"
    path.write_text(
        '[http]\nws_max_message_bytes = 1048576\nws_allowed_origins = ["https://a.example"]\n'
    )
    cfg = config_mod.load(path, env={})
    assert cfg.ws_max_message_bytes == 1048576
    assert cfg.http.ws_allowed_origins == ("https://a.example",)
    env = {"SLUICE_HTTP__WS_ALLOWED_ORIGINS": "https://a.example, https://b.example"}
    assert config_mod.load(env=env).http.ws_allowed_origins == (
        "https://a.example",
        "https://b.example",
    )
    with pytest.raises(ConfigError, match="ws_allowed_origins"):
        config_mod.load(env={}, overrides={"http": {"ws_allowed_origins": [1, 2]}})
    with pytest.raises(ConfigError, match="ws_max_message_bytes"):
        config_mod.load(env={}, overrides={"http": {"ws_max_message_bytes": -1}})


def test_ha_is_off_by_default_and_read_from_toml_and_environment(tmp_path: Path) -> None:
    assert config_mod.load(env={}).ha == config_mod.HaSettings(config_mod.HaRole.OFF, 10.0)
    path = tmp_path / "sluice.toml"
    path.write_text('[ha]\nrole = "auto"\nlease_s = 4\n')
    ha = config_mod.load(path, env={}).ha
    assert ha.role is config_mod.HaRole.AUTO
    assert ha.lease_s == 4.0
    ha = config_mod.load(env={"SLUICE_HA__ROLE": "master-only", "SLUICE_HA__LEASE_S": "2.5"}).ha
    assert (ha.role, ha.lease_s) == (config_mod.HaRole.MASTER_ONLY, 2.5)


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ('[ha]\nrole = "primary"', "invalid value 'primary' for role"),
        ("[ha]\nlease_s = 0.5", "ha.lease_s must be between 1 and 600 s"),
        ("[ha]\nlease_s = 3600", "ha.lease_s must be between 1 and 600 s"),
        ('[ha]\nrole = "auto"\n[store]\nkind = "memory"', "needs store.kind = 'journal'"),
        ("[ha]\nwitness = 1", "unknown setting 'witness'"),
    ],
)
def test_bad_ha_settings_are_named(tmp_path: Path, toml: str, message: str) -> None:
    path = tmp_path / "sluice.toml"
    path.write_text(toml)
    with pytest.raises(ConfigError, match=message):
        config_mod.load(path, env={})
