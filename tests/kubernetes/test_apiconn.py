"""The pod watch's own HTTP client and its list decoder: credentials found as a pod and a
kubeconfig give them (a rotated token is picked up), requests reach a real HTTP server, and
a pod list is decoded one item at a time, whatever the chunking, refusing what is not a
list and holding far less than a whole-document decode."""

from __future__ import annotations

import base64
import io
import json
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import pytest
from pytest_httpserver import HTTPServer
from werkzeug import Request, Response

from agent.kubernetes.apiconn import (
    ApiConnection,
    ApiEndpoint,
    ApiStatusError,
    KubeConfigError,
    default_endpoint,
    in_cluster_endpoint,
    kubeconfig_endpoint,
)
from agent.kubernetes.podwatch import decode_list, parse_pod
from bench.bench_sizing import pod


def pod_list(n: int, pad: int = 0) -> bytes:
    items = []
    for i in range(n):
        p = pod(i, i < 8)
        # what makes real pods large: managed fields and annotations nobody reads
        p["metadata"]["annotations"] = {"kubectl.kubernetes.io/last-applied": "x" * pad}
        items.append(p)
    body = {"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": "77"}}
    return json.dumps({**body, "items": items}).encode()


def reader(data: bytes, chunk: int) -> Callable[[int], bytes]:
    """Reads of at most ``chunk`` bytes, however many are asked for (as a socket's do)."""
    raw = io.BytesIO(data)
    return lambda n: raw.read(min(n, chunk))


@pytest.mark.parametrize("chunk", [1, 7, 4096, 1 << 20])
def test_a_list_decodes_the_same_however_it_arrives(chunk: int) -> None:
    data = pod_list(30, pad=300)
    pods, version = decode_list(reader(data, chunk), parse_pod)
    expected = [parse_pod(item) for item in json.loads(data)["items"]]
    assert version == "77" and pods == expected and len(pods) == 30


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b'{"kind": "PodList", "metadata": {"resourceVersion": "1"}}', "without items"),
        (b'{"items": [], "metadata": {}}', "without metadata.resourceVersion"),
        (b'{"items": null, "metadata": {"resourceVersion": "1"}}', "items is not an array"),
        (b'{"items": [{"metadata": {}}], "metadata": {"resourceVersion": "1"}', "expected"),
        (b'{"items": [], "metadata": {"resourceVersion": "1"}} {"again": 1}', "data after"),
        (b'["not", "an", "object"]', "expected"),
        (b"", "expected"),
        (b'{"items": [{"a": 1} {"b": 2}], "metadata": {"resourceVersion": "1"}}', "expected"),
    ],
)
def test_what_is_not_a_pod_list_is_refused(body: bytes, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        decode_list(reader(body, 3), parse_pod)


def test_an_empty_list_and_a_trailing_number_decode() -> None:
    body = b'{"items": [], "metadata": {"resourceVersion": "9"}, "count": 12345}'
    assert decode_list(reader(body, 1), parse_pod) == ([], "9")


def test_a_huge_item_costs_linear_time() -> None:
    """One 16 MiB pod (a hostile annotation) read 4 KiB at a time: the reads grow with the
    item instead of re-decoding it once per chunk (4,096 times)."""
    data = pod_list(1, pad=16 << 20)
    t0 = time.monotonic()
    pods, _ = decode_list(reader(data, 4096), parse_pod)
    assert len(pods) == 1 and time.monotonic() - t0 < 10


def test_decoding_item_by_item_holds_a_fraction_of_the_whole_document() -> None:
    data = pod_list(1000, pad=2000)
    tracemalloc.start()
    json.loads(data)
    whole = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    tracemalloc.start()
    pods, _ = decode_list(reader(data, 1 << 16), parse_pod)
    streamed = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert len(pods) == 1000
    assert streamed < whole / 3, (streamed, whole)


# --- credentials --------------------------------------------------------------------------


def test_in_cluster_reads_the_token_before_every_request(
    tmp_path: Path, httpserver: HTTPServer
) -> None:
    account = tmp_path / "sa"
    account.mkdir()
    (account / "token").write_text("first\n")
    seen: list[str] = []

    def handle(request: Request) -> Response:
        seen.append(request.headers.get("Authorization", ""))
        return Response('{"items": [], "metadata": {"resourceVersion": "1"}}')

    httpserver.expect_request("/api/v1/pods").respond_with_handler(handle)
    env = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    ep = in_cluster_endpoint(env, account)
    assert ep.server == "https://10.96.0.1:443" and ep.ca_file is None
    # the same credentials against the plain-HTTP test server
    conn = ApiConnection(ApiEndpoint(httpserver.url_for("/").rstrip("/"), bearer=ep.bearer))
    conn.get("/api/v1/pods", {}, (2, 2)).close()
    (account / "token").write_text("rotated")
    conn.get("/api/v1/pods", {}, (2, 2)).close()
    assert seen == ["Bearer first", "Bearer rotated"]
    v6 = in_cluster_endpoint({**env, "KUBERNETES_SERVICE_HOST": "fd00::1"}, account)
    assert v6.server == "https://[fd00::1]:443"
    with pytest.raises(KubeConfigError, match="no service account token"):
        in_cluster_endpoint(env, tmp_path / "absent")


def test_an_error_status_is_raised_with_its_code(httpserver: HTTPServer) -> None:
    httpserver.expect_request("/api/v1/pods").respond_with_json({"kind": "Status"}, status=403)
    conn = ApiConnection(ApiEndpoint(httpserver.url_for("/").rstrip("/")))
    with pytest.raises(ApiStatusError, match="HTTP 403") as err:
        conn.get("/api/v1/pods", {"fieldSelector": "spec.nodeName=a"}, (2, 2))
    assert err.value.status == 403


def kubeconfig(tmp_path: Path, user: dict[str, object]) -> Path:
    ca = base64.b64encode(b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "c",
        "clusters": [
            {
                "name": "k",
                "cluster": {"server": "https://k:6443", "certificate-authority-data": ca.decode()},
            }
        ],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
        "users": [{"name": "u", "user": user}],
    }
    path = tmp_path / "config"
    path.write_text(json.dumps(doc))
    return path


def test_a_token_kubeconfig_needs_no_kubernetes_library(tmp_path: Path) -> None:
    ep = kubeconfig_endpoint(kubeconfig(tmp_path, {"token": "abc"}))
    assert ep.server == "https://k:6443" and ep.bearer is not None
    assert ep.bearer() == "Bearer abc" and ep.ca_data and "BEGIN CERTIFICATE" in ep.ca_data
    (tmp_path / "tok").write_text("from-file")
    ep = kubeconfig_endpoint(kubeconfig(tmp_path, {"tokenFile": "tok"}))
    assert ep.bearer is not None and ep.bearer() == "Bearer from-file"
    got = default_endpoint({"KUBECONFIG": str(tmp_path / "config")})
    assert got.server == "https://k:6443"


def test_an_exec_plugin_user_goes_through_the_kubernetes_library(tmp_path: Path) -> None:
    """Only the library runs exec plugins: a user with one is handed to it (here the plugin
    is `echo` printing an ExecCredential)."""
    cred = json.dumps(
        {"apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential",
         "status": {"token": "from-exec"}}
    )  # fmt: skip
    user = {
        "exec": {
            "apiVersion": "client.authentication.k8s.io/v1",
            "command": "echo",
            "args": [cred],
            "interactiveMode": "Never",
        }
    }
    ep = kubeconfig_endpoint(kubeconfig(tmp_path, user))
    assert ep.server == "https://k:6443"
    assert ep.bearer is not None and ep.bearer() == "Bearer from-exec"


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ("[]", "not a mapping"),
        ("{", "cannot read"),
        ('{"current-context": "x", "contexts": []}', "no context named 'x'"),
    ],
)
def test_a_bad_kubeconfig_is_one_clear_error(tmp_path: Path, doc: str, message: str) -> None:
    path = tmp_path / "config"
    path.write_text(doc)
    with pytest.raises(KubeConfigError, match=message):
        kubeconfig_endpoint(path)


def test_a_yaml_kubeconfig_is_read_and_a_json_one_without_pyyaml(tmp_path: Path) -> None:
    """JSON is YAML too: a kubeconfig in JSON is read with the standard library (PyYAML, about
    1 MiB resident, stays out of the process), one in YAML's block style with PyYAML."""
    (tmp_path / "config.yaml").write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters:\n- name: k\n  cluster:\n    server: https://k:6443\n"
        "contexts:\n- name: c\n  context:\n    cluster: k\n    user: u\n"
        "users:\n- name: u\n  user:\n    token: abc\n"
    )
    ep = kubeconfig_endpoint(tmp_path / "config.yaml")
    assert ep.server == "https://k:6443" and ep.bearer is not None and ep.bearer() == "Bearer abc"
    path = kubeconfig(tmp_path, {"token": "abc"})
    probe = (
        "import sys; from pathlib import Path\n"
        "from agent.kubernetes.apiconn import kubeconfig_endpoint\n"
        f"assert kubeconfig_endpoint(Path({str(path)!r})).server == 'https://k:6443'\n"
        "assert 'yaml' not in sys.modules, 'yaml imported'\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
