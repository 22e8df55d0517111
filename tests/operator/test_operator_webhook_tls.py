"""The scheduling webhook over HTTPS: real AdmissionReview v1 requests to the server
the operator runs, with a certificate made here; the client verifies it."""

from __future__ import annotations

import base64
import json
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from shoal.operator import webhook

KNOWN = {("ml", "imagenet")}
KEY = "shoal.io/s-ml-imagenet"


def review_request(pod: Any, uid: str = "r-1") -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "operation": "CREATE",
            "namespace": "ml",
            "name": "",
            "object": pod,
            "oldObject": None,
            "dryRun": False,
            "userInfo": {"username": "system:serviceaccount:ml:trainer", "groups": []},
        },
    }


def pod(
    claim: str = "imagenet", labels: dict[str, str] | None = None, **spec: Any
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"generateName": "train-", "namespace": "ml", "labels": labels or {}},
        "spec": {
            "containers": [{"name": "t", "image": "trainer"}],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}],
            **spec,
        },
    }


@pytest_asyncio.fixture
async def endpoint(tls_pair: tuple[str, str]) -> AsyncIterator[tuple[str, aiohttp.web.Application]]:
    runner, port = await webhook.serve(lambda: KNOWN, "127.0.0.1", 0, *tls_pair)
    try:
        yield f"https://127.0.0.1:{port}", runner.app
    finally:
        await runner.cleanup()


async def post(
    url: str, tls: ssl.SSLContext, payload: Any, raw: bytes | None = None
) -> dict[str, Any]:
    async with aiohttp.ClientSession() as http:
        data = raw if raw is not None else json.dumps(payload).encode()
        async with http.post(
            url + webhook.PATH, data=data, ssl=tls, headers={"Content-Type": "application/json"}
        ) as r:
            assert r.status == 200
            body: dict[str, Any] = await r.json()
    assert body["apiVersion"] == "admission.k8s.io/v1" and body["kind"] == "AdmissionReview"
    return body["response"]


def ops(response: dict[str, Any]) -> list[dict[str, Any]]:
    assert response["patchType"] == "JSONPatch"
    return json.loads(base64.b64decode(response["patch"]))  # type: ignore[no-any-return]


async def test_dataset_pod_gets_preferred_affinity(
    endpoint: Any, client_tls: ssl.SSLContext
) -> None:
    url, _ = endpoint
    r = await post(url, client_tls, review_request(pod()))
    assert r["uid"] == "r-1" and r["allowed"] is True
    expr = {"key": KEY, "operator": "In", "values": ["true"]}
    assert ops(r) == [
        {
            "op": "add",
            "path": "/spec/affinity",
            "value": {
                "nodeAffinity": {
                    webhook.PREFERRED: [{"weight": 100, "preference": {"matchExpressions": [expr]}}]
                }
            },
        }
    ]


async def test_required_label_gives_required_term(
    endpoint: Any, client_tls: ssl.SSLContext
) -> None:
    url, _ = endpoint
    p = pod(labels={"shoal.io/dataset.imagenet.sched": "required"}, affinity={"podAffinity": {}})
    r = await post(url, client_tls, review_request(p, uid="r-2"))
    assert r["uid"] == "r-2"
    expr = {"key": KEY, "operator": "In", "values": ["true"]}
    assert ops(r) == [
        {
            "op": "add",
            "path": "/spec/affinity/nodeAffinity",
            "value": {webhook.REQUIRED: {"nodeSelectorTerms": [{"matchExpressions": [expr]}]}},
        }
    ]


async def test_own_node_affinity_on_the_key_is_left_alone(
    endpoint: Any, client_tls: ssl.SSLContext
) -> None:
    url, _ = endpoint
    own = {
        "nodeAffinity": {
            webhook.REQUIRED: {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": KEY, "operator": "DoesNotExist"}]}
                ]
            }
        }
    }
    r = await post(url, client_tls, review_request(pod(affinity=own)))
    assert r == {"uid": "r-1", "allowed": True}


async def test_unrelated_pod_allowed_without_patch(
    endpoint: Any, client_tls: ssl.SSLContext
) -> None:
    url, app = endpoint
    r = await post(url, client_tls, review_request(pod(claim="home-dirs")))
    assert r == {"uid": "r-1", "allowed": True}
    assert app[webhook.ERRORS] == 0


@pytest.mark.parametrize(
    "raw",
    [b"{not json", b"null", json.dumps({"request": {"uid": "x"}}).encode()],
    ids=["garbage", "null", "no-object"],
)
async def test_broken_requests_are_allowed(
    endpoint: Any, client_tls: ssl.SSLContext, raw: bytes
) -> None:
    url, app = endpoint
    r = await post(url, client_tls, None, raw=raw)
    assert r["allowed"] is True and "patch" not in r
    if raw != json.dumps({"request": {"uid": "x"}}).encode():
        assert app[webhook.ERRORS] == 1  # counted as a fail-open answer
    else:
        assert r["uid"] == "x"


async def test_internal_error_is_allowed(
    tls_pair: tuple[str, str], client_tls: ssl.SSLContext
) -> None:
    # the view of the Datasets fails inside the server: still allowed, unpatched
    runner, port = await webhook.serve(lambda: _Exploding(), "127.0.0.1", 0, *tls_pair)
    try:
        r = await post(f"https://127.0.0.1:{port}", client_tls, review_request(pod()))
        assert r == {"uid": "r-1", "allowed": True}
        assert runner.app[webhook.ERRORS] == 1
    finally:
        await runner.cleanup()


class _Exploding(set[tuple[str, str]]):
    def __contains__(self, item: object) -> bool:
        raise RuntimeError("index unavailable")


async def test_plain_http_and_untrusted_clients_are_refused(
    endpoint: Any, tls_pair: tuple[str, str]
) -> None:
    url, _ = endpoint
    async with aiohttp.ClientSession() as http:
        with pytest.raises(aiohttp.ClientError):
            async with http.post(url.replace("https", "http") + webhook.PATH, data=b"{}") as r:
                await r.read()
        with pytest.raises(aiohttp.ClientConnectorCertificateError):
            async with http.post(
                url + webhook.PATH, data=b"{}", ssl=ssl.create_default_context()
            ) as r:
                await r.read()


async def test_a_renewed_certificate_is_served_without_restart(
    tmp_path: Path, cert_factory: Any
) -> None:
    import asyncio
    import os
    import time

    make_cert = cert_factory
    cert, key = make_cert(tmp_path / "live", "first")
    runner, port = await webhook.serve(lambda: KNOWN, "127.0.0.1", 0, cert, key, reload_every=0.05)
    try:
        first = ssl.create_default_context(cafile=cert)
        r = await post(f"https://127.0.0.1:{port}", first, review_request(pod()))
        assert r["allowed"] is True
        new_cert, new_key = make_cert(tmp_path / "next", "second")
        # renewed in place, as a Secret volume update or cert-manager does it
        os.replace(new_key, key)
        os.replace(new_cert, cert)
        os.utime(cert, (time.time() + 5, time.time() + 5))
        second = ssl.create_default_context(cafile=cert)
        deadline = time.monotonic() + 10
        while True:
            try:
                r = await post(f"https://127.0.0.1:{port}", second, review_request(pod()))
                break
            except aiohttp.ClientConnectorCertificateError:
                assert time.monotonic() < deadline, "the renewed certificate was never served"
                await asyncio.sleep(0.05)
        assert r["allowed"] is True and "patch" in r
    finally:
        await runner.cleanup()
