"""Node labels that follow the cache: ``shoal.io/s-<ns>-<dataset>=true`` on exactly the
Nodes whose live workers hold some of that Dataset's cache.

One loop for the whole cluster, level-based: each pass lists the Datasets, the Nodes
and the master's report, and sets or removes labels until they match, including
labels of Datasets that no longer exist (a label of the ``shoal.io/s-`` form on a Node
is this operator's). A Node is matched to a worker by name: the worker's node
identity (``shoal worker --node``, ``$SHOAL_NODE``; the chart sets it from the pod's
``spec.nodeName``) equals the Node's name.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping
from typing import Any

from shoal.errors import ShoalError
from shoal.operator import crds, status
from shoal.operator.context import Context

log = logging.getLogger("shoal.operator.labels")
PREFIX = f"{crds.GROUP}/s-"


def plan(
    nodes: Mapping[str, Mapping[str, str]],
    datasets: Iterable[tuple[str, str]],
    report: Mapping[str, Any],
) -> list[tuple[str, str, str | None]]:
    """(node, label key, value or None to remove) for every label to change."""
    wanted: dict[str, set[str]] = {}
    for ns, name in datasets:
        holders = status.cache_nodes(report, crds.master_name(ns, name))
        wanted[crds.node_label(ns, name)] = holders
    out: list[tuple[str, str, str | None]] = []
    for key, holders in sorted(wanted.items()):
        for node, value in sorted(status.label_changes(nodes, key, holders).items()):
            out.append((node, key, value))
    for node, labels in sorted(nodes.items()):
        for key in sorted(labels):
            if key.startswith(PREFIX) and key not in wanted:
                out.append((node, key, None))  # a deleted Dataset's leftover
    return out


async def list_datasets(ctx: Context) -> set[tuple[str, str]]:
    path = f"/apis/{crds.API_VERSION}/{crds.DATASETS}"
    spaces = ctx.settings.namespaces
    if spaces:
        items = []
        for ns in spaces:
            items += await ctx.kube.items(f"/apis/{crds.API_VERSION}/namespaces/{ns}/datasets")
    else:
        items = await ctx.kube.items(path)
    out = set()
    for d in items:
        meta = d.get("metadata") or {}
        if meta.get("deletionTimestamp"):
            continue  # its finalizer removes its labels
        out.add((str(meta.get("namespace") or "default"), str(meta.get("name"))))
    return out


async def label_pass(ctx: Context) -> int:
    """One pass; the number of labels changed."""
    datasets = await list_datasets(ctx)
    ctx.datasets |= datasets
    report = await ctx.report()
    changes = plan(await ctx.kube.node_labels(), datasets, report)
    for node, key, value in changes:
        await ctx.kube.label_node(node, key, value)
        log.info("node %s: %s %s", node, "set" if value else "removed", key)
    return len(changes)


async def run(ctx: Context, ready: asyncio.Event) -> None:
    """Label passes every interval, once kopf has logged in (``ready``)."""
    await ready.wait()
    while True:
        try:
            await label_pass(ctx)
        except ShoalError as exc:
            log.warning("node labels: %s", exc.message)
        await asyncio.sleep(ctx.settings.interval)
