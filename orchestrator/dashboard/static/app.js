// cluster-bootstrap dashboard: a snapshot, then deltas over server-sent events (orchestrator/dashboard).
// Every string from the server may be node output: it reaches the page through textContent only,
// never as markup or code (tests/unit/test_dashboard.py checks this file for the sinks).
"use strict";

const token = new URLSearchParams(location.search).get("token");
const COLORS = ["#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3", "#8c8c8c",
  "#ccb974", "#64b5cd"];
const TAIL = 200;
const store = { run: null, nodes: {}, ranks: {}, points: {}, lines: {}, events: [], slowest: null };
let drawPending = false;

function api(path) {
  return `${path}${path.includes("?") ? "&" : "?"}token=${encodeURIComponent(token || "")}`;
}

function el(tag, text, cls) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (cls) node.className = cls;
  return node;
}

function fmt(value, digits) {
  if (value === null || value === undefined) return "-";
  return Number(value).toFixed(digits);
}

// -- state ----------------------------------------------------------------------------------------

function applySnapshot(doc) {
  store.nodes = {}; store.ranks = {}; store.points = {}; store.lines = {}; store.events = [];
  if (!doc) { render(); return; }
  store.run = doc;
  for (const n of doc.nodes) store.nodes[n.node] = n;
  for (const r of doc.ranks) store.ranks[r.rank] = r;
  for (const [rank, pts] of Object.entries(doc.points)) store.points[rank] = pts;
  for (const [key, lines] of Object.entries(doc.lines)) store.lines[key] = lines.slice(-TAIL);
  store.events = doc.events;
  store.slowest = doc.slowest;
  render();
}

function applyDelta(delta) {
  if (store.run) { store.run.state = delta.state; store.run.run_id = delta.run_id; }
  for (const n of delta.nodes) store.nodes[n.node] = n;
  for (const r of delta.ranks) store.ranks[r.rank] = r;
  for (const [rank, pts] of Object.entries(delta.points)) {
    const all = (store.points[rank] = (store.points[rank] || []).concat(pts));
    if (all.length > 1200) all.splice(0, all.length - 1200);
  }
  for (const [key, lines] of Object.entries(delta.lines)) {
    store.lines[key] = (store.lines[key] || []).concat(lines).slice(-TAIL);
  }
  for (const ev of delta.events) {  // an event sent again (its lines completed) replaces its copy
    const at = store.events.findIndex((e) => e.id === ev.id);
    if (at >= 0) store.events[at] = ev; else store.events.push(ev);
  }
  if (store.events.length > 100) store.events.splice(0, store.events.length - 100);
  store.slowest = delta.slowest;
  render();
}

// -- rendering ------------------------------------------------------------------------------------

function render() {
  const run = store.run;
  document.getElementById("run-id").textContent = run ? `run ${run.run_id}` : "no run attached: past runs only";
  const state = document.getElementById("run-state");
  state.textContent = run ? run.state : "";
  state.dataset.state = run ? run.state : "";
  renderEvents();
  renderNodes();
  renderRanks();
  renderFilters();
  renderLines();
  if (!drawPending) { drawPending = true; requestAnimationFrame(() => { drawPending = false; drawCharts(); }); }
}

function renderEvents() {
  const box = document.getElementById("events");
  box.replaceChildren();
  if (!store.events.length) { box.append(el("p", "none yet", "empty")); return; }
  for (const ev of store.events.slice().reverse()) {
    const item = el("div", null, `event ${ev.kind}`);
    item.dataset.kind = ev.kind;
    item.dataset.node = ev.node;
    const head = el("div", null, "event-head");
    head.append(el("span", ev.kind, "badge"), el("span", new Date(ev.time * 1000).toLocaleTimeString(), "time"));
    if (ev.node) head.append(el("strong", ev.node));
    head.append(el("span", ev.message, "message"));
    item.append(head);
    if (ev.lines.length) item.append(el("pre", ev.lines.join("\n"), "event-lines"));
    box.append(item);
  }
}

// the node's newest sample (taken on the node every few seconds): each GPU's use, else the CPU load
function use(n) {
  const cell = el("td", null, "use");
  for (const g of n.gpus || []) {
    const line = el("div", `GPU ${g.index}: ${fmt(g.util_percent, 0)}% · ` +
      `${fmt(g.mem_used_mib, 0)} / ${fmt(g.mem_total_mib, 0)} MiB`, "gpu");
    line.dataset.gpu = g.index;
    cell.append(line);
  }
  if (n.load) cell.append(el("div", `CPU load ${fmt(n.load.load, 2)} (${n.load.cpus ?? "?"} CPUs)`, "cpu"));
  if (!cell.childElementCount) cell.textContent = "-";
  return cell;
}

function renderNodes() {
  const body = document.querySelector("#nodes tbody");
  body.replaceChildren();
  for (const n of Object.values(store.nodes)) {
    const row = el("tr");
    row.dataset.node = n.node;
    const facts = Object.entries(n.facts || {}).map(([k, v]) => `${k}: ${v}`).join(", ");
    const state = el("td", n.state, "state");
    state.dataset.state = n.state;
    row.append(el("td", n.node), el("td", n.phase), state, el("td", n.lines), use(n),
      el("td", n.detail, "detail"), el("td", facts, "facts"));
    body.append(row);
  }
}

function renderRanks() {
  const body = document.querySelector("#ranks tbody");
  body.replaceChildren();
  const ranks = Object.values(store.ranks).sort((a, b) => a.rank - b.rank);
  for (const r of ranks) {
    const row = el("tr");
    row.dataset.rank = r.rank;
    if (r.rank === store.slowest) { row.classList.add("slowest"); row.title = "slowest rank (lowest samples/s)"; }
    const swatch = el("span", null, "swatch");
    swatch.style.background = COLORS[r.rank % COLORS.length];
    const rankCell = el("td", null, "rank");
    rankCell.append(swatch, document.createTextNode(String(r.rank)));
    const age = r.updated ? `${Math.max(0, Math.round(Date.now() / 1000 - r.updated))} s ago` : "-";
    row.append(rankCell, el("td", r.node), el("td", r.step === null ? "-" : r.step, "step"),
      el("td", fmt(r.loss, 4), "loss"), el("td", fmt(r.samples_per_s, 1), "speed"), el("td", age));
    body.append(row);
  }
}

function setOptions(select, values) {
  const have = Array.from(select.options).map((o) => o.value).slice(1);
  if (have.join("\u0000") === values.join("\u0000")) return;
  const chosen = select.value;
  while (select.options.length > 1) select.remove(1);
  for (const v of values) { const o = el("option", v); o.value = v; select.append(o); }
  select.value = values.includes(chosen) ? chosen : "";
}

function renderFilters() {
  setOptions(document.getElementById("filter-node"), Object.keys(store.nodes));
  const node = document.getElementById("filter-node").value;
  const ranks = Object.values(store.ranks).filter((r) => !node || r.node === node).map((r) => String(r.rank));
  setOptions(document.getElementById("filter-rank"), ranks);
}

function renderLines() {
  const node = document.getElementById("filter-node").value;
  const rank = document.getElementById("filter-rank").value;
  const text = document.getElementById("filter-text").value;
  const out = [];
  for (const r of Object.values(store.ranks).sort((a, b) => a.rank - b.rank)) {
    if ((node && r.node !== node) || (rank && String(r.rank) !== rank)) continue;
    for (const line of store.lines[String(r.rank)] || []) {
      if (!text || line.includes(text)) out.push(`[${r.node}:${r.rank}] ${line}`);
    }
  }
  if (!rank) {
    for (const name of Object.keys(store.nodes)) {
      if (node && name !== node) continue;
      for (const line of store.lines[name] || []) if (!text || line.includes(text)) out.push(`[${name}] ${line}`);
    }
  }
  const pre = document.getElementById("lines");
  const stuck = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
  pre.textContent = out.join("\n");
  if (stuck) pre.scrollTop = pre.scrollHeight;
}

function drawChart(canvas, field) {
  const ctx = canvas.getContext("2d");
  const w = canvas.width, h = canvas.height, pad = 40;
  ctx.clearRect(0, 0, w, h);
  const series = [];
  let t0 = Infinity, t1 = -Infinity, lo = Infinity, hi = -Infinity;
  for (const [rank, pts] of Object.entries(store.points)) {
    const values = pts.filter((p) => p[field] !== null && p[field] !== undefined);
    if (!values.length) continue;
    series.push([Number(rank), values]);
    for (const p of values) { t0 = Math.min(t0, p[0]); t1 = Math.max(t1, p[0]); lo = Math.min(lo, p[field]); hi = Math.max(hi, p[field]); }
  }
  ctx.strokeStyle = "#999"; ctx.fillStyle = "#555"; ctx.font = "11px sans-serif";
  ctx.strokeRect(pad, 8, w - pad - 8, h - pad);
  if (!series.length) { ctx.fillText("no metric yet", pad + 8, 28); return; }
  if (hi === lo) { hi += 1; lo -= 1; }
  if (t1 === t0) t1 = t0 + 1;
  const x = (t) => pad + ((t - t0) / (t1 - t0)) * (w - pad - 8);
  const y = (v) => 8 + (1 - (v - lo) / (hi - lo)) * (h - pad);
  ctx.fillText(fmt(hi, 3), 2, 16); ctx.fillText(fmt(lo, 3), 2, h - pad + 8);
  ctx.fillText(`${Math.round(t1 - t0)} s`, w - 40, h - pad + 24);
  for (const [rank, values] of series) {
    ctx.strokeStyle = COLORS[rank % COLORS.length];
    ctx.lineWidth = rank === store.slowest ? 3 : 1.5;
    ctx.beginPath();
    values.forEach((p, i) => (i ? ctx.lineTo(x(p[0]), y(p[field])) : ctx.moveTo(x(p[0]), y(p[field]))));
    ctx.stroke();
  }
}

function drawCharts() {
  drawChart(document.getElementById("chart-loss"), 2);
  drawChart(document.getElementById("chart-speed"), 3);
  const legend = document.getElementById("legend");
  legend.replaceChildren();
  for (const r of Object.values(store.ranks)) {
    const item = el("span", null, "legend-item");
    const swatch = el("span", null, "swatch");
    swatch.style.background = COLORS[r.rank % COLORS.length];
    item.append(swatch, document.createTextNode(`rank ${r.rank} (${r.node})`));
    legend.append(item);
  }
}

// -- past runs ------------------------------------------------------------------------------------

async function loadRuns() {
  let doc;
  try { doc = await (await fetch(api("/api/runs"))).json(); } catch (e) { return; }
  const body = document.querySelector("#runs tbody");
  body.replaceChildren();
  for (const run of doc.runs) {
    const row = el("tr");
    row.dataset.run = run.run_id;
    const logs = el("td");
    for (const node of run.logs) {
      const button = el("button", node, "link");
      button.addEventListener("click", () => showLog(run.run_id, node));
      logs.append(button);
    }
    const bench = el("td");
    if (run.bench_page) {
      const a = el("a", "scaling");
      a.href = api(`/api/runs/${encodeURIComponent(run.run_id)}/scaling.html`);
      a.target = "_blank"; a.rel = "noopener noreferrer";
      bench.append(a);
    }
    row.append(el("td", run.run_id), el("td", new Date(run.started * 1000).toLocaleString()),
      el("td", run.nodes.join(" ")), logs, bench);
    body.append(row);
  }
}

async function showLog(runId, node) {
  const pre = document.getElementById("past-log");
  const url = api(`/api/runs/${encodeURIComponent(runId)}/logs/${encodeURIComponent(node)}`);
  const response = await fetch(url);
  pre.hidden = false;
  pre.textContent = response.ok ? `# ${runId} ${node}\n${await response.text()}` : `# ${runId} ${node}: no log`;
}

// -- connection -----------------------------------------------------------------------------------

function connect() {
  const status = document.getElementById("connection");
  const source = new EventSource(api("/api/stream"));
  source.addEventListener("snapshot", (e) => { status.textContent = "live"; status.dataset.live = "1"; applySnapshot(JSON.parse(e.data)); });
  source.addEventListener("delta", (e) => applyDelta(JSON.parse(e.data)));
  source.onerror = () => { status.textContent = "disconnected (retrying)"; status.dataset.live = ""; };
}

document.addEventListener("DOMContentLoaded", () => {
  for (const id of ["filter-node", "filter-rank", "filter-text"]) {
    document.getElementById(id).addEventListener("input", () => { renderFilters(); renderLines(); });
  }
  connect();
  loadRuns();
  setInterval(loadRuns, 30000);
});
