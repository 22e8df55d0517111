"""Data-aware scheduling: a mutating admission webhook for Pods (AdmissionReview v1).

A pod that mounts a Dataset's PersistentVolumeClaim (the PVC of the Dataset's name in
the pod's namespace) gets a node affinity for the nodes labelled
``shoal.io/s-<ns>-<dataset>=true`` (where the dataset's cache is):

- preferred, weight 100, by default;
- required (``requiredDuringSchedulingIgnoredDuringExecution``, added to every term)
  when the pod carries the label ``shoal.io/dataset.<dataset>.sched=required``;
- none when the pod already states its own locality: a ``shoal.io/s-`` key in its
  node affinity or nodeSelector, or a ``spec.nodeName``.

Fail-open twice over: the WebhookConfiguration says ``failurePolicy: Ignore`` with a
short ``timeoutSeconds``, and the handler itself never raises; any error (a malformed
review, a bug) answers ``allowed: true`` without a patch and is logged and counted.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import json
import logging
import os
import ssl
from collections.abc import Callable, Collection, Mapping
from typing import Any

import kopf
from aiohttp import web

from shoal.operator import crds

log = logging.getLogger("shoal.operator.webhook")
PATH = "/mutate-pods"
HEALTH = "/healthz"
REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
PREFERRED = "preferredDuringSchedulingIgnoredDuringExecution"
WEIGHT = 100
#: what the WebhookConfiguration should say (the chart renders it)
TIMEOUT_S = 5
#: the app's count of reviews answered fail-open after an error
ERRORS = web.AppKey("errors", int)


def _used_datasets(
    pod: Mapping[str, Any], namespace: str, known: Collection[tuple[str, str]]
) -> list[str]:
    out: list[str] = []
    for vol in (pod.get("spec") or {}).get("volumes") or []:
        claim = (vol.get("persistentVolumeClaim") or {}).get("claimName")
        if claim and (namespace, claim) in known and claim not in out:
            out.append(claim)
    return out


def _own_locality(spec: Mapping[str, Any]) -> bool:
    if spec.get("nodeName"):
        return True
    if any(str(k).startswith(f"{crds.GROUP}/s-") for k in spec.get("nodeSelector") or {}):
        return True
    na = (spec.get("affinity") or {}).get("nodeAffinity") or {}
    exprs: list[Mapping[str, Any]] = []
    for term in (na.get(REQUIRED) or {}).get("nodeSelectorTerms") or []:
        exprs += term.get("matchExpressions") or []
    for pref in na.get(PREFERRED) or []:
        exprs += (pref.get("preference") or {}).get("matchExpressions") or []
    return any(str(e.get("key", "")).startswith(f"{crds.GROUP}/s-") for e in exprs)


def node_affinity(
    pod: Mapping[str, Any], namespace: str, known: Collection[tuple[str, str]]
) -> dict[str, Any] | None:
    """The pod's new ``spec.affinity.nodeAffinity``, or None to leave the pod alone."""
    spec = pod.get("spec") or {}
    used = _used_datasets(pod, namespace, known)
    if not used or _own_locality(spec):
        return None
    labels = (pod.get("metadata") or {}).get("labels") or {}
    na = copy.deepcopy((spec.get("affinity") or {}).get("nodeAffinity") or {})
    strict: list[dict[str, Any]] = []
    for ds in used:
        expr = {"key": crds.node_label(namespace, ds), "operator": "In", "values": ["true"]}
        if labels.get(crds.sched_label(ds)) == "required":
            strict.append(expr)
        else:
            na.setdefault(PREFERRED, []).append(
                {"weight": WEIGHT, "preference": {"matchExpressions": [expr]}}
            )
    if strict:
        terms = (na.get(REQUIRED) or {}).get("nodeSelectorTerms") or [{}]
        # terms are ORed: the dataset's nodes are required in each of them
        for term in terms:
            term["matchExpressions"] = [*(term.get("matchExpressions") or []), *strict]
        na[REQUIRED] = {**(na.get(REQUIRED) or {}), "nodeSelectorTerms": terms}
    return na


def json_patch(pod: Mapping[str, Any], affinity: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The RFC 6902 patch that sets ``spec.affinity.nodeAffinity`` on ``pod``."""
    patch = kopf.Patch(body=kopf.Body(copy.deepcopy(dict(pod))))  # type: ignore[arg-type]
    patch["spec"] = {"affinity": {"nodeAffinity": dict(affinity)}}
    return [dict(op) for op in patch.as_json_patch()]


def review(request: Any, known: Collection[tuple[str, str]]) -> tuple[dict[str, Any], bool]:
    """The AdmissionReview v1 answer to ``request`` (always allowed, maybe patched) and
    whether it was reviewed (False: an error, answered fail-open)."""
    uid = ""
    ok = True
    try:
        uid = str(request["request"]["uid"])
        req = request["request"]
        pod = req.get("object") or {}
        ns = req.get("namespace") or (pod.get("metadata") or {}).get("namespace") or "default"
        response: dict[str, Any] = {"uid": uid, "allowed": True}
        if req.get("operation") == "CREATE" and (req.get("kind") or {}).get("kind") == "Pod":
            na = node_affinity(pod, ns, known)
            if na is not None:
                ops = json_patch(pod, na)
                response["patchType"] = "JSONPatch"
                response["patch"] = base64.b64encode(json.dumps(ops).encode()).decode()
    except Exception:  # fail open: never keep a pod from being created
        log.exception("admission review failed; allowing the pod unchanged")
        response = {"uid": uid, "allowed": True}
        ok = False
    answer = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}
    return answer, ok


def app(known: Callable[[], Collection[tuple[str, str]]]) -> web.Application:
    """The webhook's aiohttp application; ``known()`` gives the current Datasets."""

    async def mutate(request: web.Request) -> web.Response:
        try:
            body = await request.json()
        except (ValueError, UnicodeDecodeError):
            body = None
        answer, ok = review(body, known())
        if not ok:
            request.app[ERRORS] += 1
        return web.json_response(answer)

    async def health(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    a = web.Application(client_max_size=4 << 20)
    a[ERRORS] = 0
    a.router.add_post(PATH, mutate)
    a.router.add_get(HEALTH, health)
    return a


def tls_context(cert: str, key: str) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)
    return ctx


def _stamp(*paths: str) -> tuple[float, ...]:
    return tuple(os.stat(p).st_mtime for p in paths)


async def _reload_certs(ctx: ssl.SSLContext, cert: str, key: str, every: float) -> None:
    """Load a renewed certificate (cert-manager, a rotated Secret) into the serving
    context: new connections use it, no restart needed."""
    seen = _stamp(cert, key)
    while True:
        await asyncio.sleep(every)
        try:
            now = _stamp(cert, key)
            if now != seen:
                ctx.load_cert_chain(cert, key)
                seen = now
                log.info("webhook certificate reloaded from %s", cert)
        except (OSError, ssl.SSLError) as exc:  # half-written files: try on the next pass
            log.warning("webhook certificate not reloaded: %s", exc)


async def serve(
    known: Callable[[], Collection[tuple[str, str]]],
    host: str,
    port: int,
    cert: str,
    key: str,
    reload_every: float = 60.0,
) -> tuple[web.AppRunner, int]:
    """Start the HTTPS server; the runner (to clean up) and the port it bound."""
    a = app(known)
    tls = tls_context(cert, key)
    reloader = asyncio.create_task(_reload_certs(tls, cert, key, reload_every))

    async def stop_reloader(_: web.Application) -> None:
        reloader.cancel()

    a.on_cleanup.append(stop_reloader)
    runner = web.AppRunner(a, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port, ssl_context=tls)
    await site.start()
    server = site._server
    sockets = getattr(server, "sockets", None) or []
    bound = sockets[0].getsockname()[1] if sockets else port
    return runner, int(bound)


def configuration(service: str, namespace: str, ca_bundle: str, port: int = 443) -> dict[str, Any]:
    """The MutatingWebhookConfiguration for this webhook (what the chart renders)."""
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": "shoal-scheduling"},
        "webhooks": [
            {
                "name": "pods.scheduling.shoal.io",
                "admissionReviewVersions": ["v1"],
                "sideEffects": "None",
                "failurePolicy": "Ignore",
                "timeoutSeconds": TIMEOUT_S,
                "reinvocationPolicy": "Never",
                "clientConfig": {
                    "service": {
                        "name": service,
                        "namespace": namespace,
                        "path": PATH,
                        "port": port,
                    },
                    "caBundle": ca_bundle,
                },
                "rules": [
                    {
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "operations": ["CREATE"],
                        "resources": ["pods"],
                        "scope": "Namespaced",
                    }
                ],
                "namespaceSelector": {
                    "matchExpressions": [
                        {
                            "key": "kubernetes.io/metadata.name",
                            "operator": "NotIn",
                            "values": ["kube-system", namespace],
                        }
                    ]
                },
            }
        ],
    }
