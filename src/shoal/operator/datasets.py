"""kopf handlers for Datasets and Runtimes.

Level-based: every create, resume, spec change and timer tick runs :func:`converge`,
which makes the master hold the dataset with the policy the spec says and the PV/PVC
pair exist, whatever was done before (an operator killed half-way resumes by running
it again). Deletion runs under a finalizer: free the cache, delete the dataset in the
master, drop its node labels, PV and PVC.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import Any

import kopf

from shoal.core.types import Dataset
from shoal.errors import DatasetExists, DatasetNotFound, InvalidArgument, ShoalError, Unavailable
from shoal.operator import crds, manifests, status
from shoal.operator.context import Context

log = logging.getLogger("shoal.operator.datasets")


def set_status(patch: kopf.Patch, current: Mapping[str, Any], new: Mapping[str, Any]) -> None:
    """Put into ``patch.status`` only the fields that changed (no write when none did)."""
    for k, v in new.items():
        if current.get(k) != v:
            patch.status[k] = v


def _temporary(exc: ShoalError, delay: float) -> kopf.TemporaryError:
    return kopf.TemporaryError(f"{type(exc).__name__}: {exc.message}", delay=delay)


async def converge(ctx: Context, body: kopf.Body) -> Dataset:
    """Make the master's dataset and the PV/PVC match the Dataset ``body``."""
    ns, name = body.metadata.namespace or "default", body.metadata.name or ""
    spec = body.spec
    mname = crds.master_name(ns, name)
    mounts = crds.mounts(spec, ctx.settings.secrets_root)
    options = crds.policy_options(spec.get("policy"))
    try:
        ds = await ctx.client.dataset(mname, refresh=True)
    except DatasetNotFound:
        try:
            ds = await ctx.client.create_dataset(mname, mounts, options)
            log.info("created dataset %s in the master", mname)
        except DatasetExists:  # made meanwhile by a racing handler
            ds = await ctx.client.dataset(mname, refresh=True)
    if ds.policy.to_dict() != crds.desired_policy(spec.get("policy")):
        ds = await ctx.client.update_dataset(mname, options)
        log.info("updated the policy of dataset %s (generation %d)", mname, ds.generation)
    pv = manifests.persistent_volume(ns, name, mname, spec.get("nodeAffinity"))
    await ctx.kube.create("/api/v1/persistentvolumes", pv)
    pvc = manifests.persistent_volume_claim(body, mname)
    await ctx.kube.create(f"/api/v1/namespaces/{ns}/persistentvolumeclaims", pvc)
    ctx.datasets.add((ns, name))
    return ds


def _mounts_differ(ds: Dataset, body: kopf.Body, ctx: Context) -> str:
    want = {m.name: m.uri for m in crds.mounts(body.spec, ctx.settings.secrets_root)}
    have = {m.name: m.uri for m in ds.mounts}
    if want == have:
        return ""
    return "spec.mounts differ from the master's (mounts are immutable): recreate the Dataset"


async def apply(ctx: Context, body: kopf.Body, patch: kopf.Patch) -> None:
    """converge() and the status it leads to, never at the same time as another pass
    over the same Dataset nor after its finalizer started; errors as kopf expects."""
    uid = body.metadata.uid or ""
    async with ctx.lock(uid):
        if uid in ctx.deleting or body.metadata.get("deletionTimestamp"):
            return
        await _apply(ctx, body, patch)


async def _apply(ctx: Context, body: kopf.Body, patch: kopf.Patch) -> None:
    cur = body.get("status") or {}
    try:
        ds = await converge(ctx, body)
    except InvalidArgument as exc:
        set_status(patch, cur, {"phase": "Failed", "message": exc.message})
        raise kopf.PermanentError(exc.message) from None
    except ShoalError as exc:
        set_status(patch, cur, {"phase": cur.get("phase") or "Pending", "message": exc.message})
        raise _temporary(exc, ctx.settings.interval) from None
    report = await ctx.report()
    nodes = status.cache_nodes(report, ds.name)
    new = {
        "phase": "Ready",
        "masterName": ds.name,
        "generation": ds.generation,
        "observedGeneration": body.metadata.get("generation"),
        "volume": body.metadata.name,
        "message": _mounts_differ(ds, body, ctx),
        **status.dataset_status(report, ds.name, nodes),
    }
    set_status(patch, cur, new)


async def finalize(ctx: Context, body: kopf.Body) -> None:
    """Free the cache, delete the dataset in the master, drop labels, PV and PVC."""
    ns, name = body.metadata.namespace or "default", body.metadata.name or ""
    mname = crds.master_name(ns, name)
    path = f"/apis/{crds.API_VERSION}/namespaces/{ns}/{crds.DATASETS}/{name}/status"
    await ctx.kube.patch(path, {"status": {"phase": "Deleting"}})
    try:
        view = await ctx.client.submit_job({"kind": "free", "dataset": mname, "paths": [""]})
        deadline = time.monotonic() + ctx.settings.free_timeout
        while view.get("state") not in ("done", "failed", "stopped"):
            if time.monotonic() > deadline:
                log.warning(
                    "freeing %s took over %.0fs: deleting it anyway",
                    mname,
                    ctx.settings.free_timeout,
                )
                break
            await asyncio.sleep(0.2)
            view = await ctx.client.job(view["id"])
        await ctx.client.delete_dataset(mname)
        log.info("freed and deleted dataset %s in the master", mname)
    except DatasetNotFound:
        pass  # deleted before (a finalizer that ran half-way): carry on with the rest
    except Unavailable as exc:
        raise _temporary(exc, ctx.settings.interval) from None
    key = crds.node_label(ns, name)
    for node, labels in (await ctx.kube.node_labels()).items():
        if key in labels:
            await ctx.kube.label_node(node, key, None)
    await ctx.kube.delete(f"/api/v1/namespaces/{ns}/persistentvolumeclaims/{name}")
    await ctx.kube.delete(f"/api/v1/persistentvolumes/{manifests.pv_name(ns, name)}")
    ctx.datasets.discard((ns, name))
    ctx.forget_report()


async def runtime_status(ctx: Context, body: kopf.Body, patch: kopf.Patch) -> None:
    cur = body.get("status") or {}
    worker = (body.spec.get("worker") or {}) if body.spec else {}
    desired = worker.get("replicas")
    try:
        report = await ctx.report()
    except Unavailable as exc:
        set_status(patch, cur, {"phase": "Unreachable", "message": exc.message})
        return
    new = status.runtime_status(report, int(desired) if desired is not None else None)
    new["masterURL"] = ctx.settings.master
    new["message"] = ""
    set_status(patch, cur, new)


def register(registry: kopf.OperatorRegistry, ctx: Context) -> None:
    """Dataset and Runtime handlers on ``registry``."""
    every = ctx.settings.interval

    @kopf.on.resume(crds.GROUP, crds.VERSION, crds.DATASETS, registry=registry)
    @kopf.on.create(crds.GROUP, crds.VERSION, crds.DATASETS, registry=registry)
    @kopf.on.update(crds.GROUP, crds.VERSION, crds.DATASETS, field="spec", registry=registry)
    async def dataset_apply(body: kopf.Body, patch: kopf.Patch, **_: Any) -> None:
        await apply(ctx, body, patch)

    @kopf.timer(crds.GROUP, crds.VERSION, crds.DATASETS, interval=every, registry=registry)
    async def dataset_refresh(body: kopf.Body, patch: kopf.Patch, **_: Any) -> None:
        if body.metadata.get("deletionTimestamp"):
            return
        try:
            await apply(ctx, body, patch)
        except (kopf.PermanentError, kopf.TemporaryError) as exc:
            log.debug("refresh of %s: %s", body.metadata.name, exc)

    @kopf.on.delete(crds.GROUP, crds.VERSION, crds.DATASETS, registry=registry)
    async def dataset_delete(body: kopf.Body, **_: Any) -> None:
        uid = body.metadata.uid or ""
        ctx.deleting.add(uid)  # a timer pass waiting for the lock must not recreate it
        async with ctx.lock(uid):
            await finalize(ctx, body)
        ctx.forget(uid)

    @kopf.on.event(crds.GROUP, crds.VERSION, crds.DATASETS, registry=registry)
    def dataset_seen(event: kopf.RawEvent, namespace: str | None, name: str, **_: Any) -> None:
        # the webhook's view of which PVCs are datasets, current to the watch event
        if event.get("type") == "DELETED":
            ctx.datasets.discard((namespace or "default", name))
        else:
            ctx.datasets.add((namespace or "default", name))

    @kopf.on.resume(crds.GROUP, crds.VERSION, crds.RUNTIMES, registry=registry)
    @kopf.on.create(crds.GROUP, crds.VERSION, crds.RUNTIMES, registry=registry)
    @kopf.timer(crds.GROUP, crds.VERSION, crds.RUNTIMES, interval=every, registry=registry)
    async def runtime_refresh(body: kopf.Body, patch: kopf.Patch, **_: Any) -> None:
        await runtime_status(ctx, body, patch)
