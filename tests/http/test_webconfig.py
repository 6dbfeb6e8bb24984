"""exporter.http.webconfig against real files, cross-checked with ``promtool check web-config``
(exporter-toolkit's own parser): what it accepts we accept unless we are deliberately
stricter, and each such difference is listed here."""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

import bcrypt
import pytest
from cryptography.hazmat.primitives import serialization

from agent.core.errors import ConfigError
from exporter.http.webconfig import load_web_config
from tests.promharness import PromtoolError, promtool_check_web_config, write_test_pki

PASSWORD = "correct horse"


@pytest.fixture(scope="module")
def bcrypt_hash() -> str:
    return bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()


@pytest.fixture
def config_dir(tmp_path: Path) -> Path:
    """A directory holding a test PKI under ``pki/`` (config files use relative paths)."""
    write_test_pki(tmp_path / "pki")
    key = serialization.load_pem_private_key((tmp_path / "pki/server.key").read_bytes(), None)
    (tmp_path / "pki/encrypted.key").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"secret"),
        )
    )
    (tmp_path / "pki/adir").mkdir()
    return tmp_path


TLS = "tls_server_config: {cert_file: pki/server.crt, key_file: pki/server.key"


def write(directory: Path, text: str, name: str = "web.yml") -> Path:
    path = directory / name
    path.write_text(text)
    return path


def test_full_config_loads_with_paths_relative_to_the_file(
    config_dir: Path, bcrypt_hash: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    path = write(
        config_dir,
        f"""\
tls_server_config:
  cert_file: pki/server.crt
  key_file: pki/server.key
  client_auth_type: RequireAndVerifyClientCert
  client_ca_file: pki/ca.crt
  min_version: TLS13
  max_version: TLS13
  prefer_server_cipher_suites: false
http_server_config:
  http2: false
  headers:
    X-Frame-Options: deny
    Strict-Transport-Security: max-age=31536000
basic_auth_users:
  prometheus: '{bcrypt_hash}'
  "alice": '{bcrypt_hash}'
""",
    )
    promtool_check_web_config(path)
    # Loaded from elsewhere: relative paths follow the file, not the working directory.
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(tmp_path_factory.mktemp("elsewhere"))
        config = load_web_config(str(path))
    assert config.source == str(path)
    assert config.tls is not None
    assert config.tls.cert_file == str(config_dir / "pki/server.crt")
    assert config.tls.key_file == str(config_dir / "pki/server.key")
    assert config.tls.client_ca_file == str(config_dir / "pki/ca.crt")
    assert config.tls.client_auth_type == "RequireAndVerifyClientCert"
    assert (config.tls.min_version, config.tls.max_version) == ("TLS13", "TLS13")
    assert config.tls.prefer_server_cipher_suites is False
    assert dict(config.headers) == {
        "X-Frame-Options": "deny",
        "Strict-Transport-Security": "max-age=31536000",
    }
    assert config.user_names == ("alice", "prometheus")
    assert config.basic_auth_users["prometheus"] == bcrypt_hash
    assert bcrypt_hash not in repr(config)  # safe to log
    ctx = config.tls.ssl_context()
    assert ctx.verify_mode == ssl.CERT_REQUIRED
    assert ctx.minimum_version == ssl.TLSVersion.TLSv1_3


def test_config_is_frozen(config_dir: Path, bcrypt_hash: str) -> None:
    config = load_web_config(str(write(config_dir, f"basic_auth_users: {{a: '{bcrypt_hash}'}}")))
    with pytest.raises(AttributeError):
        config.tls = None  # type: ignore[misc]
    with pytest.raises(TypeError):
        config.basic_auth_users["b"] = bcrypt_hash  # type: ignore[index]


@pytest.mark.parametrize(
    ("text", "verify_mode"),
    [
        (TLS + "}", ssl.CERT_NONE),
        (TLS + ", client_auth_type: NoClientCert}", ssl.CERT_NONE),
        # exporter-toolkit asks for a certificate and ignores it; we do not ask.
        (TLS + ", client_auth_type: RequestClientCert}", ssl.CERT_NONE),
        (
            TLS + ", client_auth_type: VerifyClientCertIfGiven, client_ca_file: pki/ca.crt}",
            ssl.CERT_OPTIONAL,
        ),
        (
            TLS + ", client_auth_type: RequireAndVerifyClientCert, client_ca_file: pki/ca.crt}",
            ssl.CERT_REQUIRED,
        ),
    ],
)
def test_client_auth_types(config_dir: Path, text: str, verify_mode: ssl.VerifyMode) -> None:
    path = write(config_dir, text)
    promtool_check_web_config(path)
    config = load_web_config(str(path))
    assert config.tls is not None
    ctx = config.tls.ssl_context()
    assert ctx.verify_mode == verify_mode
    assert ctx.minimum_version == ssl.TLSVersion.TLSv1_2  # exporter-toolkit's default


@pytest.mark.parametrize(
    "text",
    ["", "# nothing\n", "tls_server_config: {}\nbasic_auth_users:\n", "http_server_config: {}"],
)
def test_empty_configs_mean_plain_http_without_auth(config_dir: Path, text: str) -> None:
    path = write(config_dir, text)
    promtool_check_web_config(path)
    config = load_web_config(str(path))
    assert config.tls is None
    assert not config.basic_auth_users
    assert not config.headers


@dataclass(frozen=True)
class Bad:
    id: str
    text: str
    key: str  # must appear in the message
    toolkit_rejects: bool  # False: fabricscope is deliberately stricter than exporter-toolkit


BAD = [
    Bad("unknown top key", "foo: 1\n", "foo: unknown key", True),
    Bad("unknown tls key", TLS + ", bogus: 1}", "tls_server_config.bogus: unknown key", True),
    Bad("top level is a list", "- a\n- b\n", "the top level", True),
    Bad("tls section not a mapping", "tls_server_config: 5\n", "tls_server_config", True),
    Bad(
        "cert_file not a string",
        "tls_server_config: {cert_file: [a], key_file: pki/server.key}",
        "tls_server_config.cert_file: expected a string",
        True,
    ),
    Bad(
        "key_file missing",
        "tls_server_config: {cert_file: pki/server.crt}",
        "tls_server_config.key_file: missing",
        True,
    ),
    Bad(
        "cert_file missing",
        "tls_server_config: {key_file: pki/server.key}",
        "tls_server_config.cert_file: missing",
        True,
    ),
    Bad(
        "cert_file does not exist",
        "tls_server_config: {cert_file: pki/nope.crt, key_file: pki/server.key}",
        "tls_server_config.cert_file: cannot read",
        True,
    ),
    Bad(
        "key_file is a directory",
        "tls_server_config: {cert_file: pki/server.crt, key_file: pki/adir}",
        "tls_server_config.key_file: cannot read",
        True,
    ),
    Bad(
        "cert_file holds a key",
        "tls_server_config: {cert_file: pki/server.key, key_file: pki/server.key}",
        "tls_server_config.cert_file: no PEM CERTIFICATE",
        True,
    ),
    Bad(
        "key_file holds a certificate",
        "tls_server_config: {cert_file: pki/server.crt, key_file: pki/server.crt}",
        "tls_server_config.key_file: no PEM PRIVATE KEY",
        True,
    ),
    Bad(
        "key of another certificate",
        "tls_server_config: {cert_file: pki/server.crt, key_file: pki/client.key}",
        "tls_server_config.cert_file/key_file: cannot use",
        True,
    ),
    Bad(
        "encrypted key",
        "tls_server_config: {cert_file: pki/server.crt, key_file: pki/encrypted.key}",
        "tls_server_config.key_file:",
        True,
    ),
    Bad(
        "unknown client_auth_type",
        TLS + ", client_auth_type: Sometimes}",
        "tls_server_config.client_auth_type: unknown value",
        True,
    ),
    Bad(
        "client CA without client auth",
        TLS + ", client_ca_file: pki/ca.crt}",
        "tls_server_config.client_ca_file: set, but client_auth_type is NoClientCert",
        True,
    ),
    Bad(
        "client CA file without a certificate",
        TLS + ", client_auth_type: RequireAndVerifyClientCert, client_ca_file: pki/server.key}",
        "tls_server_config.client_ca_file: cannot use",
        False,  # Go's AppendCertsFromPEM quietly adds nothing
    ),
    Bad(
        "unverified client certificates",
        TLS + ", client_auth_type: RequireAnyClientCert}",
        "tls_server_config.client_auth_type: RequireAnyClientCert",
        False,  # Python's ssl cannot require a certificate without verifying it
    ),
    Bad(
        "verification without a CA",
        TLS + ", client_auth_type: RequireAndVerifyClientCert}",
        "tls_server_config.client_ca_file: missing",
        False,  # exporter-toolkit would fall back to the system CA store
    ),
    Bad("TLS 1.1", TLS + ", min_version: TLS11}", "tls_server_config.min_version: TLS11", False),
    Bad("unknown TLS version", TLS + ", max_version: TLS9}", "tls_server_config.max_version", True),
    Bad(
        "min above max",
        TLS + ", min_version: TLS13, max_version: TLS12}",
        "tls_server_config.min_version: TLS13 is above max_version",
        False,
    ),
    Bad(
        "TLS settings without a certificate",
        "tls_server_config: {min_version: TLS13}",
        "tls_server_config.cert_file: missing",
        False,  # exporter-toolkit would serve plain HTTP
    ),
    Bad(
        "cipher_suites",
        TLS + ", cipher_suites: [TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256]}",
        "tls_server_config.cipher_suites: valid for exporter-toolkit but not supported",
        False,
    ),
    Bad("rate_limit", "rate_limit: {burst: 1}\n", "rate_limit: valid for exporter-toolkit", True),
    Bad(
        "prefer_server_cipher_suites not a bool",
        TLS + ", prefer_server_cipher_suites: sure}",
        "tls_server_config.prefer_server_cipher_suites: expected true or false",
        True,
    ),
    Bad("users not a mapping", "basic_auth_users: [alice]\n", "basic_auth_users: expected", True),
    Bad(
        "not a bcrypt hash",
        "basic_auth_users: {alice: 'plaintext-password'}\n",
        "basic_auth_users.alice: not a bcrypt hash",
        True,
    ),
    Bad(
        "md5 crypt hash",
        "basic_auth_users: {alice: '$apr1$abcdefgh$0123456789abcdefghijkl'}\n",
        "basic_auth_users.alice: not a bcrypt hash",
        True,
    ),
    Bad(
        "hash is a number",
        "basic_auth_users: {alice: 12345}\n",
        "basic_auth_users.alice: not a bcrypt hash",
        True,
    ),
    Bad(
        "user listed twice",
        "basic_auth_users: {alice: '{hash}', alice: '{hash}'}\n",
        "duplicate key 'alice'",
        True,
    ),
    Bad(
        "unquoted yes as a user name",
        "basic_auth_users: {yes: '{hash}'}\n",
        "quote it in YAML",
        False,  # Go reads the string "yes"; PyYAML reads true
    ),
    Bad(
        "colon in a user name",
        "basic_auth_users: {'a:b': '{hash}'}\n",
        "basic_auth_users.a:b: a basic auth user name cannot contain ':'",
        False,  # such a user could never log in
    ),
    Bad(
        "header not allowed",
        "http_server_config: {headers: {X-Powered-By: me}}\n",
        "http_server_config.headers.X-Powered-By: this header cannot be configured",
        True,
    ),
    Bad(
        "header value not allowed",
        "http_server_config: {headers: {X-Frame-Options: allow}}\n",
        "http_server_config.headers.X-Frame-Options: 'allow' is not one of deny, sameorigin",
        True,
    ),
    Bad(
        "http2 not a bool",
        "http_server_config: {http2: 2}\n",
        "http_server_config.http2: expected true or false",
        True,
    ),
    Bad("broken YAML", "tls_server_config: [\n", "invalid YAML at line 2", True),
]


@pytest.mark.parametrize("bad", BAD, ids=[b.id for b in BAD])
def test_bad_config_is_refused_naming_file_and_key(
    config_dir: Path, bcrypt_hash: str, bad: Bad
) -> None:
    path = write(config_dir, bad.text.replace("{hash}", bcrypt_hash))
    with pytest.raises(ConfigError) as caught:
        load_web_config(str(path))
    message = str(caught.value)
    assert message.startswith(f"{path}: ")
    assert bad.key in message
    assert bcrypt_hash not in message
    assert "plaintext-password" not in message
    assert caught.value.__suppress_context__  # a clean message, no chained traceback
    if bad.toolkit_rejects:
        with pytest.raises(PromtoolError):
            promtool_check_web_config(path)
    else:
        promtool_check_web_config(path)  # the difference is ours, on purpose


def test_unreadable_config_file_names_it(tmp_path: Path) -> None:
    path = tmp_path / "missing.yml"
    with pytest.raises(ConfigError, match=f"^{path}: cannot read web config: No such file"):
        load_web_config(str(path))
