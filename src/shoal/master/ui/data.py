"""What each console page shows, as plain data computed from the master's state.

The pages (:mod:`shoal.master.ui.pages`) render these dicts and the JSON routes send
them, so the numbers on a page are the numbers of :meth:`MasterService.report` taken at
the same moment (``shoal report --json`` prints that report).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from shoal.core.jobs import ACTIVE
from shoal.core.types import Dataset
from shoal.errors import PermissionDenied
from shoal.master.history import History
from shoal.master.service import MasterService

#: whether the caller may see a dataset (a token scoped to datasets sees only those)
Allowed = Callable[[str], bool]


def everyone(name: str) -> bool:
    return True


#: the window of the overview's "hit ratio over the last minutes"
HIT_WINDOW_S = 300.0
#: option names whose values are never shown (options hold no secrets; this is a guard)
_SECRET = re.compile(r"secret|password|passwd|token|credential|key", re.IGNORECASE)


def _tiers(report: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Tier use summed by tier name over live workers (what the totals count)."""
    out: dict[str, dict[str, Any]] = {}
    for w in report["workers"]:
        if w["state"] != "live":
            continue
        for t in w["tiers"]:
            row = out.setdefault(t["name"], {"name": t["name"], "used": 0, "capacity": 0})
            row["used"] += t["used"]
            row["capacity"] += t["capacity"]
    return list(out.values())


def overview(service: MasterService, history: History) -> dict[str, Any]:
    report = service.report()
    return {
        "totals": report["totals"],
        "tiers": _tiers(report),
        "hit_ratio_window": history.hit_ratio(HIT_WINDOW_S),
        "hit_window_s": HIT_WINDOW_S,
        "read_bytes_per_s": history.rates(),
    }


def _policy(ds: Dataset) -> dict[str, Any]:
    p = asdict(ds.policy)
    p["tiers"] = list(ds.policy.tiers)
    return p


def safe_uri(uri: str) -> str:
    """``uri`` without a password in its authority part."""
    parts = urlsplit(uri)
    if parts.password is None:
        return uri
    host = parts.hostname or ""
    user = f"{parts.username}:***@" if parts.username else "***@"
    port = f":{parts.port}" if parts.port else ""
    return urlunsplit((parts.scheme, user + host + port, parts.path, parts.query, parts.fragment))


def _mounts(ds: Dataset) -> list[dict[str, Any]]:
    return [
        {
            "name": m.name,
            "uri": safe_uri(m.uri),
            "options": {k: ("***" if _SECRET.search(k) else v) for k, v in m.options.items()},
        }
        for m in ds.mounts
    ]


def datasets(service: MasterService, allowed: Allowed = everyone) -> dict[str, Any]:
    report = service.report()
    defined = {d.name: d for d in service.list_datasets()}
    rows = []
    for d in report["datasets"]:
        if not allowed(d["name"]):
            continue
        ds = defined.get(d["name"])
        rows.append(
            {
                **d,
                "defined": ds is not None,
                "mounts": len(ds.mounts) if ds is not None else 0,
                "policy": _policy(ds) if ds is not None else None,
            }
        )
    return {"datasets": rows}


def _jobs_of(service: MasterService, name: str | None, allowed: Allowed) -> dict[str, Any]:
    listing = service.jobs.all()

    def shown(x: Mapping[str, Any]) -> bool:
        return (name is None or x["dataset"] == name) and allowed(x["dataset"])

    jobs = [j for j in listing["jobs"] if shown(j)]
    schedules = [s for s in listing["schedules"] if shown(s)]
    # running first, then the most recent
    jobs.sort(key=lambda j: (j["state"] not in ACTIVE, -float(j["created"])))
    for j in jobs:
        j.update(_progress(j))
    return {"jobs": jobs, "schedules": schedules, "now": time.time()}


def _progress(j: Mapping[str, Any]) -> dict[str, Any]:
    """Fractions done, and the ETA at the job's average rate (None when unknown)."""
    files = j["files_done"] + j["files_skipped"] + j["files_failed"]
    total = j["files_total"]
    frac_files = min(1.0, files / total) if total else (1.0 if j["state"] == "done" else 0.0)
    btotal = j["bytes_total"]
    frac_bytes = min(1.0, j["bytes_done"] / btotal) if btotal else frac_files
    eta: float | None = None
    if j["state"] in ACTIVE and j["bytes_per_s"] > 0 and btotal > j["bytes_done"]:
        eta = (btotal - j["bytes_done"]) / j["bytes_per_s"]
    return {"files_seen": files, "frac_files": frac_files, "frac_bytes": frac_bytes, "eta_s": eta}


def jobs(service: MasterService, allowed: Allowed = everyone) -> dict[str, Any]:
    return _jobs_of(service, None, allowed)


def dataset(
    service: MasterService, history: History, name: str, allowed: Allowed = everyone
) -> dict[str, Any]:
    if not allowed(name):
        raise PermissionDenied(f"this token does not grant dataset {name!r}")
    ds = service.get_dataset(name)  # NotFound for an unknown name
    report = service.report()
    row = next((d for d in report["datasets"] if d["name"] == name), None)
    spread = []
    for rec in service.snapshot().records:
        st = rec.stats.get("datasets")
        per = st.get(name) if isinstance(st, Mapping) else None
        if not isinstance(per, Mapping):
            per = {}
        spread.append(
            {
                "id": rec.info.id,
                "state": rec.state,
                "cached_files": _int(per.get("cached_files")) if rec.live else 0,
                "cached_bytes": _int(per.get("cached_bytes")) if rec.live else 0,
            }
        )
    return {
        "name": name,
        "report": row,
        "policy": _policy(ds),
        "mounts": _mounts(ds),
        "generation": ds.generation,
        "workers": spread,
        "hit_ratio_window": history.hit_ratio(HIT_WINDOW_S, name),
        "hit_window_s": HIT_WINDOW_S,
        "read_bytes_per_s": history.rates(name),
        **_jobs_of(service, name, allowed),
    }


def _int(v: Any) -> int:
    return max(0, int(v)) if isinstance(v, int | float) and not isinstance(v, bool) else 0


def _float(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def workers(service: MasterService, history: History) -> dict[str, Any]:
    report = service.report()
    stats = {r.info.id: r.stats for r in service.snapshot().records}
    rows = []
    for w in report["workers"]:
        st = stats.get(w["id"], {})
        raw = st.get("tiers")
        raw_tiers: list[Any] = raw if isinstance(raw, list) else []
        extra = {str(t.get("name")): t for t in raw_tiers if isinstance(t, Mapping)}
        live = w["state"] == "live"
        tiers: list[dict[str, Any]] = []
        for t in w["tiers"]:
            x = extra.get(t["name"], {})
            health = x.get("health")
            tiers.append(
                {
                    **t,
                    "high_watermark": _float(x.get("high_watermark")),
                    "low_watermark": _float(x.get("low_watermark")),
                    # a down worker's last word is not its state now
                    "health": health if live and isinstance(health, str) else None,
                }
            )
        version = st.get("version")
        rows.append(
            {
                **w,
                "tiers": tiers,
                "corrupt_pages": _int(st.get("corrupt_pages")),
                "evicted_bytes_per_s": history.evictions_per_s(w["id"]) if live else None,
                "version": version if isinstance(version, str) else None,
                "uptime_s": _float(st.get("uptime_s")) if live else None,
            }
        )
    return {"workers": rows, "totals": report["totals"]}
