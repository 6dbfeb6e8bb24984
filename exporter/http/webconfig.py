"""The ``--web.config.file`` YAML, in the format of prometheus/exporter-toolkit (the one
node_exporter and Prometheus itself read), so one file works for every exporter on a host
and ``promtool check web-config`` checks ours too.

Supported::

    tls_server_config:
      cert_file: server.crt          # relative paths are relative to this file's directory
      key_file: server.key
      client_auth_type: RequireAndVerifyClientCert
      client_ca_file: ca.crt
      min_version: TLS12             # TLS12 (default) or TLS13
      max_version: TLS13
      prefer_server_cipher_suites: true
    http_server_config:
      http2: false                   # accepted and ignored: fabricscope speaks HTTP/1.1 only
      headers:
        X-Frame-Options: deny
    basic_auth_users:
      prometheus: $2y$10$...         # bcrypt hash (htpasswd -nBC 10 "" | tr -d ':')

Loading is stricter than exporter-toolkit, on purpose (a web config guards access, and a
setting that is silently ignored is worse than a refusal to start):

- unknown keys, wrong types, duplicate keys -> ``ConfigError``; keys exporter-toolkit knows
  but fabricscope does not implement (``cipher_suites``, ``curve_preferences``, inline
  ``cert``/``key``/``client_ca``, ``client_allowed_sans``, ``rate_limit``) are refused by
  name rather than ignored;
- a ``tls_server_config`` with any setting needs both ``cert_file`` and ``key_file``;
- ``client_auth_type: RequireAnyClientCert`` (a client certificate required but never
  verified) is refused: Python's ``ssl`` module cannot accept a certificate it does not
  verify. Use ``RequireAndVerifyClientCert`` with ``client_ca_file``;
- ``RequestClientCert`` is accepted and asks for nothing: exporter-toolkit asks for a
  certificate without verifying or using it, which grants nothing either way;
- the verifying modes need ``client_ca_file`` (no fallback to the system's CA store);
- ``TLS10``/``TLS11`` are refused (RFC 8996).

Errors name the file and the key (``web.yml: tls_server_config.cert_file: ...``) and never
include a password hash.
"""

from __future__ import annotations

import functools
import os
import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Literal, NoReturn, cast

from agent.core.errors import ConfigError

if TYPE_CHECKING:  # imported when a web config file is read: about 1 MiB resident otherwise
    import yaml

ClientAuthType = Literal[
    "NoClientCert",
    "RequestClientCert",
    "VerifyClientCertIfGiven",
    "RequireAndVerifyClientCert",
]
TLSVersionName = Literal["TLS12", "TLS13"]

_CLIENT_AUTH_TYPES: tuple[ClientAuthType, ...] = (
    "NoClientCert",
    "RequestClientCert",
    "VerifyClientCertIfGiven",
    "RequireAndVerifyClientCert",
)
_TLS_VERSIONS: dict[str, ssl.TLSVersion] = {
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}

#: Header names (and, where it is an enumeration, values) exporter-toolkit lets a web
#: config set; anything else is refused, as exporter-toolkit does.
ALLOWED_HEADERS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "Strict-Transport-Security": (),
        "X-Content-Type-Options": ("nosniff",),
        "X-Frame-Options": ("deny", "sameorigin"),
        "X-XSS-Protection": (),
        "Content-Security-Policy": (),
    }
)

# $2<minor>$<cost>$<22 salt chars><31 hash chars>, cost 4..31, as bcrypt.Cost() accepts.
_BCRYPT = re.compile(r"\$2[abxy]?\$(0[4-9]|[12][0-9]|3[01])\$[./A-Za-z0-9]{53}")

_TOP_KEYS = ("tls_server_config", "http_server_config", "basic_auth_users")
_TLS_KEYS = (
    "cert_file",
    "key_file",
    "client_auth_type",
    "client_ca_file",
    "min_version",
    "max_version",
    "prefer_server_cipher_suites",
)
_HTTP_KEYS = ("http2", "headers")
#: exporter-toolkit keys that fabricscope deliberately does not implement.
_NOT_IMPLEMENTED = {
    "rate_limit": "use a NetworkPolicy or the scraper's own limits",
    "tls_server_config.cert": "put the certificate in a file and use cert_file",
    "tls_server_config.key": "put the key in a file and use key_file",
    "tls_server_config.client_ca": "put the CA in a file and use client_ca_file",
    "tls_server_config.cipher_suites": "the OpenSSL defaults apply",
    "tls_server_config.curve_preferences": "the OpenSSL defaults apply",
    "tls_server_config.client_allowed_sans": "issue client certificates from a dedicated CA",
}


@dataclass(frozen=True, slots=True)
class TLSServerConfig:
    """``tls_server_config`` with paths made absolute."""

    cert_file: str
    key_file: str
    client_auth_type: ClientAuthType = "NoClientCert"
    #: PEM bundle of CAs that sign client certificates; set for the verifying modes.
    client_ca_file: str | None = None
    min_version: TLSVersionName = "TLS12"
    max_version: TLSVersionName = "TLS13"
    prefer_server_cipher_suites: bool = True

    def files(self) -> tuple[str, ...]:
        """Every file the TLS setup reads (to watch for certificate rotation)."""
        out = (self.cert_file, self.key_file)
        return (*out, self.client_ca_file) if self.client_ca_file else out

    def ssl_context(self) -> ssl.SSLContext:
        """A server-side context for this config, reading the files now.

        Raises ``ConfigError`` naming the key whose file is unreadable or invalid."""
        for key, path in (("cert_file", self.cert_file), ("key_file", self.key_file)):
            text = _read_file(key, path)
            marker = "CERTIFICATE-----" if key == "cert_file" else "PRIVATE KEY-----"
            if marker not in text:
                raise ConfigError(f"tls_server_config.{key}: no PEM {marker[:-5]} in {path}")
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = _TLS_VERSIONS[self.min_version]
        ctx.maximum_version = _TLS_VERSIONS[self.max_version]
        if self.prefer_server_cipher_suites:
            ctx.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
        ctx.set_alpn_protocols(["http/1.1"])
        try:
            ctx.load_cert_chain(self.cert_file, self.key_file, password=_no_password)
        except _EncryptedKeyError:
            raise ConfigError(
                f"tls_server_config.key_file: {self.key_file} is encrypted;"
                " a key file must not need a passphrase"
            ) from None
        except ssl.SSLError as e:
            raise ConfigError(
                f"tls_server_config.cert_file/key_file: cannot use {self.cert_file} with"
                f" {self.key_file}: {_ssl_reason(e)}"
            ) from None
        if self.client_auth_type in ("VerifyClientCertIfGiven", "RequireAndVerifyClientCert"):
            assert self.client_ca_file is not None  # enforced by the loader
            _read_file("client_ca_file", self.client_ca_file)
            try:
                ctx.load_verify_locations(cafile=self.client_ca_file)
            except ssl.SSLError as e:
                raise ConfigError(
                    f"tls_server_config.client_ca_file: cannot use {self.client_ca_file}:"
                    f" {_ssl_reason(e)}"
                ) from None
            ctx.verify_mode = (
                ssl.CERT_REQUIRED
                if self.client_auth_type == "RequireAndVerifyClientCert"
                else ssl.CERT_OPTIONAL
            )
        return ctx


@dataclass(frozen=True, slots=True)
class WebConfig:
    """A loaded web config. ``basic_auth_users`` maps user name to bcrypt hash; it is kept
    out of ``repr`` so that logging a config never prints a hash."""

    #: The file it came from, for messages.
    source: str
    tls: TLSServerConfig | None = None
    basic_auth_users: Mapping[str, str] = field(
        default_factory=lambda: MappingProxyType({}), repr=False
    )
    #: Extra response headers (http_server_config.headers).
    headers: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def user_names(self) -> tuple[str, ...]:
        return tuple(sorted(self.basic_auth_users))


def load_web_config(path: str) -> WebConfig:
    """Read and validate ``path``; every problem is a ``ConfigError`` naming file and key.

    TLS files are read once here, so a config that loads also serves."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: cannot read web config: {_os_reason(e)}") from None
    try:
        return _parse(path, text)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None


@functools.cache
def _unique_key_loader() -> type[yaml.SafeLoader]:
    """A SafeLoader that refuses duplicate mapping keys (exporter-toolkit's UnmarshalStrict
    does too), so a user listed twice is an error, not a silent override."""
    import yaml

    class UniqueKeyLoader(yaml.SafeLoader):
        pass

    def construct_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode) -> dict[object, object]:
        seen: set[object] = set()
        for key_node, _ in node.value:
            key = loader.construct_object(key_node)
            if isinstance(key, str | int | float | bool) and key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark
                )
            seen.add(key if isinstance(key, str | int | float | bool) else id(key_node))
        return cast("dict[object, object]", loader.construct_mapping(node))

    UniqueKeyLoader.add_constructor(
        yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, construct_mapping
    )
    return UniqueKeyLoader


def _parse(path: str, text: str) -> WebConfig:
    import yaml

    try:
        doc: object = yaml.load(text, Loader=_unique_key_loader())  # a SafeLoader subclass
    except yaml.YAMLError as e:
        raise ConfigError(_yaml_problem(e)) from None
    if doc is None:
        return WebConfig(source=path)
    top = _mapping(doc, "the top level")
    for key in top:
        _check_key(key, _TOP_KEYS, "")
    base = os.path.dirname(os.path.abspath(path))
    tls = _parse_tls(top.get("tls_server_config"), base)
    headers = _parse_http(top.get("http_server_config"))
    users = _parse_users(top.get("basic_auth_users"))
    config = WebConfig(
        source=path,
        tls=tls,
        basic_auth_users=MappingProxyType(users),
        headers=MappingProxyType(headers),
    )
    if tls is not None:
        tls.ssl_context()  # read and check every file now, not at the first connection
    return config


def _parse_tls(raw: object, base: str) -> TLSServerConfig | None:
    where = "tls_server_config"
    if raw is None:
        return None
    section = _mapping(raw, where)
    for key in section:
        _check_key(key, _TLS_KEYS, where)
    if not section:
        return None
    paths = {
        key: _join(base, _string(section, key, where))
        for key in ("cert_file", "key_file", "client_ca_file")
    }
    for key in ("cert_file", "key_file"):
        if not paths[key]:
            raise ConfigError(f"{where}.{key}: missing; TLS needs both cert_file and key_file")
    auth = _string(section, "client_auth_type", where) or "NoClientCert"
    if auth in ("RequireAnyClientCert", "RequireClientCert"):
        raise ConfigError(
            f"{where}.client_auth_type: {auth} (a certificate required but not verified)"
            " is not supported; use RequireAndVerifyClientCert with client_ca_file"
        )
    if auth not in _CLIENT_AUTH_TYPES:
        raise ConfigError(
            f"{where}.client_auth_type: unknown value {auth!r}; expected one of"
            f" {', '.join(_CLIENT_AUTH_TYPES)}"
        )
    client_auth: ClientAuthType = auth
    ca = paths["client_ca_file"] or None
    if ca is not None and client_auth == "NoClientCert":
        raise ConfigError(
            f"{where}.client_ca_file: set, but client_auth_type is NoClientCert;"
            " set client_auth_type to RequireAndVerifyClientCert or VerifyClientCertIfGiven"
        )
    if ca is None and client_auth in ("VerifyClientCertIfGiven", "RequireAndVerifyClientCert"):
        raise ConfigError(
            f"{where}.client_ca_file: missing; client_auth_type {client_auth} needs the CA"
            " that signs client certificates"
        )
    versions: list[TLSVersionName] = []
    for key, default in (("min_version", "TLS12"), ("max_version", "TLS13")):
        value = _string(section, key, where) or default
        if value in ("TLS10", "TLS11"):
            raise ConfigError(f"{where}.{key}: {value} is not supported (RFC 8996); use TLS12")
        if value not in _TLS_VERSIONS:
            raise ConfigError(f"{where}.{key}: unknown value {value!r}; expected TLS12 or TLS13")
        versions.append(cast("TLSVersionName", value))
    if _TLS_VERSIONS[versions[0]] > _TLS_VERSIONS[versions[1]]:
        raise ConfigError(f"{where}.min_version: {versions[0]} is above max_version")
    prefer = section.get("prefer_server_cipher_suites", True)
    if not isinstance(prefer, bool):
        _wrong_type(f"{where}.prefer_server_cipher_suites", "true or false", prefer)
    return TLSServerConfig(
        cert_file=paths["cert_file"],
        key_file=paths["key_file"],
        client_auth_type=client_auth,
        client_ca_file=ca,
        min_version=versions[0],
        max_version=versions[1],
        prefer_server_cipher_suites=prefer,
    )


def _parse_http(raw: object) -> dict[str, str]:
    where = "http_server_config"
    if raw is None:
        return {}
    section = _mapping(raw, where)
    for key in section:
        _check_key(key, _HTTP_KEYS, where)
    http2 = section.get("http2", True)
    if not isinstance(http2, bool):
        _wrong_type(f"{where}.http2", "true or false", http2)
    raw_headers = section.get("headers")
    if raw_headers is None:
        return {}
    headers: dict[str, str] = {}
    for name, value in _mapping(raw_headers, f"{where}.headers").items():
        key = f"{where}.headers.{name}"
        if name not in ALLOWED_HEADERS:
            raise ConfigError(
                f"{key}: this header cannot be configured; allowed: {', '.join(ALLOWED_HEADERS)}"
            )
        if not isinstance(value, str):
            _wrong_type(key, "a string", value)
        if "\r" in value or "\n" in value:
            raise ConfigError(f"{key}: a header value cannot contain a line break")
        allowed = ALLOWED_HEADERS[name]
        if allowed and value not in allowed:
            raise ConfigError(f"{key}: {value!r} is not one of {', '.join(allowed)}")
        headers[name] = value
    return headers


def _parse_users(raw: object) -> dict[str, str]:
    where = "basic_auth_users"
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        _wrong_type(where, "a mapping", raw)
    out: dict[str, str] = {}
    for name, hashed in cast("dict[object, object]", raw).items():
        if not isinstance(name, str) or not name:
            raise ConfigError(
                f"{where}: user name {name!r} is not a non-empty string; quote it in YAML"
            )
        if ":" in name:
            raise ConfigError(f"{where}.{name}: a basic auth user name cannot contain ':'")
        # The value is a secret: messages say what is wrong with it, never what it is.
        if not isinstance(hashed, str) or not _BCRYPT.fullmatch(hashed):
            raise ConfigError(
                f"{where}.{name}: not a bcrypt hash (expected $2y$<cost>$... as made by"
                " htpasswd -nBC 10)"
            )
        out[name] = hashed
    return out


# --- small helpers -----------------------------------------------------------------------


def _mapping(raw: object, where: str) -> dict[str, object]:
    """``raw`` as a mapping with string keys (YAML's ``yes:`` or ``1:`` keys are refused)."""
    if not isinstance(raw, dict):
        _wrong_type(where, "a mapping", raw)
    mapping = cast("dict[object, object]", raw)
    for key in mapping:
        if not isinstance(key, str):
            raise ConfigError(f"{_dotted(where, str(key))}: keys must be strings")
    return cast("dict[str, object]", mapping)


def _check_key(key: str, allowed: tuple[str, ...], where: str) -> None:
    name = _dotted(where, key)
    if key in allowed:
        return
    if name in _NOT_IMPLEMENTED:
        raise ConfigError(
            f"{name}: valid for exporter-toolkit but not supported by fabricscope;"
            f" {_NOT_IMPLEMENTED[name]}"
        )
    raise ConfigError(f"{name}: unknown key; expected one of {', '.join(allowed)}")


def _string(section: dict[str, object], key: str, where: str) -> str:
    value = section.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        _wrong_type(f"{where}.{key}", "a string", value)
    return value


def _wrong_type(key: str, expected: str, value: object) -> NoReturn:
    # Only the type is reported: the value may be a secret.
    raise ConfigError(f"{key}: expected {expected}, got {type(value).__name__}")


def _yaml_problem(e: yaml.YAMLError) -> str:
    # PyYAML's own message quotes the offending line, which may hold a password hash:
    # report only the problem and where it is.
    import yaml

    if isinstance(e, yaml.MarkedYAMLError) and e.problem_mark is not None:
        mark = e.problem_mark
        return f"invalid YAML at line {mark.line + 1}, column {mark.column + 1}: {e.problem}"
    return "invalid YAML"


def _dotted(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _join(base: str, path: str) -> str:
    if not path or os.path.isabs(path):
        return path
    return os.path.join(base, path)


def _read_file(key: str, path: str) -> str:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read()
    except OSError as e:
        raise ConfigError(f"tls_server_config.{key}: cannot read {path}: {_os_reason(e)}") from None


def _os_reason(e: OSError | UnicodeDecodeError) -> str:
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    return str(e)


def _ssl_reason(e: ssl.SSLError) -> str:
    if e.reason == "KEY_VALUES_MISMATCH":
        return "the key does not belong to the certificate"
    return str(e.reason or e).lower().replace("_", " ")


class _EncryptedKeyError(Exception):
    pass


def _no_password() -> str:
    # Called by OpenSSL only for an encrypted key; without it OpenSSL would prompt on a tty.
    raise _EncryptedKeyError
