"""Status of the custom resources computed from the master's answers, and the node
label changes that follow the cache: pure functions, no I/O.

``shoal report`` gives, per dataset, cached files and bytes, the manifest's files and
bytes (``store_files``/``store_bytes``, None before a metadata load) and the hit ratio;
per worker, its node, state, capacity and use. Which nodes hold a dataset's cache:
where the report has, per worker, ``datasets: {name: {cached_bytes: N}}``, the nodes
of live workers with N > 0; from a master that does not report that, every node with a
live worker while the dataset has any cached bytes (hash placement spreads a dataset
over all workers, so this is exact for any dataset of more than a few files).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from typing import Any

KiB = 1024


def human(n: int | None) -> str:
    """1536 -> '1.5KiB' (binary units, as the CLI prints)."""
    if n is None:
        return ""
    v = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if v < KiB or unit == "TiB":
            return f"{int(v)}B" if unit == "B" else f"{v:.1f}{unit}"
        v /= KiB
    return f"{v:.1f}PiB"  # pragma: no cover - the loop returns


def rfc3339(ts: float | None) -> str | None:
    if not ts:
        return None
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def condition(kind: str, ok: bool, reason: str, message: str = "") -> dict[str, str]:
    return {
        "type": kind,
        "status": "True" if ok else "False",
        "reason": reason,
        "message": message,
    }


def report_dataset(report: Mapping[str, Any], name: str) -> Mapping[str, Any] | None:
    for d in report.get("datasets") or []:
        if d.get("name") == name:
            return d
    return None


def cache_nodes(report: Mapping[str, Any], name: str) -> set[str]:
    """The nodes whose live workers hold some of dataset ``name``'s cache."""
    workers = [w for w in report.get("workers") or [] if w.get("state") == "live" and w.get("node")]
    if any(isinstance(w.get("datasets"), Mapping) for w in workers):
        out = set()
        for w in workers:
            per = (w.get("datasets") or {}).get(name) or {}
            if int(per.get("cached_bytes") or 0) > 0:
                out.add(str(w["node"]))
        return out
    d = report_dataset(report, name)
    if d is None or not d.get("cached_bytes"):
        return set()
    return {str(w["node"]) for w in workers}


def dataset_status(report: Mapping[str, Any], name: str, nodes: Iterable[str]) -> dict[str, Any]:
    """The report's figures for master dataset ``name`` as ``status`` fields."""
    d = report_dataset(report, name) or {}
    total_bytes = d.get("store_bytes")
    cached = int(d.get("cached_bytes") or 0)
    pct = d.get("cached_pct")
    if pct is None and total_bytes:
        pct = min(100.0, 100.0 * cached / total_bytes)
    hit = float(d.get("hit_ratio") or 0.0)
    out: dict[str, Any] = {
        "totalFiles": d.get("store_files"),
        "totalBytes": total_bytes,
        "size": human(total_bytes) if total_bytes is not None else "",
        "cachedFiles": int(d.get("cached_files") or 0),
        "cachedBytes": cached,
        "cachedPercent": None if pct is None else round(float(pct), 2),
        "cached": "" if pct is None else f"{float(pct):.1f}%",
        "hitRatio": round(hit, 4),
        "hitRatioText": f"{100 * hit:.1f}%",
        "nodes": sorted(nodes),
    }
    complete = pct is not None and float(pct) >= 100.0
    out["conditions"] = [
        condition("Ready", True, "InMaster", f"dataset {name} is defined in the master"),
        condition(
            "Cached",
            complete,
            "Complete" if complete else ("NoManifest" if pct is None else "Partial"),
            "" if pct is None else f"{float(pct):.1f}% of {human(total_bytes)} cached",
        ),
    ]
    return out


def runtime_status(report: Mapping[str, Any], desired: int | None) -> dict[str, Any]:
    workers = report.get("workers") or []
    totals = report.get("totals") or {}
    live = [w for w in workers if w.get("state") == "live"]
    ready = len(live)
    want = desired if desired is not None else ready
    phase = "Ready" if ready >= max(1, want) else ("Degraded" if ready else "Pending")
    return {
        "phase": phase,
        "readyWorkers": ready,
        "desiredWorkers": want,
        "expiredWorkers": len(workers) - ready,
        "capacityBytes": int(totals.get("capacity") or 0),
        "usedBytes": int(totals.get("used") or 0),
        "capacity": human(int(totals.get("capacity") or 0)),
        "used": human(int(totals.get("used") or 0)),
        "datasets": int(totals.get("datasets") or 0),
        "workers": [
            {
                "id": str(w.get("id")),
                "node": str(w.get("node") or ""),
                "state": str(w.get("state")),
                "capacityBytes": int(w.get("capacity") or 0),
                "usedBytes": int(w.get("used") or 0),
            }
            for w in workers
        ],
        "conditions": [
            condition("Ready", phase == "Ready", phase, f"{ready}/{want} workers live"),
        ],
    }


_JOB_PHASES = {
    "pending": "Running",
    "running": "Running",
    "done": "Complete",
    "failed": "Failed",
    "stopped": "Stopped",
}


def job_phase(view: Mapping[str, Any]) -> str:
    if view.get("state") == "done" and view.get("files_failed"):
        return "Failed"
    return _JOB_PHASES.get(str(view.get("state")), "Running")


def dataload_status(view: Mapping[str, Any], now: float) -> dict[str, Any]:
    """A job's view (``shoal job status --json``) as DataLoad ``status`` fields."""
    created = float(view.get("created") or now)
    end = view.get("finished") or None
    secs = max(0.0, float(end or now) - created)
    return {
        "phase": job_phase(view),
        "jobId": str(view.get("id")),
        "filesTotal": int(view.get("files_total") or 0),
        "filesDone": int(view.get("files_done") or 0),
        "filesSkipped": int(view.get("files_skipped") or 0),
        "filesFailed": int(view.get("files_failed") or 0),
        "bytesDone": int(view.get("bytes_done") or 0),
        "failures": [
            {"path": str(p), "error": str(e or "")[:300]}
            for p, e in list(view.get("failures") or [])[:10]
        ],
        "duration": f"{secs:.1f}s",
        "startTime": rfc3339(created),
        "completionTime": rfc3339(end),
        "message": str(view.get("error") or ""),
    }


def label_changes(
    nodes: Mapping[str, Mapping[str, str]], key: str, holders: Iterable[str]
) -> dict[str, str | None]:
    """Node name -> the label value to set (``'true'``) or remove (None) so that
    exactly the ``holders`` that exist as Nodes carry ``key=true``."""
    want = set(holders)
    out: dict[str, str | None] = {}
    for node, labels in nodes.items():
        has = labels.get(key) == "true"
        if node in want and not has:
            out[node] = "true"
        elif node not in want and key in labels:
            out[node] = None
    return out
