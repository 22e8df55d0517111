"""kopf handlers for DataLoads: load, free or sync through the master's job API.

``Once``: one job, followed to its end. ``Cron``: a schedule the master owns (it runs
on while the operator is down or restarting); status follows its latest job.
``RunAfter``: waits until the named DataLoad is Complete, then runs once.

Restart-safe: the job or schedule id is kept in ``status``. Before submitting, the
phase is set to ``Submitting`` (written at once, not with the handler's patch); a
pass that finds ``Submitting`` without an id knows the operator may have died between
the two, and adopts the job the master holds for the same spec (made after the
DataLoad was, and not recorded by another DataLoad) instead of submitting twice.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Collection, Mapping
from typing import Any

import kopf

from shoal.errors import InvalidArgument, ShoalError
from shoal.operator import crds, status
from shoal.operator.context import Context
from shoal.operator.datasets import set_status

log = logging.getLogger("shoal.operator.dataloads")
_DONE = ("Complete", "Failed", "Stopped")
#: clock skew allowed between the API server's creationTimestamp and the master
_SKEW_S = 5.0


def _created(body: kopf.Body) -> float:
    text = body.metadata.get("creationTimestamp")
    if not text:
        return 0.0
    try:
        return dt.datetime.fromisoformat(str(text).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


def adopt(
    listing: Mapping[str, Any],
    plan: crds.DataLoadPlan,
    since: float,
    claimed: Collection[str] = (),
) -> dict[str, Any] | None:
    """The job (Once, RunAfter) or schedule (Cron) in ``listing`` (``jobs()``) that this
    DataLoad submitted, if any: same spec, made after ``since``, not in ``claimed``
    (the ids other DataLoads recorded)."""
    if plan.schedule is not None:
        for s in listing.get("schedules") or []:
            if (
                s.get("cron") == plan.schedule
                and s.get("id") not in claimed
                and crds.same_job(s.get("spec") or {}, plan.job)
            ):
                return dict(s)
        return None
    mine: list[Mapping[str, Any]] = [
        j
        for j in listing.get("jobs") or []
        if not j.get("schedule")
        and j.get("id") not in claimed
        and crds.same_job(j.get("spec") or {}, plan.job)
        and float(j.get("created") or 0) >= since - _SKEW_S
    ]
    if not mine:
        return None
    first = min(mine, key=lambda j: float(j.get("created") or 0))
    return dict(first.items())


def _path(body: kopf.Body, sub: str = "") -> str:
    ns = body.metadata.namespace or "default"
    base = f"/apis/{crds.API_VERSION}/namespaces/{ns}/{crds.DATALOADS}/{body.metadata.name}"
    return f"{base}/{sub}" if sub else base


async def _submit(
    ctx: Context, body: kopf.Body, plan: crds.DataLoadPlan, cur: Mapping[str, Any]
) -> dict[str, Any]:
    """Adopt the job or schedule an interrupted pass submitted, else submit one."""
    if cur.get("phase") == "Submitting":
        ns = body.metadata.namespace or "default"
        others = await ctx.kube.items(f"/apis/{crds.API_VERSION}/namespaces/{ns}/{crds.DATALOADS}")
        claimed = {
            str(v)
            for o in others
            if (o.get("metadata") or {}).get("uid") != body.metadata.uid
            for k in ("jobId", "scheduleId")
            if (v := (o.get("status") or {}).get(k))
        }
        found = adopt(await ctx.client.jobs(), plan, _created(body), claimed)
        if found is not None:
            log.info("DataLoad %s: adopted %s", body.metadata.name, found["id"])
            return found
    await ctx.kube.patch(_path(body, "status"), {"status": {"phase": "Submitting"}})
    view = await ctx.client.submit_job(plan.job, plan.schedule)
    ctx.submitted[body.metadata.uid or ""] = str(view["id"])
    return view


async def _prerequisite_done(ctx: Context, ns: str, other: str) -> bool:
    path = f"/apis/{crds.API_VERSION}/namespaces/{ns}/{crds.DATALOADS}/{other}"
    obj = await ctx.kube.get(path)
    st = (obj or {}).get("status") or {}
    return st.get("phase") == "Complete" or st.get("lastRunPhase") == "Complete"


async def _cron(
    ctx: Context, body: kopf.Body, plan: crds.DataLoadPlan, cur: Mapping[str, Any]
) -> dict[str, Any]:
    sid = cur.get("scheduleId")
    listing = await ctx.client.jobs()
    if not sid:
        sid = (await _submit(ctx, body, plan, cur))["id"]
        log.info("DataLoad %s: schedule %s at %r", body.metadata.name, sid, plan.schedule)
        listing = await ctx.client.jobs()
    sched = next((s for s in listing.get("schedules") or [] if s.get("id") == sid), None)
    if sched is None:
        sched = await ctx.client.job(sid)
    runs = sorted(
        (j for j in listing.get("jobs") or [] if j.get("schedule") == sid),
        key=lambda j: float(j.get("created") or 0),
    )
    new: dict[str, Any] = {
        "phase": "Scheduled" if sched.get("enabled", True) else "Stopped",
        "scheduleId": sid,
        "runs": len(runs),
        "nextRun": status.rfc3339(sched.get("next_run")),
        "message": "",
    }
    if runs:
        last = status.dataload_status(runs[-1], time.time())
        new["lastRunPhase"] = last.pop("phase")
        new["lastRun"] = last["startTime"]
        new.update(last)
    return new


async def _once(
    ctx: Context, body: kopf.Body, plan: crds.DataLoadPlan, cur: Mapping[str, Any]
) -> dict[str, Any] | None:
    ns = body.metadata.namespace or "default"
    jid = cur.get("jobId")
    if jid and cur.get("phase") in _DONE and cur.get("completionTime"):
        return None  # finished and recorded: nothing more to ask
    if not jid:
        if plan.run_after and not await _prerequisite_done(ctx, ns, plan.run_after):
            return {"phase": "Waiting", "message": f"waiting for DataLoad {plan.run_after}"}
        view = await _submit(ctx, body, plan, cur)
        log.info("DataLoad %s: job %s", body.metadata.name, view["id"])
        jid = view["id"]
    view = await ctx.client.job(jid)
    new = status.dataload_status(view, time.time())
    new["lastRun"] = new["startTime"]
    return new


async def reconcile(ctx: Context, body: kopf.Body, patch: kopf.Patch) -> None:
    """One pass over a DataLoad; its handler and its timer run it under one lock, and
    an id submitted but not yet in the status (kopf writes the patch after the
    handler returns) is taken from memory, so nothing is ever submitted twice."""
    uid = body.metadata.uid or ""
    async with ctx.lock(uid):
        await _reconcile(ctx, body, patch)


async def _reconcile(ctx: Context, body: kopf.Body, patch: kopf.Patch) -> None:
    cur = dict(body.get("status") or {})
    uid = body.metadata.uid or ""
    key = "scheduleId" if body.spec.get("policy") == "Cron" else "jobId"
    if cur.get(key):
        ctx.submitted.pop(uid, None)
    elif uid in ctx.submitted:
        cur[key] = ctx.submitted[uid]
    ns = body.metadata.namespace or "default"
    try:
        plan = crds.dataload_plan(body.spec, ns)
    except InvalidArgument as exc:
        set_status(patch, cur, {"phase": "Failed", "message": exc.message})
        raise kopf.PermanentError(exc.message) from None
    try:
        if plan.schedule is not None:
            new: dict[str, Any] | None = await _cron(ctx, body, plan, cur)
        else:
            new = await _once(ctx, body, plan, cur)
    except InvalidArgument as exc:  # e.g. the master refused the spec
        set_status(patch, cur, {"phase": "Failed", "message": exc.message})
        raise kopf.PermanentError(exc.message) from None
    except ShoalError as exc:
        set_status(patch, cur, {"message": exc.message})
        raise kopf.TemporaryError(exc.message, delay=ctx.settings.interval) from None
    if new is not None:
        set_status(patch, cur, new)


async def release(ctx: Context, body: kopf.Body) -> None:
    """A deleted DataLoad disables its schedule and stops its running job."""
    cur = body.get("status") or {}
    for key in ("scheduleId", "jobId"):
        jid = cur.get(key)
        if not jid or (key == "jobId" and cur.get("phase") in _DONE):
            continue
        try:
            await ctx.client.stop_job(jid)
        except ShoalError as exc:
            log.info("DataLoad %s: stopping %s: %s", body.metadata.name, jid, exc.message)


def register(registry: kopf.OperatorRegistry, ctx: Context) -> None:
    every = ctx.settings.interval

    @kopf.on.resume(crds.GROUP, crds.VERSION, crds.DATALOADS, registry=registry)
    @kopf.on.create(crds.GROUP, crds.VERSION, crds.DATALOADS, registry=registry)
    async def dataload_start(body: kopf.Body, patch: kopf.Patch, **_: Any) -> None:
        await reconcile(ctx, body, patch)

    @kopf.timer(crds.GROUP, crds.VERSION, crds.DATALOADS, interval=every, registry=registry)
    async def dataload_poll(body: kopf.Body, patch: kopf.Patch, **_: Any) -> None:
        if body.metadata.get("deletionTimestamp"):
            return
        try:
            await reconcile(ctx, body, patch)
        except (kopf.PermanentError, kopf.TemporaryError) as exc:
            log.debug("poll of %s: %s", body.metadata.name, exc)

    @kopf.on.delete(crds.GROUP, crds.VERSION, crds.DATALOADS, registry=registry)
    async def dataload_delete(body: kopf.Body, **_: Any) -> None:
        async with ctx.lock(body.metadata.uid or ""):
            await release(ctx, body)
        ctx.forget(body.metadata.uid or "")
