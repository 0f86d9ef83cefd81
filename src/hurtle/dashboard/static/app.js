// hurtle dashboard: reads the JSON API, draws the pages. No build step, no dependencies.
"use strict";

const ROOT = document.body.dataset.root || "";
// The chart shows the last WINDOW seconds, time on its x-axis; points further apart than GAP
// seconds (nobody was watching, or the server was down) are not joined.
const WINDOW = 120, GAP = 5, TIME_TICK = 30;
// The throughput chart's data, also read by the browser tests: {t, processed, failed} points,
// and what the last drawing showed (``view``: x-axis labels, y-axis ticks, points' x).
const chart = { points: [], received: 0, view: null };
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

const clip = (text, n) => (text.length > n ? `${text.slice(0, n - 1)}…` : text);
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
  { title: "Paused", value: (q) => (q.paused ? el("span", { class: "paused" }, "paused") : "–") },
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
  const pts = chart.points;
  if (pts.length && point.t <= pts[pts.length - 1].t) return;  // seen (a reconnected stream)
  pts.push(point);
  chart.received += 1;
  while (pts.length && pts[0].t < point.t - WINDOW) pts.shift();
  document.getElementById("rate-processed").textContent = fmt(Math.round(point.processed));
  document.getElementById("rate-failed").textContent = fmt(Math.round(point.failed));
  for (const [k, v] of Object.entries(point.totals || {})) {
    document.getElementById("total-" + k).textContent = fmt(v);
  }
  drawChart();
}

// A time of day as HH:MM:SS, for the x-axis.
const clock = (t) => new Date(t * 1000).toTimeString().slice(0, 8);

// Integer ticks from 0 that cover `peak`, a step of 1, 2 or 5 times a power of ten apart.
function integerTicks(peak) {
  const step = Math.max(1, niceCeil(Math.max(peak, 1) / 4));
  const ticks = [0];
  do ticks.push(ticks[ticks.length - 1] + step); while (ticks[ticks.length - 1] < peak);
  return ticks;
}

function drawChart() {
  const canvas = document.getElementById("chart");
  const ctx = canvas.getContext("2d");
  const w = canvas.width, h = canvas.height, left = 56, right = 8, bottom = 20, top = 10;
  ctx.clearRect(0, 0, w, h);
  const pts = chart.points;
  const end = pts.length ? pts[pts.length - 1].t : Date.now() / 1000;
  const start = end - WINDOW;
  const peak = Math.max(0, ...pts.map((p) => Math.max(p.processed, p.failed)));
  const yTicks = integerTicks(peak);
  const scale = yTicks[yTicks.length - 1];
  const x = (t) => left + ((w - left - right) * (t - start)) / WINDOW;
  const y = (v) => top + (h - top - bottom) * (1 - v / scale);
  ctx.strokeStyle = "#dddcd6"; ctx.fillStyle = "#6b6b66"; ctx.font = "11px system-ui";
  for (const v of yTicks) {
    ctx.beginPath(); ctx.moveTo(left, y(v)); ctx.lineTo(w - right, y(v)); ctx.stroke();
    ctx.fillText(fmt(v), 6, y(v) + 4);
  }
  const xLabels = [];
  ctx.textAlign = "center";
  for (let t = Math.ceil(start / TIME_TICK) * TIME_TICK; t <= end; t += TIME_TICK) {
    const label = clock(t);
    xLabels.push(label);
    ctx.beginPath(); ctx.moveTo(x(t), top); ctx.lineTo(x(t), h - bottom); ctx.stroke();
    ctx.fillText(label, Math.min(Math.max(x(t), left + 24), w - right - 24), h - 4);
  }
  ctx.textAlign = "start";
  for (const [key, color] of [["processed", "#2c7be5"], ["failed", "#d6443a"]]) {
    ctx.strokeStyle = color; ctx.lineWidth = 2; ctx.beginPath();
    pts.forEach((p, i) => {
      const joined = i > 0 && p.t - pts[i - 1].t <= GAP;
      (joined ? ctx.lineTo : ctx.moveTo).call(ctx, x(p.t), y(p[key]));
    });
    ctx.stroke(); ctx.lineWidth = 1;
  }
  chart.view = { xLabels, yTicks, xs: pts.map((p) => ({ t: p.t, x: x(p.t) })) };
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
    if (doc) doc.points.forEach(addPoint);
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
    { title: "", value: (q) => el("span", { class: "row-actions" },
      q.paused
        ? el("button", { class: "resume-queue", "data-queue": q.name,
          onclick: () => queueAction(q, "resume") }, "Resume")
        : el("button", { class: "pause-queue", "data-queue": q.name,
          onclick: () => queueAction(q, "pause") }, "Pause"),
      el("button", { class: "purge-queue danger", "data-queue": q.name,
        onclick: () => queueAction(q, "purge") }, "Purge messages"),
      el("button", { class: "purge-dead danger", "data-queue": q.name,
        onclick: () => purge(q.name, q.dead) }, "Purge dead letters")) },
  ], rows);
}

// What each queue action asks before it acts, and the request it sends.
const QUEUE_ACTIONS = {
  pause: { ask: (q) => `Pause queue ${q.name}? No worker fetches from it until it is resumed `
      + "(tasks already fetched finish).", method: "POST", path: "pause",
    done: (q) => `queue ${q.name} paused` },
  resume: { ask: (q) => `Resume queue ${q.name}? Workers fetch from it again.`,
    method: "POST", path: "resume", done: (q) => `queue ${q.name} resumed` },
  purge: { ask: (q) => `Drop the ${q.ready} ready and ${q.delayed} delayed messages of queue `
      + `${q.name}? Messages in flight finish; dead letters stay. This cannot be undone.`,
    method: "DELETE", path: "messages",
    done: (q, doc) => `queue ${q.name} purged: ${doc.purged} messages dropped` },
};

async function queueAction(q, verb) {
  const action = QUEUE_ACTIONS[verb];
  if (!confirm(action.ask(q))) return;
  const doc = await api(`/api/queues/${encodeURIComponent(q.name)}/${action.path}`,
    { method: action.method });
  if (doc) document.getElementById("queue-status").textContent = action.done(q, doc);
  await loadQueues();
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
    { title: "Running now", value: (w) => w.running, numeric: true },
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
    // JSON text from the server, set as text (never as HTML); undecodable bytes say why
    { title: "Arguments", value: (d) => (d.arguments === null
      ? el("span", { class: "undecodable" }, `undecodable: ${d.undecodable}`)
      : el("code", { class: "arguments", title: d.arguments }, clip(d.arguments, 120))) },
    { title: "Message id", value: (d) => (d.message_id ? taskLink(d.message_id) : "–") },
    { title: "Attempt", value: (d) => d.attempt ?? "–", numeric: true },
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
  if (ids !== null && !ids.length) return;
  // every delete asks, even of one row: a click alone never destroys anything
  const what = ids === null ? "every dead letter"
    : ids.length === 1 ? `dead letter ${ids[0]}` : `${ids.length} dead letters`;
  if ((ids === null || verb === "delete") && !confirm(`${verb === "retry" ? "Retry" : "Delete"} `
      + `${what} of queue ${queue}?${verb === "delete" ? " This cannot be undone." : ""}`)) return;
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

// -- scheduled -------------------------------------------------------------------------------

const stamp = (t) => (t ? new Date(t * 1000).toLocaleString() : "–");

async function loadScheduled() {
  const doc = await api("/api/schedules");
  const delayed = await api("/api/delayed");
  if (!doc || !delayed) return;
  const note = document.getElementById("schedules-note");
  note.hidden = doc.known && doc.schedules.length > 0;
  note.textContent = doc.known ? "This app has no periodic tasks (app.periodic)."
    : "The dashboard was started from a broker, not an app: schedules live in the app's code.";
  table(document.getElementById("schedule-table"), [
    { title: "Schedule", value: (s) => s.name },
    { title: "Task", value: (s) => s.task },
    { title: "Queue", value: (s) => s.queue },
    { title: "When", value: (s) => s.when },
    { title: "Last run", value: (s) => (s.last_run ? stamp(s.last_run) : "never") },
    { title: "Next run", value: (s) => stamp(s.next_run) },
  ], doc.schedules);
  table(document.getElementById("delayed-table"), [
    { title: "Queue", value: (d) => d.queue },
    { title: "Delayed", value: (d) => fmt(d.delayed), numeric: true },
    { title: "Next due", value: (d) => (!d.listed ? "(this broker shows counts only)"
      : d.next.length ? el("span", {}, ...d.next.flatMap((n, i) => [i ? el("br") : "",
        `${stamp(n.eta)} — ${n.task ?? "?"} `, taskLink(n.id)])) : "–") },
  ], delayed);
}

function taskLink(id) {
  return id ? el("a", { href: `#/task/${encodeURIComponent(id)}` }, id) : "";
}

// -- task lookup -----------------------------------------------------------------------------

async function loadTask() {
  const id = decodeURIComponent(location.hash.split("/")[2] || "");
  const input = document.getElementById("task-id");
  if (document.activeElement !== input) input.value = id;
  const box = document.getElementById("task-result");
  if (!id) { box.hidden = true; return; }
  const row = await api(`/api/tasks/${encodeURIComponent(id)}`);
  if (!row) return;
  box.hidden = false;
  const state = document.getElementById("task-state");
  state.textContent = row.state;
  state.className = "state-" + row.state;
  document.getElementById("task-source").textContent = row.source === "result"
    ? "(from its stored result)" : row.source === "dead_letter" ? "(from its dead letter)" : "";
  const note = document.getElementById("task-note");
  note.hidden = !row.note;
  note.textContent = row.note;
  const json = (v) => el("pre", {}, JSON.stringify(v, null, 2));
  const fields = [
    ["Message id", row.id],
    ["Task", row.task ?? "–"],
    ["Queue", row.queue ?? "–"],
    ["Attempt", row.attempt ?? "–"],
    ["Keeps its result", row.keeps_result === null ? "–" : row.keeps_result ? "yes" : "no"],
    ["Progress", row.progress ? el("div", { class: "progress" },
      el("progress", { max: "1", value: String(row.progress.fraction) }),
      ` ${(row.progress.fraction * 100).toFixed(0)} %`,
      row.progress.message ? el("span", { class: "muted" }, ` ${row.progress.message}`) : "",
      el("span", { class: "muted" }, ` (${stamp(row.progress.at)})`)) : "–"],
    ["Arguments", row.args === null ? "–" : json(row.args)],
    ["Keyword arguments", row.kwargs === null ? "–" : json(row.kwargs)],
    ["Result", row.state === "succeeded" ? json(row.result) : "–"],
    ["Error", row.error ? el("div", {}, el("div", { class: "error-line" },
      `${row.error.type}${row.error.type ? ": " : ""}${row.error.message}`),
      row.error.traceback ? el("pre", {}, row.error.traceback) : "") : "–"],
    ["Enqueued", stamp(row.enqueued_at)],
    ["Started", stamp(row.started_at)],
    ["Finished", stamp(row.finished_at)],
    ["Run time", row.started_at && row.finished_at
      ? `${((row.finished_at - row.started_at) * 1000).toFixed(1)} ms` : "–"],
  ];
  table(document.getElementById("task-table"), [
    { title: "", value: (f) => f[0] }, { title: "", value: (f) => f[1] },
  ], fields);
  // a message with no outcome yet (waiting, running, reporting progress) is followed live
  taskLive = !["succeeded", "dead", "expired", "cancelled", "superseded"].includes(row.state);
}
let taskLive = false;

document.getElementById("task-form").onsubmit = (e) => {
  e.preventDefault();
  const id = document.getElementById("task-id").value.trim();
  if (id) location.hash = `#/task/${encodeURIComponent(id)}`;
};

// -- navigation ------------------------------------------------------------------------------

const LOADERS = { overview: loadOverview, queues: loadQueues, workers: loadWorkers,
                  dead: loadDead, scheduled: loadScheduled, task: loadTask };
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
setInterval(() => {
  if (current !== "dead" && (current !== "task" || taskLive)) refresh();
}, 2000);
startStream();
route();
