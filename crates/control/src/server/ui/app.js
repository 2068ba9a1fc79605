// The dashboard's whole logic: sign in with a token (from the URL fragment or the form, kept in
// this tab's session storage, never in a query string), then read the control plane's REST API
// every few seconds and draw what it says. Build-free: a plain module, no library.

const REFRESH_MS = 2000;
const KEY = "rackmem-token";

const $ = (id) => document.getElementById(id);

function takeTokenFromFragment() {
  const m = /(?:^#|&)token=([^&]+)/.exec(location.hash);
  if (m) {
    sessionStorage.setItem(KEY, decodeURIComponent(m[1]));
    // The token leaves the address bar (and the history) at once.
    history.replaceState(null, "", location.pathname + location.search);
  }
}

function bytes(n) {
  if (n == null) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
  let i = 0;
  let v = Number(n);
  while (v >= 1024 && i < units.length - 1) { v /= 1024; i++; }
  return (i === 0 ? v.toFixed(0) : v.toFixed(1)) + " " + units[i];
}

// Rates in decimal units, as networks and `rackmem ctl` quote them.
function rate(bps) {
  if (!bps) return "–";
  const units = ["B/s", "kB/s", "MB/s", "GB/s", "TB/s"];
  let i = 0;
  let v = Number(bps);
  while (v >= 1000 && i < units.length - 1) { v /= 1000; i++; }
  return v.toFixed(1) + " " + units[i];
}

function ago(ms) {
  if (ms == null) return "never";
  const s = Math.max(0, (Date.now() - ms) / 1000);
  return s < 1 ? "just now" : s < 120 ? s.toFixed(0) + " s ago" : (s / 60).toFixed(0) + " min ago";
}

// A cell with the shown text and the raw value, so tests (and people copying figures) read the
// number, not its rendering.
function cell(text, value, cls) {
  const td = document.createElement("td");
  td.textContent = text;
  if (value !== undefined) td.dataset.value = String(value);
  if (cls) td.className = cls;
  return td;
}

function fill(tableId, rows, emptyText, render) {
  const body = $(tableId).tBodies[0];
  body.replaceChildren();
  if (rows.length === 0) {
    const tr = document.createElement("tr");
    tr.className = "empty";
    const td = document.createElement("td");
    td.colSpan = $(tableId).tHead.rows[0].cells.length;
    td.textContent = emptyText;
    tr.append(td);
    body.append(tr);
    return;
  }
  for (const r of rows) {
    const tr = document.createElement("tr");
    tr.append(...render(r));
    body.append(tr);
  }
}

async function api(path) {
  const token = sessionStorage.getItem(KEY);
  const r = await fetch(path, { headers: { Authorization: "Bearer " + token }, cache: "no-store" });
  if (r.status === 401 || r.status === 403) {
    const e = new Error("the token was refused (" + r.status + "): sign in again with an admin token");
    e.auth = true;
    throw e;
  }
  if (!r.ok) throw new Error(path + ": HTTP " + r.status);
  return r.json();
}

// The upper bounds (ns) of a report's fault-latency buckets (rackmem_proto::FAULT_LATENCY_BOUNDS_NS).
const LATENCY_BOUNDS_NS = [1e3, 2.5e3, 5e3, 1e4, 2.5e4, 5e4, 1e5, 2.5e5, 5e5, 1e6, 2.5e6, 5e6, 1e7, 1e8];

function duration(ns) {
  if (ns == null || !isFinite(ns)) return "–";
  return ns >= 1e6 ? (ns / 1e6).toFixed(1) + " ms" : (ns / 1e3).toFixed(1) + " µs";
}

// One line per brick that served the program: its C-AMAT, its miss concurrency and its faults
// (the pure misses and their penalty in the tooltip): which brick the program waits on.
function brickLevels(levels) {
  const td = document.createElement("td");
  td.className = "levels";
  if (!levels || levels.length === 0) {
    td.textContent = "–";
    return td;
  }
  for (const l of levels) {
    const div = document.createElement("div");
    div.dataset.brick = l.brick;
    div.dataset.faults = String(l.faults);
    const name = l.brick.split("/").pop();
    div.textContent = name + ": " + duration(l.camat_ns) + " · " + l.miss_concurrency.toFixed(2) + " · " + l.faults;
    div.title = l.brick + ": " + l.pure_misses + " pure misses, " + duration(l.pure_miss_penalty_ns) + " each";
    td.appendChild(div);
  }
  return td;
}

// A small bar per latency bucket (its own count, not the cumulative one), the last bar for the
// faults above the highest bound.
function histogram(h) {
  const td = document.createElement("td");
  const box = document.createElement("div");
  box.className = "hist";
  const own = [];
  let below = 0;
  for (const c of h.cumulative) { own.push(c - below); below = c; }
  own.push(h.count - below);
  const most = Math.max(1, ...own);
  own.forEach((n, i) => {
    const bar = document.createElement("div");
    bar.style.height = (100 * n / most).toFixed(1) + "%";
    const upper = i < LATENCY_BOUNDS_NS.length ? "≤ " + duration(LATENCY_BOUNDS_NS[i]) : "> 100 ms";
    bar.title = upper + ": " + n + " faults";
    box.append(bar);
  });
  td.append(box);
  td.dataset.value = String(h.count);
  return td;
}

// What the previous refresh saw of each process, for rates.
let previous = new Map();

function perSecond(key, now, value, pick) {
  const p = previous.get(key);
  if (!p || now <= p.at) return "–";
  return (value - pick(p)) / ((now - p.at) / 1000);
}

function portText(ports) {
  return (ports || []).map((p) => p.name + " " + rate(p.bandwidth_bps)).join(", ") || "–";
}

function draw(bricks, nodes, allocations, processes) {
  const up = bricks.filter((b) => String(b.state).toLowerCase() === "up").length;
  const capacity = bricks.reduce((s, b) => s + b.capacity_bytes, 0);
  const free = bricks.reduce((s, b) => s + b.free_bytes, 0);
  const resident = bricks.reduce((s, b) => s + (b.stats?.resident_bytes ?? 0), 0);
  $("t-bricks").textContent = up + " / " + bricks.length;
  $("t-capacity").textContent = bytes(capacity);
  $("t-used").textContent = bytes(capacity - free);
  $("t-used").dataset.value = String(capacity - free);
  $("t-resident").textContent = bytes(resident);
  $("t-nodes").textContent = String(nodes.length);
  $("t-allocations").textContent = String(allocations.length);

  fill("bricks", bricks, "no brick has registered", (b) => {
    const used = b.capacity_bytes - b.free_bytes;
    const share = b.capacity_bytes ? used / b.capacity_bytes : 0;
    const bar = document.createElement("td");
    const outer = document.createElement("div");
    outer.className = "bar";
    const inner = document.createElement("div");
    inner.style.width = (100 * share).toFixed(1) + "%";
    outer.append(inner);
    bar.append(outer);
    bar.dataset.value = share.toFixed(4);
    const state = String(b.state).toLowerCase();
    return [
      cell(b.name, b.name),
      cell(b.address),
      cell(state, state, "state-" + state),
      cell(bytes(b.capacity_bytes), b.capacity_bytes, "num"),
      cell(bytes(used), used, "num"),
      bar,
      cell(String(b.segments), b.segments, "num"),
      cell(portText(b.ports)),
      cell(bytes(b.stats?.resident_bytes), b.stats?.resident_bytes ?? "", "num"),
      cell(ago(b.last_heartbeat_unix_ms)),
    ];
  });
  fill("nodes", nodes, "no node has registered", (n) => [
    cell(n.name, n.name),
    cell(String(n.id), n.id, "num"),
    cell(String(n.allocations), n.allocations, "num"),
    cell(bytes(n.allocated_bytes), n.allocated_bytes, "num"),
    cell(portText(n.ports)),
  ]);
  const now = Date.now();
  fill("processes", processes, "no program is running on agent memory", (p) => {
    const r = p.report;
    const key = p.node + "/" + r.pid;
    const fps = perSecond(key, now, r.faults, (q) => q.faults);
    const inps = perSecond(key, now, r.bytes_fetched + r.bytes_prefetched, (q) => q.fetched);
    const outps = perSecond(key, now, r.bytes_written_back, (q) => q.written);
    return [
      cell(p.node_name, p.node_name),
      cell(String(r.pid), r.pid, "num"),
      cell(r.program.split("/").pop(), r.program),
      cell(bytes(r.resident_bytes) + " / " + bytes(r.budget_bytes), r.resident_bytes, "num"),
      cell(bytes(r.window_bytes), r.window_bytes, "num"),
      cell(String(r.faults), r.faults, "num"),
      cell(typeof fps === "number" ? fps.toFixed(0) : fps, fps, "num"),
      cell(typeof inps === "number" ? rate(inps) : inps, inps, "num"),
      cell(typeof outps === "number" ? rate(outps) : outps, outps, "num"),
      histogram(r.fault_latency),
      cell(r.miss_concurrency.toFixed(2), r.miss_concurrency, "num"),
      cell(duration(p.bricks_camat_ns), p.bricks_camat_ns, "num"),
      cell((100 * p.stall_share).toFixed(0) + "%", p.stall_share, "num"),
      brickLevels(p.bricks),
    ];
  });
  previous = new Map(processes.map((p) => [p.node + "/" + p.report.pid, {
    at: now,
    faults: p.report.faults,
    fetched: p.report.bytes_fetched + p.report.bytes_prefetched,
    written: p.report.bytes_written_back,
  }]));
  const brickName = new Map(bricks.map((b) => [b.id, b.name]));
  const nodeName = new Map(nodes.map((n) => [n.id, n.name]));
  fill("allocations", allocations, "nothing is allocated", (a) => [
    cell(String(a.id), a.id, "num"),
    cell(nodeName.get(a.node) ?? String(a.node), a.node),
    cell(bytes(a.size_bytes), a.size_bytes, "num"),
    cell(String(a.stripe), a.stripe, "num"),
    cell(rate(a.bandwidth_bps), a.bandwidth_bps, "num"),
    cell((a.segments || []).map((s) => (brickName.get(s.brick_id) ?? s.brick_id) + ": " + bytes(s.size_bytes)).join(", ")),
    cell(ago(a.created_unix_ms)),
  ]);
  $("updated").textContent = "Updated " + new Date().toLocaleTimeString() + "; refreshes every " + REFRESH_MS / 1000 + " s.";
}

let timer = null;

async function refresh() {
  try {
    const [bricks, nodes, allocations, processes] = await Promise.all([
      api("/v1/bricks"), api("/v1/nodes"), api("/v1/allocations"), api("/v1/processes"),
    ]);
    draw(bricks, nodes, allocations, processes);
    $("status").textContent = "signed in";
    $("status").className = "";
    document.body.dataset.loaded = "true";
  } catch (e) {
    $("status").textContent = String(e.message || e);
    $("status").className = "error";
    if (e.auth) { signOut(); return; }
  }
  timer = setTimeout(refresh, REFRESH_MS);
}

function signOut() {
  clearTimeout(timer);
  sessionStorage.removeItem(KEY);
  $("board").hidden = true;
  $("signout").hidden = true;
  $("signin").hidden = false;
}

function start() {
  $("signin").hidden = true;
  $("board").hidden = false;
  $("signout").hidden = false;
  refresh();
}

$("signin").addEventListener("submit", (ev) => {
  ev.preventDefault();
  sessionStorage.setItem(KEY, $("token").value.trim());
  $("token").value = "";
  start();
});
$("signout").addEventListener("click", signOut);

takeTokenFromFragment();
if (sessionStorage.getItem(KEY)) start(); else { $("status").textContent = "not signed in"; $("signin").hidden = false; }
