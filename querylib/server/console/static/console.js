// The tq console's page: one state from /api/events (server-sent events), drawn as the view
// the location's hash names. Everything from the cluster is text (textContent), never HTML.
"use strict";

let state = null;
let me = null;  // who is logged in: from /api/state, once (the event stream is the same for all)
let logs = null;  // { queryId, source: EventSource, lines: [] } while a query's page is open
const MAX_LINES = 1000;

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined) continue;
    if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function svg(tag, attrs, ...children) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, value);
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function number(value, digits = 0) {
  if (value === null || value === undefined) return "–";
  return Number(value).toLocaleString("en-US", { maximumFractionDigits: digits });
}

function bytes(value) {
  if (value === null || value === undefined) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let v = Number(value), i = 0;
  while (v >= 1024 && i < units.length - 1) { v /= 1024; i++; }
  return `${v.toFixed(i ? 1 : 0)} ${units[i]}`;
}

function table(headers, rows, attrs) {
  return el("table", attrs,
    el("thead", {}, el("tr", {}, headers.map(h => el("th", {}, h)))),
    el("tbody", {}, rows));
}

function spark(points, key, width = 160, height = 32) {
  const values = points.map(p => p[key]);
  const box = svg("svg", { class: "spark", width, height, viewBox: `0 0 ${width} ${height}` });
  if (values.length < 2) return box;
  const max = Math.max(...values, 1);
  const step = width / (values.length - 1);
  const line = values.map((v, i) => `${(i * step).toFixed(1)},${(height - 2 - (v / max) * (height - 4)).toFixed(1)}`);
  box.append(svg("polyline", { points: line.join(" ") }));
  return box;
}

function queryLink(q) {
  return el("a", { href: `#/query/${q.query_id}` }, `${q.query_id} ${q.name}`);
}

function topicLink(t) {
  return el("a", { href: `#/topic/${encodeURIComponent(t.name)}` }, t.short_name);
}

// -- views ---------------------------------------------------------------------------------

function overview() {
  const o = state.overview;
  const states = Object.entries(o.queries).map(([s, n]) => `${n} ${s}`).join(", ") || "none";
  const running = state.queries.filter(q => !["finished", "failed", "killed"].includes(q.state));
  return [
    el("h1", {}, "Overview"),
    el("div", { class: "cards" },
      el("div", { class: "card", id: "card-executors" }, el("div", { class: "figure" }, o.executors), el("div", { class: "label" }, "executors")),
      el("div", { class: "card", id: "card-queries" }, el("div", { class: "figure" }, running.length), el("div", { class: "label" }, `queries live (${states})`)),
      el("div", { class: "card", id: "card-topics" }, el("div", { class: "figure" }, o.topics), el("div", { class: "label" }, "topics")),
      el("div", { class: "card", id: "card-rate" }, el("div", { class: "figure" }, number(o.records_per_s)), el("div", { class: "label" }, "records/s in"))),
    el("h2", {}, "Executors"),
    executorsTable(),
    el("h2", {}, "Queries"),
    table(["query", "state", "processes", "owner", "reason"],
      state.queries.slice().reverse().map(q => el("tr", { "data-query": q.query_id },
        el("td", {}, queryLink(q)),
        el("td", { class: `state-${q.state}` }, q.state),
        el("td", { class: "num" }, q.processes.length),
        el("td", {}, q.owner),
        el("td", { class: "muted" }, q.reason))), { id: "queries" }),
    el("h2", {}, "Topics"),
    topicsTable(state.topics.filter(t => !t.internal)),
  ];
}

function executorsTable() {
  return table(["executor", "host", "cpu", "memory used", "running", "slots"],
    state.executors.map(e => el("tr", {},
      el("td", {}, e.executor_id),
      el("td", {}, e.host),
      el("td", { class: "num" }, e.load ? `${number(e.load.cpu_percent, 1)} %` : "–"),
      el("td", { class: "num" }, e.load ? bytes(e.load.memory_used) : "–"),
      el("td", { class: "num" }, e.load ? e.load.running : "–"),
      el("td", { class: "num" }, e.slots))), { id: "executors" });
}

function topicsTable(topics) {
  return table(["topic", "partitions", "records", "size", "records/s", ""],
    topics.map(t => el("tr", { "data-topic": t.name },
      el("td", {}, topicLink(t)),
      el("td", { class: "num" }, t.partitions.length),
      el("td", { class: "num" }, number(t.records)),
      el("td", { class: "num" }, bytes(t.bytes)),
      el("td", { class: "num" }, number(t.records_per_s, 1)),
      el("td", {}, spark(t.history, "records_per_s", 100, 20)))), { id: "topics" });
}

function groupsView() {
  if (!state.groups.length) {
    return [el("h1", {}, "Consumer groups"), el("p", { class: "muted", id: "groups" }, "No consumer group has joined or committed yet.")];
  }
  return [
    el("h1", {}, "Consumer groups"),
    table(["group", "state", "generation", "members", "lag (records)"],
      state.groups.map(g => el("tr", { "data-group": g.group_id },
        el("td", {}, g.group_id), el("td", {}, g.state), el("td", { class: "num" }, g.generation),
        el("td", { class: "num" }, g.members.length), el("td", { class: "num" }, number(g.lag_records)))), { id: "groups" }),
    ...state.groups.map(g => [
      el("h2", {}, `Group ${g.group_id}`),
      g.members.length ? table(["member", "client", "host", "assigned"],
        g.members.map(m => el("tr", { "data-member": m.member_id },
          el("td", {}, m.member_id), el("td", {}, m.client_id), el("td", {}, m.client_host),
          el("td", {}, Object.entries(m.assignment).map(([t, ps]) => `${t} [${ps.join(", ")}]`).join("; ") || "–")))) :
        el("p", { class: "muted" }, "No members now."),
      g.committed.length ? table(["topic", "partition", "committed", "end", "lag", "lag (logical time)"],
        g.committed.map(c => el("tr", { "data-committed": `${g.group_id}/${c.topic}/${c.partition}`, "data-lag": c.lag_records ?? "" },
          el("td", {}, c.topic), el("td", {}, c.partition), el("td", { class: "num" }, number(c.offset)),
          el("td", { class: "num" }, number(c.log_end)), el("td", { class: "num" }, number(c.lag_records)),
          el("td", { class: "num" }, c.lag_time === null ? "before sampling" : number(c.lag_time))))) :
        el("p", { class: "muted" }, "Nothing committed."),
    ]),
  ];
}

function executors() {
  return [
    el("h1", {}, "Executors"),
    executorsTable(),
    ...state.executors.map(e => [
      el("h2", {}, `Executor ${e.executor_id} on ${e.host}: load over the last minutes`),
      el("div", { class: "cards" },
        el("div", { class: "card" }, el("div", { class: "label" }, "cpu %"), spark(e.history, "cpu_percent", 320, 60)),
        el("div", { class: "card" }, el("div", { class: "label" }, "memory used"), spark(e.history, "memory_used", 320, 60))),
    ]),
  ];
}

function followLogs(id) {
  if (logs && logs.queryId === id) return logs;
  stopLogs();
  logs = { queryId: id, source: new EventSource(`/api/queries/${encodeURIComponent(id)}/logs`), lines: [] };
  const mine = logs;
  mine.source.addEventListener("lines", message => {
    mine.lines.push(...JSON.parse(message.data));
    if (mine.lines.length > MAX_LINES) mine.lines.splice(0, mine.lines.length - MAX_LINES);
    const pre = document.getElementById("logs");
    if (pre && logs === mine) drawLines(pre, mine.lines);
  });
  return logs;
}

function stopLogs() {
  if (logs) logs.source.close();
  logs = null;
}

function drawLines(pre, lines) {
  const atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
  // process -1: the console's own word on the lines (an executor's broker it cannot read now)
  pre.textContent = lines.map(l => l.process < 0 ? `[console] ${l.text}`
    : `[${l.process}${l.stream === "stderr" ? " stderr" : ""}] ${l.text}`).join("\n");
  if (atBottom) pre.scrollTop = pre.scrollHeight;
}

function queryView(id) {
  const q = state.queries.find(q => String(q.query_id) === id);
  const pre = el("pre", { id: "logs", class: "logs" });
  drawLines(pre, followLogs(id).lines);
  if (!q) return [el("h1", {}, `Query ${id}`), el("p", { class: "muted" }, "No such query (yet).")];
  const live = !["finished", "failed", "killed"].includes(q.state);
  const message = el("p", { id: "kill-message", class: "error" });
  const kill = actionButton("kill", "Kill", `/api/queries/${q.query_id}/kill`, message);
  return [
    el("h1", {}, `Query ${q.query_id}: ${q.name}`),
    el("p", {}, "State: ", el("span", { id: "query-state", class: `state-${q.state}` }, q.state),
      q.reason ? ` (${q.reason})` : "", ` · owner ${q.owner} · program ${q.program}`),
    live ? kill : null, message,
    el("h2", {}, "Processes"),
    table(["process", "executor", "pid", "cpu", "rss", "exit code"],
      q.processes.map(p => el("tr", {},
        el("td", {}, p.process), el("td", {}, p.executor ?? "–"), el("td", { class: "num" }, p.pid ?? "–"),
        el("td", { class: "num" }, p.cpu_percent === null ? "–" : `${number(p.cpu_percent, 1)} %`),
        el("td", { class: "num" }, bytes(p.rss)), el("td", { class: "num" }, p.exit_code ?? "–"))), { id: "processes" }),
    el("h2", {}, "Output"),
    pre,
  ];
}

function actionButton(id, label, url, message) {
  return el("button", {
    class: "danger", id, onclick: async () => {
      message.textContent = "";
      const reply = await fetch(url, { method: "POST", headers: { "X-Tq-Console": "1" } });
      const body = await reply.json().catch(() => ({}));
      if (!reply.ok) message.textContent = body.error || `refused (${reply.status})`;
    },
  }, label);
}

function topicView(name) {
  const t = state.topics.find(t => t.name === name);
  if (!t) return [el("h1", {}, name), el("p", { class: "muted" }, "No such topic (yet).")];
  const message = el("p", { id: "delete-message", class: "error" });
  return [
    el("h1", {}, `Topic ${t.short_name}`),
    el("p", { class: "muted" }, `${t.name} · ${t.kind} · owner ${t.owner} · ${t.record_type}`),
    t.internal ? null : actionButton("delete", "Delete topic", `/api/topics/${encodeURIComponent(t.name)}/delete`, message),
    message,
    el("div", { class: "cards" },
      el("div", { class: "card" }, el("div", { class: "figure", id: "topic-rate" }, number(t.records_per_s, 1)), el("div", { class: "label" }, "records/s"), spark(t.history, "records_per_s", 240, 40)),
      el("div", { class: "card" }, el("div", { class: "figure" }, number(t.records)), el("div", { class: "label" }, "records")),
      el("div", { class: "card" }, el("div", { class: "figure" }, bytes(t.bytes)), el("div", { class: "label" }, "on disk"))),
    el("h2", {}, "Subscriptions"),
    t.subscriptions.length ? table(["subscriber", "partition", "next offset", "lag (records)", "lag (logical time)"],
      t.subscriptions.map(s => el("tr", { "data-principal": s.principal, "data-lag": s.lag_records },
        el("td", {}, s.who), el("td", {}, s.partition), el("td", { class: "num" }, number(s.next_offset)),
        el("td", { class: "num lag" }, number(s.lag_records)),
        el("td", { class: "num" }, s.lag_time === null ? "before sampling" : number(s.lag_time)))), { id: "subscriptions" })
      : el("p", { class: "muted", id: "subscriptions" }, "Nobody subscribes now."),
    t.groups.length ? [el("h2", {}, "Consumer groups"),
      table(["group", "partition", "committed", "lag (records)", "lag (logical time)"], t.groups.map(g => el("tr", {},
        el("td", {}, g.group_id), el("td", {}, g.partition), el("td", { class: "num" }, number(g.offset)),
        el("td", { class: "num" }, number(g.lag_records)),
        el("td", { class: "num" }, g.lag_time === null ? "before sampling" : number(g.lag_time)))), { id: "topic-groups" })] : null,
    el("h2", {}, "Partitions"),
    table(["partition", "broker", "start", "end", "size", "frontier", "ended"],
      t.partitions.map(p => el("tr", {},
        el("td", {}, p.partition), el("td", {}, p.broker ?? "–"), el("td", { class: "num" }, number(p.log_start)),
        el("td", { class: "num" }, number(p.log_end)), el("td", { class: "num" }, bytes(p.size)),
        el("td", { class: "num" }, number(p.frontier)), el("td", {}, p.ended === null ? "–" : (p.ended ? "yes" : "no")))), { id: "partitions" }),
  ];
}

// Queries and topics in columns by their depth in the dataflow (longest path from a source).
function graph() {
  const g = state.graph;
  const depth = new Map(g.nodes.map(n => [n.id, 0]));
  for (let round = 0; round < g.nodes.length; round++) {
    let moved = false;
    for (const e of g.edges) {
      const d = (depth.get(e.from) ?? 0) + 1;
      if (depth.has(e.to) && d > depth.get(e.to) && d <= g.nodes.length) { depth.set(e.to, d); moved = true; }
    }
    if (!moved) break;
  }
  const columns = new Map();
  for (const n of g.nodes) {
    const d = depth.get(n.id);
    if (!columns.has(d)) columns.set(d, []);
    columns.get(d).push(n);
  }
  const W = 170, H = 34, GX = 90, GY = 30, place = new Map();
  let height = 80, width = 80;
  for (const [d, nodes] of [...columns.entries()].sort((a, b) => a[0] - b[0])) {
    nodes.sort((a, b) => a.label.localeCompare(b.label));
    nodes.forEach((n, i) => place.set(n.id, { x: 20 + d * (W + GX), y: 20 + i * (H + GY) }));
    height = Math.max(height, 40 + nodes.length * (H + GY));
    width = Math.max(width, 40 + (d + 1) * (W + GX));
  }
  const box = svg("svg", { class: "graph", id: "graph", width, height, viewBox: `0 0 ${width} ${height}` });
  for (const e of g.edges) {
    const a = place.get(e.from), b = place.get(e.to);
    if (!a || !b) continue;
    const x1 = a.x + W, y1 = a.y + H / 2, x2 = b.x, y2 = b.y + H / 2, mx = (x1 + x2) / 2;
    box.append(svg("g", { class: "edge", "data-from": e.from, "data-to": e.to },
      svg("path", { d: `M${x1},${y1} C${mx},${y1} ${mx},${y2} ${x2},${y2}`, "marker-end": "url(#arrow)" }),
      svg("text", { x: mx - 20, y: (y1 + y2) / 2 - 4 },
        `${number(e.records_per_s, 1)}/s` + (e.lag_records ? ` · lag ${number(e.lag_records)}` : ""))));
  }
  for (const n of g.nodes) {
    const p = place.get(n.id);
    const label = n.kind === "query" ? `${n.query_id} ${n.label}` : n.label;
    const node = svg("g", { class: `node ${n.kind}`, "data-id": n.id, transform: `translate(${p.x},${p.y})` },
      svg("rect", { width: W, height: H, rx: n.kind === "topic" ? 17 : 4 }),
      svg("text", { x: 10, y: 21 }, label.length > 24 ? label.slice(0, 23) + "…" : label));
    if (n.kind !== "client") {
      const href = n.kind === "query" ? `#/query/${n.query_id}` : `#/topic/${encodeURIComponent(n.name)}`;
      node.addEventListener("click", () => { location.hash = href; });
      node.style.cursor = "pointer";
    }
    box.append(node);
  }
  box.prepend(svg("defs", {}, svg("marker", { id: "arrow", viewBox: "0 0 10 10", refX: 9, refY: 5, markerWidth: 7, markerHeight: 7, orient: "auto" },
    svg("path", { d: "M0,0 L10,5 L0,10 z", fill: "#8a93a8" }))));
  return [
    el("h1", {}, "Dataflow"),
    el("p", { class: "muted" }, "Live queries and the topics between them; each arrow says how many records a second its topic takes in."),
    g.nodes.length ? box : el("p", { id: "graph-empty", class: "muted" }, "No live query publishes or subscribes yet."),
  ];
}

// -- drawing ---------------------------------------------------------------------------------

// A link's part as text; one that does not decode (a hand-made or cut link) as it is: the
// page then says there is no such query or topic rather than stopping the script.
function decoded(part) {
  try { return decodeURIComponent(part); } catch (error) { return part; }
}

function draw() {
  const main = document.getElementById("main");
  if (!state) return;
  const hash = location.hash || "#/";
  const [, view, arg] = hash.match(/^#\/([^/]*)\/?(.*)$/) || [null, "", ""];
  if (view !== "query") stopLogs();
  let content;
  if (view === "graph") content = graph();
  else if (view === "executors") content = executors();
  else if (view === "groups") content = groupsView();
  else if (view === "query") content = queryView(decoded(arg));
  else if (view === "topic") content = topicView(decoded(arg));
  else content = overview();
  main.replaceChildren(...content.flat().filter(x => x));
  for (const a of document.querySelectorAll("nav a")) {
    a.classList.toggle("active", a.dataset.view === (view || "overview"));
  }
  document.getElementById("me").replaceChildren(me ? `logged in as ${me}` : el("a", { href: "/login" }, "log in"));
}

function connect() {
  fetch("/api/state").then(reply => reply.ok ? reply.json() : null).then(body => {
    if (body) { me = body.me; draw(); }
  }).catch(() => {});
  const status = document.getElementById("status");
  const events = new EventSource("/api/events");
  let last = "";
  events.addEventListener("state", message => {
    if (message.data === last) return;  // nothing new: no redraw
    last = message.data;
    state = JSON.parse(message.data);
    status.textContent = "live";
    status.className = "status live";
    document.body.dataset.versions = JSON.stringify(state.versions);
    draw();
  });
  events.onerror = () => {
    status.textContent = "reconnecting…";
    status.className = "status down";
  };
}

window.addEventListener("hashchange", draw);
connect();
