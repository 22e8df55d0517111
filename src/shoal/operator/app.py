"""The operator process: kopf (Datasets, Runtimes, DataLoads), the node labeller and
the admission webhook, in one event loop.

One operator per shoal master (``--master``), one replica (kopf runs standalone, no
peering): a restarted operator picks up where the last one stopped, because every
handler is level-based and the schedules live in the master.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import kopf

from shoal.operator import dataloads, datasets, labels, webhook
from shoal.operator.context import Context, OperatorSettings

log = logging.getLogger("shoal.operator")
FINALIZER = "shoal.io/finalizer"


def build(settings: OperatorSettings) -> tuple[kopf.OperatorRegistry, Context, asyncio.Event]:
    """The handlers on a fresh registry, their shared context, and the event set once
    kopf has logged in to the API server."""
    registry = kopf.OperatorRegistry()
    ctx = Context(settings)
    logged_in = asyncio.Event()
    datasets.register(registry, ctx)
    dataloads.register(registry, ctx)

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        info = settings.connection or kopf.login_with_service_account(**kwargs)
        if info is None:
            try:
                info = kopf.login_with_kubeconfig(**kwargs)
            except OSError as exc:  # no service account and no kubeconfig
                log.error("no Kubernetes credentials: no service account, and %s", exc)
        if info is not None:
            ctx.kube.connect(info)
            logged_in.set()
        return info

    @kopf.on.startup(registry=registry)
    def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        every = ctx.settings.interval
        settings.persistence.finalizer = FINALIZER
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="shoal.io")
        settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
            prefix="shoal.io", key="last-handled-configuration"
        )
        settings.posting.level = logging.WARNING
        settings.watching.connect_timeout = 10
        settings.watching.server_timeout = 300
        settings.networking.request_timeout = 30
        # a deleted object waits for its timers to exit: look again soon, not in 60 s
        settings.background.cancellation_polling = min(5.0, every)

    return registry, ctx, logged_in


async def run(settings: OperatorSettings, ready: asyncio.Future[int] | None = None) -> None:
    """Run until cancelled. ``ready`` gets the webhook's port (0: no webhook) once the
    webhook listens and kopf has logged in."""
    registry, ctx, logged_in = build(settings)
    runner = None
    port = 0
    tasks: list[asyncio.Task[Any]] = []
    try:
        if settings.webhook_port is not None and settings.tls_cert and settings.tls_key:
            runner, port = await webhook.serve(
                lambda: ctx.datasets,
                settings.webhook_host,
                settings.webhook_port,
                settings.tls_cert,
                settings.tls_key,
            )
            log.info(
                "admission webhook on https://%s:%d%s", settings.webhook_host, port, webhook.PATH
            )
        operator = kopf.operator(
            registry=registry,
            memo=ctx,
            standalone=True,
            clusterwide=not settings.namespaces,
            namespaces=settings.namespaces,
        )
        tasks = [
            asyncio.create_task(operator, name="kopf"),
            asyncio.create_task(labels.run(ctx, logged_in), name="labels"),
        ]
        if ready is not None:
            waiter = asyncio.create_task(logged_in.wait())
            await asyncio.wait([waiter, tasks[0]], return_when=asyncio.FIRST_COMPLETED)
            waiter.cancel()
            if not ready.done():
                ready.set_result(port)
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for t in done:
            t.result()  # an operator that stopped by itself: say why
    finally:
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        if runner is not None:
            await runner.cleanup()
        await ctx.close()
