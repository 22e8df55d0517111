"""Server-rendered HTML of the console's pages.

A page is a layout around named *parts*; each part is a fragment that the page's
script swaps in from the page's JSON route (``{"data", "parts"}``) every few seconds,
so the live numbers, tables and progress bars are rendered here only. Charts are the
one thing the script draws (SVG, from ``/ui/api/history``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import shoal
from shoal.core.jobs import ACTIVE, STOPPED
from shoal.master.ui.fmt import bar, count, duration, esc, nbytes, rate, table, url_part, val, when

PREFIX = "/ui"
NAV: tuple[tuple[str, str, str], ...] = (
    ("overview", "Overview", "/"),
    ("datasets", "Datasets", "/datasets"),
    ("jobs", "Jobs", "/jobs"),
    ("workers", "Workers", "/workers"),
)


def layout(page: str, title: str, api: str, parts: Mapping[str, str], body: str) -> str:
    here = ' class="here"'
    nav = "".join(
        f'<a href="{PREFIX}{href}"{here if key == page else ""}>{esc(label)}</a>'
        for key, label, href in NAV
    )
    filled = body.format_map({k: _part(k, v) for k, v in parts.items()})
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>shoal · {esc(title)}</title>"
        '<link rel="icon" href="data:,">'
        f'<link rel="stylesheet" href="{PREFIX}/static/console.css">'
        f'<script src="{PREFIX}/static/console.js" defer></script></head>'
        f'<body data-page="{esc(page)}" data-api="{esc(api)}">'
        f'<header><span class="brand">shoal</span><nav>{nav}</nav>'
        f'<span id="status" class="status" data-state="ok">live</span>'
        f'<span class="version">v{esc(shoal.__version__)}</span></header>'
        f"<main><h1>{esc(title)}</h1>{filled}</main></body></html>"
    )


def error_page(page: str, status: int, message: str) -> str:
    """The console's frame around an error (a page with no live parts)."""
    body = f'<p class="error" data-status="{status}">{esc(message)}</p>'
    body = body.replace("{", "{{").replace("}", "}}")  # layout() formats the body
    return layout(page if page != "dataset" else "datasets", f"Error {status}", "", {}, body)


def _part(name: str, html: str) -> str:
    return f'<div class="part" data-part="{esc(name)}">{html}</div>'


def chart(kind: str, caption: str, dataset: str = "") -> str:
    return (
        f'<figure class="chart" data-chart="{esc(kind)}" data-dataset="{esc(dataset)}">'
        f'<figcaption>{esc(caption)}</figcaption><div class="plot"></div></figure>'
    )


# --- overview --------------------------------------------------------------------------


def overview_parts(d: Mapping[str, Any]) -> dict[str, str]:
    t = d["totals"]
    tiles = [
        ("Capacity", val(t["capacity"], "bytes", "totals.capacity")),
        ("Used", val(t["used"], "bytes", "totals.used")),
        ("Cached", val(t["cached_bytes"], "bytes", "totals.cached_bytes")),
        ("Cached files", val(t["cached_files"], "count", "totals.cached_files")),
        ("Hit ratio (all time)", val(t["hit_ratio"], "ratio", "totals.hit_ratio")),
        (
            f"Hit ratio (last {int(d['hit_window_s'] // 60)} min)",
            val(d["hit_ratio_window"], "ratio", "hit_ratio_window"),
        ),
        ("Workers up", val(t["workers_live"], "count", "totals.workers_live", "up")),
        ("Workers down", val(t["workers_expired"], "count", "totals.workers_expired", "down")),
        ("Datasets", val(t["datasets"], "count", "totals.datasets")),
        ("Corrupt pages", val(t["corrupt_pages"], "count", "totals.corrupt_pages")),
    ]
    rates = d["read_bytes_per_s"]
    tiles += [
        (f"Read {label}", val(rates[src], "rate", f"read_bytes_per_s.{src}"))
        for src, label in (("local", "local"), ("remote", "remote"), ("ufs", "under store"))
    ]
    rows = [
        f'<tr data-tier="{esc(tr["name"])}"><td>{esc(tr["name"])}</td>'
        f"<td>{val(tr['used'], 'bytes', 'used')}</td>"
        f"<td>{val(tr['capacity'], 'bytes', 'capacity')}</td>"
        f"<td>{bar(tr['used'] / tr['capacity'] if tr['capacity'] else 0, 'use')}</td></tr>"
        for tr in d["tiers"]
    ]
    return {
        "tiles": '<div class="tiles">'
        + "".join(f'<div class="tile"><h3>{esc(k)}</h3>{v}</div>' for k, v in tiles)
        + "</div>",
        "tiers": table(["Tier", "Used", "Capacity", "Use"], rows, "No live worker has a tier."),
    }


OVERVIEW = (
    "{tiles}"
    '<div class="charts">'
    + chart("throughput", "Read throughput by source")
    + chart("hit_ratio", "Hit ratio")
    + chart("cache", "Cached bytes and tier use")
    + chart("workers", "Workers up / down")
    + "</div><h2>Tiers (live workers)</h2>{tiers}"
)


# --- datasets --------------------------------------------------------------------------


def _policy_text(p: Mapping[str, Any] | None) -> str:
    if p is None:
        return "(deleted)"
    bits = [f"{p['placement']} x{p['replicas']}", "/".join(p["tiers"]), p["eviction"]]
    if p["pin"]:
        bits.append("pinned")
    if p["ttl"]:
        bits.append(f"ttl {p['ttl']:g}s")
    return ", ".join(bits)


def datasets_parts(d: Mapping[str, Any]) -> dict[str, str]:
    rows = []
    for ds in d["datasets"]:
        name = ds["name"]
        link = (
            f'<a href="{PREFIX}/datasets/{esc(url_part(name))}">{esc(name)}</a>'
            if ds["defined"]
            else esc(name)
        )
        rows.append(
            f'<tr data-dataset="{esc(name)}"><td>{link}</td>'
            f"<td>{val(ds['store_bytes'], 'bytes', 'store_bytes')}</td>"
            f"<td>{val(ds['store_files'], 'count', 'store_files')}</td>"
            f"<td>{val(ds['cached_bytes'], 'bytes', 'cached_bytes')}</td>"
            f"<td>{val(ds['cached_files'], 'count', 'cached_files')}</td>"
            f"<td>{bar((ds['cached_pct'] or 0) / 100, 'cached')} "
            f"{val(ds['cached_pct'], 'pct100', 'cached_pct')}</td>"
            f"<td>{val(ds['hit_ratio'], 'ratio', 'hit_ratio')}</td>"
            f"<td>{esc(_policy_text(ds['policy']))}</td></tr>"
        )
    head = ["Dataset", "Size", "Files", "Cached", "Cached files", "Cached %", "Hit ratio"]
    return {"list": table([*head, "Policy"], rows, "No datasets yet.")}


DATASETS = "{list}"


def dataset_parts(d: Mapping[str, Any]) -> dict[str, str]:
    r = d["report"] or {}
    tiles = [
        ("Size", val(r.get("store_bytes"), "bytes", "store_bytes")),
        ("Cached", val(r.get("cached_bytes"), "bytes", "cached_bytes")),
        ("Cached %", val(r.get("cached_pct"), "pct100", "cached_pct")),
        ("Hit ratio (all time)", val(r.get("hit_ratio"), "ratio", "hit_ratio")),
        (
            f"Hit ratio (last {int(d['hit_window_s'] // 60)} min)",
            val(d["hit_ratio_window"], "ratio", "hit_ratio_window"),
        ),
    ]
    mounts = [
        f"<tr><td>{esc(m['name'])}</td><td><code>{esc(m['uri'])}</code></td>"
        f"<td>{esc(', '.join(f'{k}={v}' for k, v in sorted(m['options'].items())))}</td></tr>"
        for m in d["mounts"]
    ]
    total = sum(w["cached_bytes"] for w in d["workers"]) or 0
    spread = [
        f'<tr data-worker="{esc(w["id"])}"><td>{esc(w["id"])}</td><td>{_state(w["state"])}</td>'
        f"<td>{val(w['cached_files'], 'count', 'cached_files')}</td>"
        f"<td>{val(w['cached_bytes'], 'bytes', 'cached_bytes')}</td>"
        f"<td>{bar(w['cached_bytes'] / total if total else 0, 'share')}</td></tr>"
        for w in d["workers"]
    ]
    policy = "".join(
        f"<dt>{esc(k)}</dt><dd>{esc(_show(k, v))}</dd>" for k, v in sorted(d["policy"].items())
    )
    return {
        "tiles": '<div class="tiles">'
        + "".join(f'<div class="tile"><h3>{esc(k)}</h3>{v}</div>' for k, v in tiles)
        + "</div>",
        "mounts": table(["Mount", "URI", "Options"], mounts, "No mounts."),
        "policy": f'<dl class="policy">{policy}</dl>',
        "workers": table(["Worker", "State", "Files", "Bytes", "Share"], spread, "No workers."),
        "jobs": jobs_table(d["jobs"]),
        "schedules": schedules_table(d["schedules"]),
    }


def _show(key: str, v: Any) -> str:
    if key == "page_size":
        return nbytes(v)
    if key == "staleness":
        return "never revalidate" if v < 0 else ("always" if v == 0 else f"every {v:g} s")
    if key == "ttl":
        return "never expires" if not v else duration(v)
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, list | tuple):
        return ", ".join(map(str, v))
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v)


def dataset_body(name: str) -> str:
    charts = chart("throughput", "Read throughput by source", name) + chart(
        "hit_ratio", "Hit ratio", name
    )
    return (
        "{tiles}<div class='charts'>"
        + charts.replace("{", "{{").replace("}", "}}")  # the body is a format string
        + "</div><h2>Mounts</h2>{mounts}<h2>Policy</h2>{policy}"
        "<h2>Cache by worker</h2>{workers}<h2>Jobs</h2>{jobs}<h2>Schedules</h2>{schedules}"
    )


# --- jobs --------------------------------------------------------------------------------


def _buttons(j: Mapping[str, Any]) -> str:
    jid = esc(j["id"])
    if j["state"] in ACTIVE or j["state"] == "enabled":
        label = "Stop" if j["kind"] != "schedule" else "Disable"
        return f'<button data-action="stop" data-job="{jid}">{label}</button>'
    if j["state"] in (STOPPED, "disabled"):
        label = "Resume" if j["kind"] != "schedule" else "Enable"
        return f'<button data-action="resume" data-job="{jid}">{label}</button>'
    return ""


def _failures(j: Mapping[str, Any]) -> str:
    n = j["files_failed"]
    if not n and not j.get("error"):
        return val(0, "count", "files_failed")
    items = "".join(
        f"<li><code>{esc(path)}</code>: {esc(reason)}</li>" for path, reason in j["failures"]
    )
    if j.get("error"):
        items = f'<li class="error">{esc(j["error"])}</li>' + items
    return (
        f'<details data-key="fail-{esc(j["id"])}"><summary>{val(n, "count", "files_failed")}'
        f" failed</summary><ul>{items}</ul></details>"
    )


def _took(j: Mapping[str, Any]) -> str:
    return duration(j["finished"] - j["created"]) if j["finished"] else ""


def jobs_table(jobs: list[Mapping[str, Any]]) -> str:
    rows = []
    for j in jobs:
        jid = j["id"]
        files = f"{count(j['files_seen'])} / {count(j['files_total'])} files"
        nb = f"{nbytes(j['bytes_done'])} / {nbytes(j['bytes_total'])}"
        rows.append(
            f'<tr data-job="{esc(jid)}" data-state="{esc(j["state"])}">'
            f"<td><code>{esc(jid)}</code></td><td>{esc(j['kind'])}</td>"
            f"<td>{esc(j['dataset'])}</td><td>{_state(j['state'])}</td>"
            f'<td class="progress">{bar(j["frac_files"], files, job=jid, what="files")}'
            f'<span class="sub">{esc(files)}</span>'
            f"{bar(j['frac_bytes'], nb, job=jid, what='bytes')}"
            f'<span class="sub">{esc(nb)}</span></td>'
            f"<td>{esc(rate(j['bytes_per_s']))}<br>"
            f'<span class="sub">{j["files_per_s"]:.1f} files/s</span></td>'
            f"<td>{val(j['eta_s'], 'duration', 'eta_s')}</td>"
            f"<td>{_failures(j)}</td><td>{esc(_took(j))}</td>"
            f"<td>{_buttons(j)}</td></tr>"
        )
    head = ["Job", "Kind", "Dataset", "State", "Progress", "Rate", "ETA", "Failures"]
    return table([*head, "Took", ""], rows, "No jobs yet.", "jobs")


def schedules_table(schedules: list[Mapping[str, Any]]) -> str:
    rows = [
        f'<tr data-schedule="{esc(s["id"])}"><td><code>{esc(s["id"])}</code></td>'
        f"<td>{esc(s['spec']['kind'])}</td><td>{esc(s['dataset'])}</td>"
        f"<td><code>{esc(s['cron'])}</code></td><td>{_state(s['state'])}</td>"
        f"<td>{esc(when(s['next_run']) if s['enabled'] else '-')}</td>"
        f"<td><code>{esc(s['last_job'] or '-')}</code></td><td>{_buttons(s)}</td></tr>"
        for s in schedules
    ]
    head = ["Schedule", "Kind", "Dataset", "Cron", "State", "Next run", "Last job", ""]
    return table(head, rows, "No schedules.")


def jobs_parts(d: Mapping[str, Any]) -> dict[str, str]:
    return {"jobs": jobs_table(d["jobs"]), "schedules": schedules_table(d["schedules"])}


JOBS = "<h2>Loads, frees and syncs</h2>{jobs}<h2>Schedules</h2>{schedules}"


# --- workers -----------------------------------------------------------------------------


def _state(state: str) -> str:
    shown = {"expired": "down", "live": "up"}.get(state, state)
    return f'<span class="state s-{esc(shown)}" data-field="state" data-value="{esc(state)}">{esc(shown)}</span>'


def _tier(t: Mapping[str, Any]) -> str:
    cap = t["capacity"]
    wm = ""
    if t["high_watermark"] is not None and t["low_watermark"] is not None:
        wm = f" · watermarks {t['low_watermark']:.0%}-{t['high_watermark']:.0%}"
    health = t["health"] or "-"
    return (
        f'<div class="tier" data-tier="{esc(t["name"])}"><b>{esc(t["name"])}</b> '
        f"{val(t['used'], 'bytes', 'used')} / {val(cap, 'bytes', 'capacity')} "
        f"{bar(t['used'] / cap if cap else 0, 'use')}"
        f'<span class="sub">{esc(t["pages"])} pages{esc(wm)} · disk '
        f'<span class="health h-{esc(health)}" data-field="health">{esc(health)}</span></span></div>'
    )


def workers_parts(d: Mapping[str, Any]) -> dict[str, str]:
    rows = [
        f'<tr data-worker="{esc(w["id"])}" data-state="{esc(w["state"])}">'
        f"<td><code>{esc(w['id'])}</code><br><span class='sub'>{esc(w['host'])}:{esc(w['port'])}"
        f"{esc(' · node ' + w['node'] if w['node'] else '')}</span></td>"
        f"<td>{_state(w['state'])}<br><span class='sub'>heartbeat "
        f"{val(w['last_heartbeat_age_s'], 'duration', 'last_heartbeat_age_s')} ago</span></td>"
        f"<td>{''.join(_tier(t) for t in w['tiers'])}</td>"
        f"<td>{val(w['used'], 'bytes', 'used')} / {val(w['capacity'], 'bytes', 'capacity')}</td>"
        f"<td>{val(w['evicted_bytes_per_s'], 'rate', 'evicted_bytes_per_s')}</td>"
        f"<td>{val(w['corrupt_pages'], 'count', 'corrupt_pages')}</td>"
        f"<td>{val(w['version'], 'text', 'version')}</td>"
        f"<td>{val(w['uptime_s'], 'duration', 'uptime_s')}</td></tr>"
        for w in d["workers"]
    ]
    t = d["totals"]
    summary = (
        f'<p class="summary">{val(t["workers_live"], "count", "totals.workers_live", "up")} up, '
        f"{val(t['workers_expired'], 'count', 'totals.workers_expired', 'down')} down</p>"
    )
    head = ["Worker", "State", "Tiers", "Used / quota", "Evicted", "Corrupt pages"]
    return {"workers": summary + table([*head, "Version", "Uptime"], rows, "No workers.")}


WORKERS = "{workers}"
