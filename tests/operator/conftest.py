"""Fixtures for the operator tests: a self-signed TLS certificate, and kmock (the
in-process Kubernetes API emulator) made good enough for a real kopf operator.

kmock 0.8 needs, for kopf 1.45:

- resourceVersion, uid and creationTimestamp stamped on every stored object (kopf
  filters watch events and finalizers by them);
- watch streams that do not replay objects older than the ``resourceVersion`` asked
  for (kmock replays every object as ADDED at the start of every watch);
- ``/api/v1/namespaces/...`` parsed as the core group (kmock reads ``namespaces`` as
  a resource and the namespace as a name);
- the bundled built-in resources (Nodes, PVs, PVCs, Events) loaded;
- JSON patches without their ``test`` of the resourceVersion (kmock answers a failed
  test with a 500 that kopf retries unchanged for ~20 s; a real server's conflict
  makes kopf read the object again).

Its other limits shape the operator: no label selectors on the server, no PUT, no
server-side apply, strategic merge = JSON merge; so the operator only creates, merge-
patches and deletes, and filters labels itself.
"""

from __future__ import annotations

import datetime as dt
import ssl
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from shoal.operator import crds

CRD_DIR = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "shoal" / "crds"


def make_cert(d: Path, name: str = "shoal-webhook") -> tuple[str, str]:
    """A self-signed certificate for 127.0.0.1 and localhost in ``d``: (cert, key)."""
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    d.mkdir(parents=True, exist_ok=True)
    (d / "tls.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (d / "tls.key").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return str(d / "tls.crt"), str(d / "tls.key")


@pytest.fixture(scope="session")
def tls_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """A self-signed certificate for 127.0.0.1 and localhost: (cert path, key path)."""
    return make_cert(tmp_path_factory.mktemp("tls"))


@pytest.fixture
def cert_factory() -> Any:
    """``make_cert``, for tests that renew a certificate."""
    return make_cert


@pytest.fixture
def client_tls(tls_pair: tuple[str, str]) -> ssl.SSLContext:
    """A client context that trusts only the test certificate (verification on)."""
    return ssl.create_default_context(cafile=tls_pair[0])


# --- kmock workaround ----------------------------------------------------------------


def _emulator_class() -> type[Any]:
    import kmock
    from kmock._internal import enums, rendering

    last = [0]  # the newest resourceVersion handed out

    class Emulator(kmock.KubernetesEmulator):  # type: ignore[misc]
        async def _handle(self, request: rendering.Request) -> Any:
            writes = (enums.action.CREATE, enums.action.UPDATE)
            if isinstance(request.data, list) and request.action in writes:
                # a JSON patch (kopf's finalizer removal) tests the resourceVersion it
                # last saw; kmock answers a failed test with a 500 that kopf retries
                # unchanged, where a real server's 409 makes it re-read: take the test
                # out and bump the version as a real server would
                last[0] += 1
                request.data[:] = [
                    op
                    for op in request.data
                    if not (
                        op.get("op") == "test" and op.get("path") == "/metadata/resourceVersion"
                    )
                ]
                rv = {"op": "add", "path": "/metadata/resourceVersion", "value": str(last[0])}
                request.data.append(rv)
            data = request.data if isinstance(request.data, dict) else None
            if request.resource is not None and request.action in writes and data is not None:
                last[0] += 1
                meta = data.setdefault("metadata", {})
                meta["resourceVersion"] = str(last[0])
                if request.action == enums.action.CREATE:
                    meta.setdefault("uid", str(uuid.uuid4()))
                    meta.setdefault(
                        "creationTimestamp",
                        dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
                    )
                    meta.setdefault("generation", 1)
            return await super()._handle(request)

        async def _serve_list(self, request: rendering.Request) -> Any:
            out = await super()._serve_list(request)
            out["metadata"] = {"resourceVersion": str(last[0])}
            return out

        async def _serve_watch(self, request: rendering.Request) -> AsyncIterator[Any]:
            asked = str((request.params or {}).get("resourceVersion") or "")
            since = int(asked) if asked.isdigit() else 0
            async for event in super()._serve_watch(request):
                if isinstance(event, dict) and event.get("type") == "ADDED":
                    rv = str((event.get("object") or {}).get("metadata", {}).get("resourceVersion"))
                    if rv.isdigit() and int(rv) <= since:
                        continue  # replayed: kopf listed it already
                yield event

    return Emulator


def _fix_namespaces_path() -> None:
    """kmock parses ``/api/v1/namespaces[/<name>]`` (the Namespace objects themselves)
    as a namespace prefix with no resource: parse those as the ``namespaces`` plural."""
    from kmock._internal import parsing

    if getattr(parsing.parse_path, "_shoal", False):
        return
    original = parsing.parse_path

    def parse_path(path: str) -> Any:
        parts = path.strip("/").split("/")
        if len(parts) in (3, 4, 5) and parts[0] == "api" and parts[2] == "namespaces":
            name = parts[3] if len(parts) > 3 else None
            sub = parts[4] if len(parts) > 4 else None
            if len(parts) <= 3 or (len(parts) == 5 and sub in ("status", "finalize")):
                return parsing.ParsedPath("", parts[1], "namespaces", None, name, sub)
            if len(parts) == 4:
                return parsing.ParsedPath("", parts[1], "namespaces", None, name, None)
        return original(path)

    parse_path._shoal = True  # type: ignore[attr-defined]
    parsing.parse_path = parse_path


@pytest_asyncio.fixture
async def kube() -> AsyncIterator[Any]:
    """A kmock Kubernetes API on 127.0.0.1 with the built-in resources and shoal's CRDs."""
    import kmock

    _fix_namespaces_path()
    emulator_cls = _emulator_class()
    async with emulator_cls() as k, kmock.Server(k):
        k.resources.load_bundled()
        for plural, kind in (
            (crds.DATASETS, "Dataset"),
            (crds.RUNTIMES, "Runtime"),
            (crds.DATALOADS, "DataLoad"),
        ):
            k.resources[f"{crds.GROUP}/{crds.VERSION}/{plural}"] = kmock.ResourceInfo(
                kind=kind,
                singular=kind.lower(),
                namespaced=True,
                verbs={"get", "list", "watch", "create", "patch", "update", "delete"},
                subresources={"status"},
            )
        yield k


@pytest.fixture
def crd_docs() -> Iterator[dict[str, dict[str, Any]]]:
    import yaml

    yield {p.name: yaml.safe_load(p.read_text()) for p in sorted(CRD_DIR.glob("*.yaml"))}
