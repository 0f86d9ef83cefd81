// hurtle dashboard: reads the JSON API, draws the pages. No build step, no dependencies.
"use strict";

const ROOT = document.body.dataset.root || "";
const MAX_POINTS = 120;
// The throughput chart's data, also read by the browser tests: {t, processed, failed} points.
const chart = { points: [], received: 0 };
window.hurtleChart = chart;

function cookie(name) {
  const hit = document.cookie.split("; ").find((c) => c.startsWith(name + "="));
  return hit ? decodeURIComponent(hit.slice(name.length + 1)) : "";
}

async function api(path, options = {}) {
  const headers = { "X-CSRF-Token": cookie("hurtle_csrf") };
  if (options.body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(ROOT + path, {
    method: options.method || "GET",
    headers,
    credentials: "same-origin",
    body: options.body === undefined ? undefined : JSON.stringify(options.body),
  });
  if (response.status === 401) { location.href = ROOT + "/login"; return null; }
  const doc = await response.json();
  if (!response.ok) throw new Error(doc.error || response.statusText);
  return doc;
}

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") node.className = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v);
  }
  for (const c of children) node.append(c instanceof Node ? c : String(c ?? ""));
  return node;
}

function table(node, columns, rows) {
  node.replaceChildren(
    el("tr", {}, ...columns.map((c) => el("th", c.numeric ? { class: "n" } : {}, c.title))),
    ...rows.map((r) => el("tr", {}, ...columns.map((c) => {
      const v = c.value(r);
      return el("td", c.numeric ? { class: "n" } : {}, v);
    }))),
  );
}

const fmt = (n) => (typeof n === "number" ? n.toLocaleString("en") : n);
const when = (t) => (t ? new Date(t * 1000).toLocaleTimeString() : "–");
const ago = (t) => (t ? `${Math.max(0, Date.now() / 1000 - t).toFixed(1)} s ago` : "–");

function showError(err) {
  const p = document.getElementById("error");
  p.hidden = !err;
  p.textContent = err ? String(err.message || err) : "";
}

// -- overview --------------------------------------------------------------------------------

const QUEUE_COLUMNS = [
  { title: "Queue", value: (q) => q.name },
  { title: "Ready", value: (q) => fmt(q.ready), numeric: true },
  { title: "Delayed", value: (q) => fmt(q.delayed), numeric: true },
  { title: "In flight", value: (q) => fmt(q.in_flight), numeric: true },
  { title: "Dead", value: (q) => fmt(q.dead), numeric: true },
];

async function loadOverview() {
  const doc = await api("/api/overview");
  if (!doc) return;
  document.getElementById("broker").textContent = doc.broker;
  for (const [k, v] of Object.entries(doc.totals)) {
    document.getElementById("total-" + k).textContent = fmt(v);
  }
  document.getElementById("workers-alive").textContent = fmt(doc.workers_alive);
  table(document.getElementById("overview-queues"), QUEUE_COLUMNS, doc.queues);
}

function addPoint(point) {
  chart.points.push(point);
  chart.received += 1;
  if (chart.points.length > MAX_POINTS) chart.points.shift();
  document.getElementById("rate-processed").textContent = fmt(Math.round(point.processed));
  document.getElementById("rate-failed").textContent = fmt(Math.round(point.failed));
  drawChart();
}

function drawChart() {
  const canvas = document.getElementById("chart");
  const ctx = canvas.getContext("2d");
  const w = canvas.width, h = canvas.height, left = 56, bottom = 20, top = 10;
  ctx.clearRect(0, 0, w, h);
  const pts = chart.points;
  const peak = Math.max(1, ...pts.map((p) => Math.max(p.processed, p.failed)));
  const scale = niceCeil(peak);
  ctx.strokeStyle = "#dddcd6"; ctx.fillStyle = "#6b6b66"; ctx.font = "11px system-ui";
  for (let i = 0; i <= 4; i++) {
    const y = top + (h - top - bottom) * (1 - i / 4);
    ctx.beginPath(); ctx.moveTo(left, y); ctx.lineTo(w - 8, y); ctx.stroke();
    ctx.fillText(fmt(Math.round((scale * i) / 4)), 6, y + 4);
  }
  const x = (i) => left + ((w - left - 8) * i) / (MAX_POINTS - 1);
  if (pts.length) {
    const first = x(MAX_POINTS - pts.length);
    if (first < w - 160) ctx.fillText(when(pts[0].t), first, h - 4);
    ctx.fillText(when(pts[pts.length - 1].t), w - 70, h - 4);
  }
  const y = (v) => top + (h - top - bottom) * (1 - v / scale);
  for (const [key, color] of [["processed", "#2c7be5"], ["failed", "#d6443a"]]) {
    ctx.strokeStyle = color; ctx.lineWidth = 2; ctx.beginPath();
    const offset = MAX_POINTS - pts.length;
    pts.forEach((p, i) => (i ? ctx.lineTo : ctx.moveTo).call(ctx, x(offset + i), y(p[key])));
    ctx.stroke(); ctx.lineWidth = 1;
  }
}

function niceCeil(v) {
  const p = 10 ** Math.floor(Math.log10(v));
  for (const m of [1, 2, 5, 10]) if (v <= m * p) return m * p;
  return 10 * p;
}

let stream = null;
async function startStream() {
  if (stream) return;
  try {
    const doc = await api("/api/throughput");
    if (doc) doc.points.slice(-MAX_POINTS).forEach(addPoint);
  } catch (err) { showError(err); }
  stream = new EventSource(ROOT + "/api/throughput/stream", { withCredentials: true });
  stream.addEventListener("throughput", (e) => addPoint(JSON.parse(e.data)));
}

// -- queues ----------------------------------------------------------------------------------

async function loadQueues() {
  const rows = await api("/api/queues");
  if (!rows) return;
  table(document.getElementById("queue-table"), [
    ...QUEUE_COLUMNS,
    { title: "", value: (q) => el("button", {
      class: "danger", "data-queue": q.name,
      onclick: () => purge(q.name, q.dead),
    }, "Purge dead letters") },
  ], rows);
}

async function purge(queue, count) {
  if (!confirm(`Delete all ${count} dead letters of queue ${queue}? This cannot be undone.`)) {
    return;
  }
  await api(`/api/queues/${encodeURIComponent(queue)}/dead`, { method: "DELETE" });
  await loadQueues();
}

// -- workers ---------------------------------------------------------------------------------

async function loadWorkers() {
  const rows = await api("/api/workers");
  if (!rows) return;
  table(document.getElementById("worker-table"), [
    { title: "Worker", value: (w) => w.id },
    { title: "Host", value: (w) => w.host },
    { title: "PID", value: (w) => w.pid, numeric: true },
    { title: "Pool", value: (w) => w.pool },
    { title: "Concurrency", value: (w) => w.concurrency, numeric: true },
    { title: "Queues", value: (w) => w.queues.join(", ") },
    { title: "Last heartbeat", value: (w) => ago(w.last_heartbeat) },
    { title: "Processed", value: (w) => fmt(w.processed), numeric: true },
    { title: "Failed", value: (w) => fmt(w.failed), numeric: true },
  ], rows);
}

// -- dead letters ----------------------------------------------------------------------------

function deadQueue() { return document.getElementById("dead-queue").value; }

async function loadDead() {
  const select = document.getElementById("dead-queue");
  const queues = await api("/api/queues");
  if (!queues) return;
  const chosen = select.value || (queues.find((q) => q.dead) || queues[0] || {}).name || "";
  select.replaceChildren(...queues.map((q) => el("option", { value: q.name },
    `${q.name} (${q.dead})`)));
  select.value = chosen;
  if (!chosen) return;
  const rows = await api(`/api/queues/${encodeURIComponent(chosen)}/dead?limit=200`);
  table(document.getElementById("dead-table"), [
    { title: "", value: (d) => el("input", { type: "checkbox", "data-id": d.id }) },
    { title: "Failed at", value: (d) => when(d.failed_at) },
    { title: "Task", value: (d) => d.task ?? "(not a message)" },
    { title: "Message id", value: (d) => d.message_id ?? "–" },
    { title: "Attempts", value: (d) => d.attempts ?? "–", numeric: true },
    { title: "Reason", value: (d) => {
      const cell = el("div", {}, d.reason);
      if (d.traceback) {
        const last = d.traceback.trim().split("\n").pop();  // the exception itself
        cell.append(el("div", { class: "error-line" }, last),
          el("details", {}, el("summary", {}, "traceback"), el("pre", {}, d.traceback)));
      }
      return cell;
    } },
    { title: "", value: (d) => el("span", {},
      el("button", { class: "retry-one", "data-id": d.id,
        onclick: () => act("retry", [d.id]) }, "Retry"), " ",
      el("button", { class: "delete-one danger", "data-id": d.id,
        onclick: () => act("delete", [d.id]) }, "Delete")) },
  ], rows || []);
}

function selected() {
  return [...document.querySelectorAll("#dead-table input[type=checkbox]:checked")]
    .map((c) => c.dataset.id);
}

async function act(verb, ids) {
  const queue = deadQueue();
  if (!queue) return;
  if (ids === null && !confirm(`${verb === "retry" ? "Retry" : "Delete"} every dead letter `
      + `of queue ${queue}?`)) return;
  if (ids !== null && !ids.length) return;
  const body = ids === null ? { all: true } : { ids };
  const doc = await api(`/api/queues/${encodeURIComponent(queue)}/dead/${verb}`,
    { method: "POST", body });
  const n = doc && (doc.retried ?? doc.deleted);
  document.getElementById("dead-status").textContent =
    `${verb === "retry" ? "retried" : "deleted"} ${n}`;
  await loadDead();
}

document.getElementById("retry-selected").onclick = () => act("retry", selected());
document.getElementById("delete-selected").onclick = () => act("delete", selected());
document.getElementById("retry-all").onclick = () => act("retry", null);
document.getElementById("delete-all").onclick = () => act("delete", null);
document.getElementById("dead-queue").onchange = () => loadDead();

// -- navigation ------------------------------------------------------------------------------

const LOADERS = { overview: loadOverview, queues: loadQueues, workers: loadWorkers,
                  dead: loadDead };
let current = "overview";

function route() {
  const page = (location.hash.replace(/^#\//, "").split("/")[0]) || "overview";
  current = page in LOADERS ? page : "overview";
  for (const s of document.querySelectorAll("section.page")) s.hidden = s.id !== current;
  for (const a of document.querySelectorAll("nav a")) {
    a.classList.toggle("active", a.dataset.page === current);
  }
  refresh();
}

async function refresh() {
  try {
    await LOADERS[current]();
    showError(null);
  } catch (err) { showError(err); }
}

window.addEventListener("hashchange", route);
// every page but the dead letters (where a refresh would drop a selection) follows live
setInterval(() => { if (current !== "dead") refresh(); }, 2000);
startStream();
route();
