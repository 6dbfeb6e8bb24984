"""How the agent talks to the Kubernetes API server: a GET of a pod list or watch over the
standard library's HTTP(S), with the credentials a pod (or a kubeconfig) gives.

The agent asks the API server one thing (the pods of a node, or of a namespace by label,
listed then watched) and reads a few fields of raw JSON. The ``kubernetes`` client's
generated models, ``CoreV1Api`` and what it pulls in (``requests``, ``oauthlib``,
``pydantic``...) would cost the resident process about 37 MiB for that one call, so
requests go through :mod:`http.client` and :mod:`ssl` here; the ``kubernetes`` library is
used only where it pays: a kubeconfig whose user authenticates with an ``exec`` plugin or an
``auth-provider`` (a developer's laptop, never the chart), which only it resolves.

Credentials, in the order :func:`default_endpoint` tries them
    * in a pod (``KUBERNETES_SERVICE_HOST`` set): the service account's token file, re-read
      before every request (bound tokens are rotated by the kubelet about hourly), and its
      ``ca.crt``;
    * else the kubeconfig (``$KUBECONFIG``'s first file, else ``~/.kube/config``): the
      current context's server, ``certificate-authority(-data)``,
      ``insecure-skip-tls-verify``, and a user's ``token``, ``tokenFile`` or client
      certificate; any other kind of user goes through the ``kubernetes`` library.

Imports the standard library and PyYAML (the kubeconfig), ``kubernetes`` only in the
fallback above; nothing of the agent.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import os
import socket
import ssl
import tempfile
import urllib.parse
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, cast

#: the service account's files inside a pod
SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
#: the most of an error answer's body read (an API ``Status`` is a few hundred bytes)
MAX_ERROR_BODY = 64 << 10


class ApiStatusError(Exception):
    """The API server answered a request with an HTTP error status."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(f"HTTP {status} {reason}")
        self.status = status
        self.reason = reason


class KubeConfigError(Exception):
    """No usable in-cluster configuration or kubeconfig."""


@dataclass(frozen=True, slots=True)
class ApiEndpoint:
    """Where the API server is and how to authenticate to it.

    ``bearer``: returns the ``Authorization`` header's value (``Bearer <token>``), called
    before every request so that a rotated token is picked up; None: no header.
    ``ca_file`` / ``ca_data`` (PEM): the CA to verify the server with (default: the system's);
    ``cert_file`` / ``key_file``: a client certificate; ``insecure``: no verification.
    """

    server: str
    bearer: Callable[[], str | None] | None = None
    ca_file: str | None = None
    ca_data: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    insecure: bool = False


class _KubernetesConfiguration(Protocol):  # the part of kubernetes.client.Configuration used
    host: str
    api_key: dict[str, str]
    ssl_ca_cert: str | None
    cert_file: str | None
    key_file: str | None
    verify_ssl: bool
    refresh_api_key_hook: Callable[[object], None] | None


def endpoint_of(client: object) -> ApiEndpoint:
    """An :class:`ApiEndpoint` as is, or the endpoint of a ``kubernetes.client.ApiClient``
    (or ``Configuration``) built elsewhere: its host, CA, client certificate and its
    bearer token (refreshed through its own hook before each request)."""
    if isinstance(client, ApiEndpoint):
        return client
    cfg = cast(_KubernetesConfiguration, getattr(client, "configuration", client))
    if not isinstance(getattr(cfg, "host", None), str):
        raise TypeError(f"not an API endpoint or kubernetes ApiClient: {type(client).__name__}")

    def bearer() -> str | None:
        hook = cfg.refresh_api_key_hook
        if hook is not None:
            hook(cfg)
        value = cfg.api_key.get("BearerToken") or cfg.api_key.get("authorization")
        if value and not value.lower().startswith("bearer "):
            value = "Bearer " + value
        return value or None

    return ApiEndpoint(
        server=cfg.host,
        bearer=bearer,
        ca_file=cfg.ssl_ca_cert,
        cert_file=cfg.cert_file,
        key_file=cfg.key_file,
        insecure=not cfg.verify_ssl,
    )


# --- finding the endpoint --------------------------------------------------------------------


def _token_file_bearer(path: Path) -> Callable[[], str | None]:
    def bearer() -> str | None:
        try:
            token = path.read_text().strip()
        except OSError as exc:
            raise KubeConfigError(f"cannot read the token file {path}: {exc}") from None
        return f"Bearer {token}" if token else None

    return bearer


def in_cluster_endpoint(
    env: Mapping[str, str] = os.environ, account: Path = SERVICE_ACCOUNT_DIR
) -> ApiEndpoint:
    """The API server as a pod sees it (the service's environment variables, the service
    account's token and CA)."""
    host, port = env.get("KUBERNETES_SERVICE_HOST", ""), env.get("KUBERNETES_SERVICE_PORT", "")
    if not host or not port:
        raise KubeConfigError("KUBERNETES_SERVICE_HOST or KUBERNETES_SERVICE_PORT not set")
    if ":" in host:  # an IPv6 address
        host = f"[{host}]"
    token, ca = account / "token", account / "ca.crt"
    if not token.is_file():
        raise KubeConfigError(f"no service account token at {token}")
    return ApiEndpoint(
        server=f"https://{host}:{port}",
        bearer=_token_file_bearer(token),
        ca_file=str(ca) if ca.is_file() else None,
    )


def _named(entries: object, name: object, key: str) -> Mapping[str, object]:
    for entry in entries if isinstance(entries, list) else ():
        if isinstance(entry, dict) and entry.get("name") == name:
            value = entry.get(key)
            return cast("Mapping[str, object]", value) if isinstance(value, dict) else {}
    raise KubeConfigError(f"kubeconfig: no {key} named {name!r}")


def _pem(data: object, what: str) -> str:
    try:
        return base64.b64decode(str(data), validate=True).decode()
    except (ValueError, UnicodeDecodeError):
        raise KubeConfigError(f"kubeconfig: {what} is not base64 PEM") from None


#: the user fields this module handles itself; any other (exec, auth-provider, username...)
#: goes through the kubernetes library
_SIMPLE_USER = {
    "token",
    "tokenFile",
    "client-certificate",
    "client-certificate-data",
    "client-key",
    "client-key-data",
}


def kubeconfig_endpoint(path: Path) -> ApiEndpoint:
    """The current context's endpoint from the kubeconfig at ``path``."""
    base = path.parent
    try:
        text = path.read_text()
    except OSError as exc:
        raise KubeConfigError(f"cannot read the kubeconfig {path}: {exc}") from None
    try:  # JSON is YAML too: PyYAML (about 1 MiB resident) only for a kubeconfig that is not
        doc = json.loads(text)
    except ValueError:
        import yaml

        try:
            doc = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise KubeConfigError(f"cannot read the kubeconfig {path}: {exc}") from None
    if not isinstance(doc, dict):
        raise KubeConfigError(f"kubeconfig {path}: not a mapping")
    context = _named(doc.get("contexts"), doc.get("current-context"), "context")
    cluster = _named(doc.get("clusters"), context.get("cluster"), "cluster")
    user = _named(doc.get("users"), context.get("user"), "user") if context.get("user") else {}
    if set(user) - _SIMPLE_USER:
        return _library_endpoint(path)
    server = cluster.get("server")
    if not isinstance(server, str) or not server:
        raise KubeConfigError(f"kubeconfig {path}: the cluster has no server")

    def local(name: str) -> str | None:
        value = cluster.get(name, user.get(name))
        return str(base / str(value)) if value else None

    bearer: Callable[[], str | None] | None = None
    if user.get("token"):
        header = f"Bearer {user['token']}"
        bearer = lambda: header  # noqa: E731
    elif user.get("tokenFile"):
        bearer = _token_file_bearer(base / str(user["tokenFile"]))
    cert, key = local("client-certificate"), local("client-key")
    if user.get("client-certificate-data") or user.get("client-key-data"):
        cert, key = _client_pair(
            _pem(user.get("client-certificate-data"), "client-certificate-data"),
            _pem(user.get("client-key-data"), "client-key-data"),
        )
    ca_data = cluster.get("certificate-authority-data")
    return ApiEndpoint(
        server=server,
        bearer=bearer,
        ca_file=local("certificate-authority"),
        ca_data=_pem(ca_data, "certificate-authority-data") if ca_data else None,
        cert_file=cert,
        key_file=key,
        insecure=cluster.get("insecure-skip-tls-verify") is True,
    )


def _client_pair(cert: str, key: str) -> tuple[str, str]:
    """Inline client certificate and key written to private files (``ssl`` loads a client
    certificate from files only); removed when the process exits."""
    import atexit

    paths = []
    for text in (cert, key):
        fd, name = tempfile.mkstemp(prefix="fabricscope-kube-", suffix=".pem")
        with os.fdopen(fd, "w") as f:  # mkstemp: mode 0600
            f.write(text)
        atexit.register(Path(name).unlink, missing_ok=True)
        paths.append(name)
    return paths[0], paths[1]


def _library_endpoint(path: Path) -> ApiEndpoint:
    """A kubeconfig only the ``kubernetes`` library can resolve (exec plugins, auth
    providers): it loads it, and keeps its token fresh through its own hook."""
    from kubernetes import config
    from kubernetes.client import Configuration

    cfg = Configuration()
    config.load_kube_config(config_file=str(path), client_configuration=cfg)  # type: ignore[no-untyped-call]
    return endpoint_of(cfg)


def default_endpoint(env: Mapping[str, str] = os.environ) -> ApiEndpoint:
    """The in-cluster configuration when running in a pod, else the kubeconfig."""
    if env.get("KUBERNETES_SERVICE_HOST"):
        return in_cluster_endpoint(env)
    first = env.get("KUBECONFIG", "").split(os.pathsep)[0]
    path = Path(first) if first else Path.home() / ".kube" / "config"
    return kubeconfig_endpoint(path)


# --- requests ------------------------------------------------------------------------------


class ApiResponse:
    """An open answer, read as it arrives (the ``HttpStream`` a watch is read from)."""

    chunked = False  # http.client's read1 undoes the chunked encoding itself

    def __init__(
        self,
        conn: http.client.HTTPConnection,
        resp: http.client.HTTPResponse,
        sock: socket.socket,
    ) -> None:
        self._conn = conn
        self._resp = resp
        # the connection forgets its socket once an answer is read to its close (HTTP/1.0)
        self._sock = sock

    @property
    def data(self) -> bytes:
        return self._resp.read()

    def read1(self, amt: int | None = None, decode_content: bool | None = None) -> bytes:
        return self._resp.read1(-1 if amt is None else amt)

    def stream(self, amt: int | None = None, decode_content: bool | None = None) -> Iterator[bytes]:
        return iter(lambda: self.read1(amt or 65536), b"")

    def shutdown(self) -> None:
        """Unblock a thread reading this answer."""
        # already closed by the peer: nothing left to unblock
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)

    def release_conn(self) -> None:
        self.close()

    def close(self) -> None:
        self._resp.close()
        self._conn.close()


class ApiConnection:
    """GETs against one endpoint; a new connection each request (a list, then a watch of
    minutes: nothing to gain from keeping one)."""

    def __init__(self, endpoint: ApiEndpoint) -> None:
        self.endpoint = endpoint
        url = urllib.parse.urlsplit(endpoint.server)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise KubeConfigError(f"API server address {endpoint.server!r} is not http(s)://")
        self._https = url.scheme == "https"
        self._host = url.hostname
        self._port = url.port or (443 if self._https else 80)
        self._prefix = url.path.rstrip("/")
        self._context: ssl.SSLContext | None = None
        if self._https:
            ctx = ssl.create_default_context(cafile=endpoint.ca_file, cadata=endpoint.ca_data)
            if endpoint.insecure:
                ctx.check_hostname = False
                ctx.verify_mode = ssl.CERT_NONE
            if endpoint.cert_file:
                ctx.load_cert_chain(endpoint.cert_file, endpoint.key_file)
            self._context = ctx

    def get(self, path: str, query: Mapping[str, str], timeout: tuple[float, float]) -> ApiResponse:
        """GET ``path?query``: connect within ``timeout[0]`` seconds, then each read within
        ``timeout[1]``. Raises :class:`ApiStatusError` for an error status."""
        connect, read = timeout
        conn: http.client.HTTPConnection
        if self._context is not None:
            conn = http.client.HTTPSConnection(
                self._host, self._port, timeout=connect, context=self._context
            )
        else:
            conn = http.client.HTTPConnection(self._host, self._port, timeout=connect)
        headers = {"Accept": "application/json", "User-Agent": "fabricscope"}
        bearer = self.endpoint.bearer() if self.endpoint.bearer is not None else None
        if bearer:
            headers["Authorization"] = bearer
        target = self._prefix + path + ("?" + urllib.parse.urlencode(query) if query else "")
        try:
            conn.connect()
            sock = conn.sock
            assert sock is not None
            sock.settimeout(read)
            conn.request("GET", target, headers=headers)
            resp = conn.getresponse()
        except BaseException:
            conn.close()
            raise
        if resp.status >= 400:
            # the status says what failed; the body (an API Status) only repeats it
            with contextlib.suppress(OSError, http.client.HTTPException):
                resp.read(MAX_ERROR_BODY)
            conn.close()
            raise ApiStatusError(resp.status, resp.reason)
        return ApiResponse(conn, resp, sock)
