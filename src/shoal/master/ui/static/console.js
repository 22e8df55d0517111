// shoal console: refreshes the server-rendered parts of a page, draws the charts
// (plain SVG) from the master's history, and sends the stop/resume buttons to the job
// API. No dependencies; everything comes from the master that served the page.
"use strict";

const PAGE_EVERY_MS = 2000;
const CHART_EVERY_MS = 5000;
const SVG = "http://www.w3.org/2000/svg";
const W = 640, H = 180, PAD_L = 64, PAD_R = 8, PAD_T = 8, PAD_B = 22;

function setStatus(ok, text) {
  const el = document.getElementById("status");
  if (!el) return;
  el.dataset.state = ok ? "ok" : "error";
  el.textContent = text;
}

async function getJSON(url) {
  const resp = await fetch(url, { headers: { Accept: "application/json" }, cache: "no-store" });
  if (!resp.ok) throw new Error(url + ": HTTP " + resp.status);
  return resp.json();
}

// --- parts ------------------------------------------------------------------------------

function swap(el, html) {
  if (el.dataset.html === html) return;
  const open = new Set();
  el.querySelectorAll("details[open][data-key]").forEach((d) => open.add(d.dataset.key));
  el.innerHTML = html;
  el.dataset.html = html;
  el.querySelectorAll("details[data-key]").forEach((d) => {
    if (open.has(d.dataset.key)) d.open = true;
  });
}

let refreshing = false;
async function refreshParts() {
  const api = document.body.dataset.api;
  if (!api || refreshing) return;
  refreshing = true;
  try {
    const got = await getJSON(api);
    for (const [name, html] of Object.entries(got.parts)) {
      const el = document.querySelector('[data-part="' + name + '"]');
      if (el) swap(el, html);
    }
    document.body.dataset.refreshed = String(Date.now());
    setStatus(true, "live");
  } catch (err) {
    setStatus(false, "master unreachable");
  } finally {
    refreshing = false;
  }
}

// --- charts -----------------------------------------------------------------------------

const UNITS = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
function fmtBytes(v) {
  let i = 0;
  while (Math.abs(v) >= 1024 && i < UNITS.length - 1) { v /= 1024; i++; }
  return (i === 0 ? Math.round(v) : v.toFixed(1)) + " " + UNITS[i];
}
const FMT = {
  rate: (v) => fmtBytes(v) + "/s",
  bytes: fmtBytes,
  ratio: (v) => (100 * v).toFixed(0) + "%",
  count: (v) => String(Math.round(v)),
};

function clock(t) {
  const d = new Date(t * 1000);
  return d.toISOString().slice(11, 19);
}

function node(tag, attrs, text) {
  const el = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, String(v));
  if (text !== undefined) el.textContent = text;
  return el;
}

// series: [{name, values}], values may hold nulls (gaps)
function draw(fig, t, series, fmt, fixedMax) {
  const plot = fig.querySelector(".plot");
  const svg = node("svg", { viewBox: "0 0 " + W + " " + H, role: "img", class: "svg" });
  let max = fixedMax || 0;
  if (!fixedMax) {
    for (const s of series) for (const v of s.values) if (v !== null && v > max) max = v;
    if (max <= 0) max = 1;
  }
  const x0 = t.length ? t[0] : 0, x1 = t.length ? t[t.length - 1] : 1;
  const sx = (x) => PAD_L + ((x - x0) / Math.max(1e-9, x1 - x0)) * (W - PAD_L - PAD_R);
  const sy = (y) => PAD_T + (1 - y / max) * (H - PAD_T - PAD_B);
  svg.appendChild(node("line", { x1: PAD_L, y1: sy(0), x2: W - PAD_R, y2: sy(0), class: "axis" }));
  svg.appendChild(node("line", { x1: PAD_L, y1: sy(max), x2: W - PAD_R, y2: sy(max), class: "grid" }));
  svg.appendChild(node("text", { x: PAD_L - 4, y: sy(max) + 4, class: "label end" }, FMT[fmt](max)));
  svg.appendChild(node("text", { x: PAD_L - 4, y: sy(0), class: "label end" }, FMT[fmt](0)));
  if (t.length) {
    svg.appendChild(node("text", { x: PAD_L, y: H - 4, class: "label" }, clock(x0)));
    svg.appendChild(node("text", { x: W - PAD_R, y: H - 4, class: "label end" }, clock(x1)));
  }
  series.forEach((s, i) => {
    let pts = [];
    const flush = () => {
      if (pts.length === 1) {  // a lone point between gaps: a dot, not an invisible line
        const [x, y] = pts[0].split(",");
        svg.appendChild(node("circle", { cx: x, cy: y, r: 2.5, class: "dot s" + i }));
      } else if (pts.length) {
        svg.appendChild(node("polyline", { points: pts.join(" "), class: "line s" + i }));
      }
      pts = [];
    };
    s.values.forEach((v, j) => {
      if (v === null || v === undefined) { flush(); return; }
      pts.push(sx(t[j]).toFixed(1) + "," + sy(v).toFixed(1));
    });
    flush();
  });
  const legend = document.createElement("div");
  legend.className = "legend";
  series.forEach((s, i) => {
    const item = document.createElement("span");
    item.className = "key s" + i;
    const last = [...s.values].reverse().find((v) => v !== null && v !== undefined);
    item.textContent = s.name + (last === undefined ? "" : " " + FMT[fmt](last));
    legend.appendChild(item);
  });
  plot.replaceChildren(svg, legend);
  fig.dataset.points = String(t.length);
}

function chartSeries(kind, h) {
  if (kind === "throughput") {
    const r = h.read_bytes_per_s;
    return [[{ name: "local", values: r.local || [] }, { name: "remote", values: r.remote || [] },
      { name: "under store", values: r.ufs || [] }], "rate", 0];
  }
  if (kind === "hit_ratio") return [[{ name: "hit ratio", values: h.hit_ratio }], "ratio", 1];
  if (kind === "cache") {
    const s = [{ name: "cached", values: h.cached_bytes }];
    for (const [name, tier] of Object.entries(h.tiers || {})) {
      s.push({ name: name + " used", values: tier.used });
    }
    return [s, "bytes", 0];
  }
  return [[{ name: "up", values: h.workers_live || [] }, { name: "down", values: h.workers_down || [] }],
    "count", 0];
}

async function refreshCharts() {
  const figs = document.querySelectorAll("figure.chart");
  if (!figs.length) return;
  const byDataset = new Map();
  try {
    for (const fig of figs) {
      const ds = fig.dataset.dataset || "";
      if (!byDataset.has(ds)) {
        const q = "?minutes=60" + (ds ? "&dataset=" + encodeURIComponent(ds) : "");
        byDataset.set(ds, await getJSON("/ui/api/history" + q));
      }
      const h = byDataset.get(ds);
      const [series, fmt, max] = chartSeries(fig.dataset.chart, h);
      draw(fig, h.t, series, fmt, max);
    }
  } catch (err) {
    setStatus(false, "master unreachable");
  }
}

// --- job buttons ------------------------------------------------------------------------

document.addEventListener("click", async (ev) => {
  const btn = ev.target.closest("button[data-action][data-job]");
  if (!btn) return;
  btn.disabled = true;
  const url = "/api/v1/jobs/" + encodeURIComponent(btn.dataset.job) + "/" + btn.dataset.action;
  try {
    // the header marks a request from a page script (a cross-site form cannot set it)
    const resp = await fetch(url, { method: "POST", headers: { "X-Requested-With": "shoal-console" } });
    if (!resp.ok) {
      const body = await resp.json().catch(() => ({}));
      setStatus(false, (body.error && body.error.message) || "HTTP " + resp.status);
    }
  } catch (err) {
    setStatus(false, "master unreachable");
  }
  await refreshParts();
});

document.addEventListener("DOMContentLoaded", () => {
  refreshParts();  // at once: the page may have been rendered from a cache or long ago
  refreshCharts();
  setInterval(refreshParts, PAGE_EVERY_MS);
  setInterval(refreshCharts, CHART_EVERY_MS);
});
