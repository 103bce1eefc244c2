// The obx dashboard: reads the relay's JSON API (/api/status, /api/trace, /api/series) and
// sends operator actions (/api/requeue, /api/redrive, /api/resolve) with the bearer token the
// operator typed in. The charts are drawn by uPlot (window.uPlot, vendored: /vendor/uplot.js).
//
// Event data (IDs, correlation IDs, aggregate IDs, reasons, broker words) is hostile input:
// it only ever reaches the page through text nodes (el() below never parses markup), so a
// "<script>" in a correlation ID is shown as those characters and never runs.
"use strict";

const TOKEN_KEY = "obx-token";
let lastQuery = "";

// ---- DOM helpers ---------------------------------------------------------------------------

// el("td", {class: "num"}, "12") — children are nodes or strings (strings become text nodes).
function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null) continue;
    if (k === "class") e.className = v;
    else if (k.startsWith("data-")) e.setAttribute(k, String(v));
    else if (k === "title" || k === "type" || k === "id") e.setAttribute(k, String(v));
    else if (k === "onclick") e.addEventListener("click", v);
  }
  for (const c of children) {
    if (c === undefined || c === null) continue;
    e.appendChild(typeof c === "string" || typeof c === "number" ? document.createTextNode(String(c)) : c);
  }
  return e;
}

function clear(node) {
  while (node.firstChild) node.removeChild(node.firstChild);
  return node;
}

// Every time a person reads here is ISO-8601 UTC (the JSON API carries epoch ms), and the
// charts' time axis is UTC on a 24-hour clock, as the header says.
function when(ms) {
  if (!ms) return "";
  return new Date(ms).toISOString();
}

// A chart's time (uPlot: seconds since the epoch) as UTC "HH:MM:SS" (24-hour); with its date
// ("YYYY-MM-DDTHH:MM:SSZ") for the legend. Used by the axes and legends of every chart.
function chartTime(s, withDate) {
  if (s === null || s === undefined) return "";
  const iso = new Date(Math.round(s * 1000)).toISOString();
  return withDate ? iso.slice(0, 19) + "Z" : iso.slice(11, 19);
}
window.obxChartTime = chartTime;

function age(ms) {
  if (!ms || ms < 0) return "0 s";
  if (ms < 1000) return ms + " ms";
  if (ms < 120000) return (ms / 1000).toFixed(1) + " s";
  if (ms < 7200000) return (ms / 60000).toFixed(1) + " min";
  return (ms / 3600000).toFixed(1) + " h";
}

function stateBadge(s) {
  return el("span", {class: "state state-" + String(s).replace(/[^A-Z_]/g, "")}, s);
}

// A table from rows of cells; cells are strings or nodes.
function table(headers, rows) {
  const t = el("table");
  t.appendChild(el("thead", {}, el("tr", {}, ...headers.map((h) => el("th", {}, h)))));
  const body = el("tbody");
  for (const r of rows) body.appendChild(el("tr", {}, ...r.map((c) => (c instanceof Node && c.tagName === "TD") ? c : el("td", {}, c))));
  t.appendChild(body);
  return t;
}

function kv(obj) {
  const rows = Object.entries(obj).map(([k, v]) => [el("td", {class: "muted"}, k), el("td", {class: "mono kv-value"}, v === null ? "" : String(v))]);
  return table(["field", "value"], rows);
}

function message(text, ok) {
  const m = document.getElementById("message");
  m.className = ok ? "ok" : "error";
  m.textContent = text;
}

// ---- API -----------------------------------------------------------------------------------

async function api(path, body) {
  const opts = {headers: {}};
  if (body !== undefined) {
    opts.method = "POST";
    opts.headers["Content-Type"] = "application/json";
    const tok = sessionStorage.getItem(TOKEN_KEY) || "";
    if (tok) opts.headers["Authorization"] = "Bearer " + tok;
    opts.body = JSON.stringify(body);
  }
  const r = await fetch(path, opts);
  let j = null;
  try { j = await r.json(); } catch (e) { j = {error: "HTTP " + r.status}; }
  if (!r.ok) throw new Error((j && j.error) || ("HTTP " + r.status));
  return j;
}

async function requeue(id) {
  try {
    await api("/api/requeue", {event_id: id});
    message("requeued " + id + ": PARKED -> PENDING", true);
  } catch (e) {
    message("requeue " + id + ": " + e.message, false);
  }
  await refresh();
  if (lastQuery) await search(lastQuery);
}

async function redrive(consumer, id) {
  try {
    await api("/api/redrive", {consumer: consumer, event_id: id});
    message("poison message " + id + " of " + consumer + " marked for re-drive", true);
  } catch (e) {
    message("re-drive " + id + ": " + e.message, false);
  }
  await refresh();
}

// An operator's same-target retry of a held UNKNOWN event (POST /api/resolve), with who and why
// from the form above the UNKNOWN list (both required: they go into the audit row).
async function resolveRetry(id) {
  const who = document.getElementById("resolve-who").value.trim();
  const reason = document.getElementById("resolve-reason").value.trim();
  if (!who || !reason) {
    message("resolve " + id + ": say who you are and why (the audit records both)", false);
    return;
  }
  try {
    const r = await api("/api/resolve", {event_id: id, action: "retry", who: who, reason: reason});
    const ev = (r.events || [])[0] || {};
    if (r.resolved === 1) message("resolve " + id + ": " + ev.result + ": " + ev.detail, true);
    else message("resolve " + id + ": " + (ev.result || "refused") + ": " + (ev.detail || ""), false);
  } catch (e) {
    message("resolve " + id + ": " + e.message, false);
  }
  await refresh();
}

function resolveButton(id) {
  return el("button", {class: "resolve", "data-event-id": id, type: "button", onclick: () => resolveRetry(id)}, "Resolve (retry)");
}

function requeueButton(id) {
  return el("button", {class: "requeue", "data-event-id": id, type: "button", onclick: () => requeue(id)}, "Requeue");
}

function traceLink(id) {
  return el("a", {class: "mono trace-link", "data-event-id": id, onclick: (ev) => { ev.preventDefault(); document.getElementById("search").value = id; search(id); }}, id);
}

// ---- status --------------------------------------------------------------------------------

function card(label, value, alert) {
  return el("div", {class: "card" + (alert ? " alert" : "")}, el("div", {class: "muted"}, label), el("div", {class: "value"}, String(value)));
}

// A critical consumer's lag, near the top: events of the newest published without its receipt,
// and the oldest's age; alarmed as ObxConsumerLag is (docs/ops/alerts.yml: behind over 10 min)
// or when its database cannot be read.
const LAG_ALERT_MS = 600000;
function lagCard(c) {
  const lag = c.lag || {};
  const value = !c.up ? "unreachable" : lag.events ? lag.events + " events" : "0";
  const note = !c.up ? c.error : lag.events ? "oldest " + age(lag.age_ms) : "all of the newest " + lag.window + " applied";
  return el("div", {class: "card lag" + (!c.up || lag.age_ms > LAG_ALERT_MS ? " alert" : ""), "data-consumer": c.consumer_id,
    title: "critical consumer " + c.consumer_id + ": events of the newest " + lag.window + " published without its receipt"},
  el("div", {class: "muted"}, "lag: " + c.consumer_id), el("div", {class: "value"}, value), el("div", {class: "muted note"}, note));
}

function renderStatus(s) {
  const r = s.relay || {};
  document.getElementById("relay").textContent = "relay " + (r.id || "?") + (r.stopping ? " (stopping)" : "") + " · " + s.store;
  document.getElementById("updated").textContent = "updated " + when(s.generated_at_ms) + (s.stats_age_ms ? " (counts " + age(s.stats_age_ms) + " old)" : "");
  // read-only, and why: no token file, or one that group or others may read (the relay refuses it)
  if (!r.token_configured) {
    const why = s.write_actions && s.write_actions !== "on" ? s.write_actions.replace(/^off: /, "") : "no http.token_file";
    document.getElementById("token-state").textContent = "read-only, actions disabled: " + why;
  }
  const cards = clear(document.getElementById("cards"));
  cards.appendChild(card("events", s.total));
  cards.appendChild(card("published", (s.states.PUBLISHED || 0) + (s.states.RETAINED || 0) + (s.states.PURGED || 0)));
  cards.appendChild(card("pending", s.pending.events));
  cards.appendChild(card("oldest pending", age(s.pending.oldest_age_ms), s.pending.oldest_age_ms > 300000));
  for (const c of s.consumers) cards.appendChild(lagCard(c));
  cards.appendChild(card("UNKNOWN", s.unknown.events, s.unknown.events > 0));
  cards.appendChild(card("oldest UNKNOWN", age(s.unknown.oldest_age_ms), s.unknown.oldest_age_ms > 900000));
  const held = s.unknown.held || 0, heldAge = s.unknown.oldest_held_age_ms || 0, heldAlert = s.unknown.held_alert_ms || 900000;
  cards.appendChild(el("div", {class: "card" + (held ? " alert" : ""), id: "card-held"}, el("div", {class: "muted"}, "held UNKNOWN"), el("div", {class: "value"}, String(held))));
  cards.appendChild(el("div", {class: "card" + (heldAge > heldAlert ? " alert" : ""), id: "card-held-age"}, el("div", {class: "muted"}, "oldest held"), el("div", {class: "value"}, held ? age(heldAge) : "-")));
  // held events end only by an operator's decision: say so above everything else
  const banner = document.getElementById("held-banner");
  banner.hidden = !held;
  banner.textContent = held ? held + " UNKNOWN event" + (held === 1 ? " is" : "s are") + " held for an operator, the oldest for " + age(heldAge) +
    (heldAge > heldAlert ? " (past the alert age of " + age(heldAlert) + ")" : "") + ": resolve below or with obx resolve." : "";
  // PENDING events of clusters no live relay serves wait for a relay that is not there
  const unserved = s.unserved_clusters || [];
  const ub = document.getElementById("unserved-banner");
  ub.hidden = !unserved.length;
  ub.textContent = unserved.map(u => u.pending + " PENDING event" + (u.pending === 1 ? "" : "s") + " of cluster " + u.cluster +
    " (the oldest " + age(u.oldest_age_ms) + " old): no live relay serves it").join("; ") + (unserved.length ? ". Start a relay for it, or route the type elsewhere." : "");
  cards.appendChild(card("parked", s.states.PARKED || 0, (s.states.PARKED || 0) > 0));
  cards.appendChild(card("quarantined receipts", s.receipts.quarantined, s.receipts.quarantined > 0));
  cards.appendChild(card("duplicate receipts", s.receipts.duplicate));
  const tb = clear(document.querySelector("#states tbody"));
  for (const [k, v] of Object.entries(s.states)) tb.appendChild(el("tr", {"data-state": k}, el("td", {}, stateBadge(k)), el("td", {class: "num"}, String(v))));

  const un = clear(document.getElementById("unknown"));
  if (!s.lists.unknown.length) un.appendChild(el("p", {class: "muted"}, "none"));
  for (const e of s.lists.unknown) {
    const box = el("div", {class: "event" + (e.held_at_ms ? " held-event" : ""), "data-event-id": e.event_id});
    box.appendChild(el("div", {}, traceLink(e.event_id), " ", stateBadge(e.state), " ",
      e.held_at_ms ? el("span", {class: "held", title: "held since " + when(e.held_at_ms)}, "HELD " + age(s.generated_at_ms - e.held_at_ms)) : null, e.held_at_ms ? " " : null,
      e.event_type, " ", el("span", {class: "mono"}, e.aggregate),
      " · unknown for " + age(s.generated_at_ms - e.unknown_since_ms) + " · policy " + e.on_unknown + " · next check " + when(e.next_check_at_ms),
      e.held_at_ms ? el("span", {}, " ", resolveButton(e.event_id)) : null));
    box.appendChild(table(["attempt", "gen", "state", "partition", "owner", "started", "detail"],
      e.attempts.map((a) => [el("td", {class: "mono"}, a.attempt_id), String(a.attempt_gen), stateBadge(a.state), String(a.partition), a.owner, when(a.started_at_ms), a.detail])));
    un.appendChild(box);
  }

  const pk = clear(document.getElementById("parked"));
  if (!s.lists.parked.length) pk.appendChild(el("p", {class: "muted"}, "none"));
  else pk.appendChild(table(["event", "type", "aggregate", "tenant", "correlation", "rejections", "last reason", ""],
    s.lists.parked.map((e) => [traceLink(e.event_id), e.event_type, el("td", {class: "mono"}, e.aggregate), e.tenant, el("td", {class: "mono"}, e.correlation_id),
      e.rejections + "/" + e.max_attempts, e.last_reason, el("td", {}, requeueButton(e.event_id))])));

  const q = clear(document.getElementById("quarantined"));
  if (!s.lists.quarantined.length) q.appendChild(el("p", {class: "muted"}, "none"));
  else q.appendChild(table(["event", "attempt", "where", "reason", "at"],
    s.lists.quarantined.map((rc) => [traceLink(rc.event_id), el("td", {class: "mono"}, rc.attempt_id), rc.cluster + "/" + rc.topic + "/" + rc.partition + "@" + rc.offset, rc.reason, when(rc.created_at_ms)])));

  const cs = clear(document.getElementById("consumers"));
  if (!s.consumers.length) cs.appendChild(el("p", {class: "muted"}, "none configured (audit.critical_consumers)"));
  for (const c of s.consumers) {
    const box = el("div", {class: "consumer", "data-consumer": c.consumer_id});
    box.appendChild(el("h3", {}, c.consumer_id + " ", el("span", {class: "muted mono"}, c.url)));
    if (!c.up) { box.appendChild(el("p", {class: "error"}, "unreachable: " + c.error)); cs.appendChild(box); continue; }
    box.appendChild(el("p", {}, "lag: " + c.lag.events + " of the newest " + c.lag.window + " published events not applied" +
      (c.lag.events ? ", oldest " + age(c.lag.age_ms) : "") + " · last commit " + (c.lag.last_commit_at_ms ? age(s.generated_at_ms - c.lag.last_commit_at_ms) + " ago" : "never") +
      " · poison: " + c.poison.parked + " parked, " + c.poison.redrive + " to re-drive"));
    if (c.poison.messages.length)
      box.appendChild(table(["event", "state", "failures", "last error", "parked at", ""],
        c.poison.messages.map((p) => [traceLink(p.event_id), p.state, String(p.failures), p.last_error, when(p.parked_at_ms),
          el("td", {}, p.state === "PARKED" ? el("button", {class: "redrive", type: "button", "data-event-id": p.event_id, onclick: () => redrive(c.consumer_id, p.event_id)}, "Re-drive") : "")])));
    cs.appendChild(box);
  }
}

async function refresh() {
  try {
    renderStatus(await api("/api/status"));
  } catch (e) {
    message("status: " + e.message, false);
  }
}

// ---- charts (/api/series, uPlot) -------------------------------------------------------------

// Each chart: series from /api/series by key, or one series per critical consumer. Colours are
// fixed so that a screenshot can be checked (tests/e2e/test_dashboard.py).
const CHARTS = [
  {id: "rates", title: "Enqueued and published (events/s, whole outbox)",
   series: [["enqueued_per_s", "enqueued/s", "#2b6cb0"], ["published_per_s", "published/s", "#2f855a"]]},
  {id: "backlog", title: "Backlog (publish slots not yet published, not parked)",
   series: [["backlog", "backlog", "#b7791f"]]},
  {id: "pending-age", title: "Oldest PENDING age (s)",
   series: [["oldest_pending_age_s", "oldest pending (s)", "#c05621"]]},
  {id: "unknown", title: "UNKNOWN outcomes: count and oldest age (s)",
   series: [["unknown_events", "UNKNOWN events", "#c53030"], ["oldest_unknown_age_s", "oldest UNKNOWN (s)", "#805ad5", "age"]]},
  {id: "retries", title: "Reconciler retries (per s, this relay)",
   series: [["retries_per_s", "retries/s", "#d53f8c"]]},
  {id: "lag", title: "Consumer lag (events of the newest published without a receipt)", consumers: "lag_events"},
  {id: "poison", title: "Consumer poison messages (PARKED)", consumers: "poison_parked"},
];
const PALETTE = ["#2b6cb0", "#2f855a", "#c05621", "#805ad5", "#d53f8c", "#319795", "#744210"];
// the uPlot instances by chart id (also for tests and the browser console)
window.obxCharts = {};
const chartKeys = {};

function chartSpec(c, doc) {
  if (c.consumers)
    return doc.consumers.map((k, i) => [k.consumer_id, k.consumer_id, PALETTE[i % PALETTE.length], null, k[c.consumers]]);
  return c.series.map(([key, label, color, scale]) => [key, label, color, scale, doc[key]]);
}

function renderCharts(doc) {
  const box = document.getElementById("charts");
  window.obxSeriesInterval = doc.interval_ms;
  document.getElementById("charts-note").textContent = "One sample every " + (doc.interval_ms / 1000) +
    " s, the last " + age(doc.interval_ms * doc.capacity) + " (" + doc.t.length + " so far), kept in the outbox: a restarted relay shows them. Times in UTC, 24-hour.";
  for (const c of CHARTS) {
    const spec = chartSpec(c, doc);
    const keys = spec.map((s) => s[0]).join("\u0000");
    let holder = document.getElementById("chart-" + c.id);
    if (!holder) {
      holder = el("div", {class: "chart", id: "chart-" + c.id}, el("h3", {}, c.title), el("div", {class: "plot"}));
      box.appendChild(holder);
    }
    const plot = holder.querySelector(".plot");
    if (!spec.length) {
      if (window.obxCharts[c.id]) { window.obxCharts[c.id].destroy(); delete window.obxCharts[c.id]; }
      clear(plot).appendChild(el("p", {class: "muted"}, "no critical consumers configured (audit.critical_consumers)"));
      chartKeys[c.id] = keys;
      continue;
    }
    const data = [doc.t, ...spec.map((s) => s[4])];
    let u = window.obxCharts[c.id];
    if (u && chartKeys[c.id] !== keys) { u.destroy(); u = null; }
    if (!u) {
      clear(plot);
      // UTC, 24-hour: uPlot's own time axis would use the browser's zone and a 12-hour clock
      const axes = [{values: (self, splits) => splits.map((s) => chartTime(s, false))}, {scale: "y", size: 56}];
      const scales = {x: {time: true}, y: {range: (self, min, max) => [0, max > 0 ? max * 1.1 : 1]}};
      if (spec.some((s) => s[3] === "age")) {
        axes.push({scale: "age", side: 1, grid: {show: false}, size: 56});
        scales.age = {range: (self, min, max) => [0, max > 0 ? max * 1.1 : 1]};
      }
      u = new uPlot({
        width: Math.max(300, plot.clientWidth || holder.clientWidth - 16), height: 170,
        scales, axes, legend: {show: true}, tzDate: (ts) => uPlot.tzDate(new Date(ts * 1000), "Etc/UTC"),
        series: [{label: "time (UTC)", value: (self, v) => chartTime(v, true)}, ...spec.map(([key, label, color, scale]) => ({label, stroke: color, width: 2, scale: scale || "y", spanGaps: false, points: {show: false}}))],
      }, data, plot);
      window.obxCharts[c.id] = u;
      chartKeys[c.id] = keys;
    } else {
      u.setData(data);
    }
  }
}

async function refreshCharts() {
  try {
    renderCharts(await api("/api/series"));
  } catch (e) {
    message("charts: " + e.message, false);
  }
}

// ---- trace ---------------------------------------------------------------------------------

function renderEvent(d) {
  const st = d.status;
  const box = el("div", {class: "event", "data-event-id": d.event_id});
  box.appendChild(el("h3", {}, el("span", {class: "mono"}, d.event_id), " ", el("span", {class: "event-state"}, st.state),
    st.state === "PARKED" ? el("span", {}, " ", requeueButton(d.event_id)) : null));
  box.appendChild(el("h4", {}, "envelope (frozen at commit)"));
  box.appendChild(kv(d.envelope));
  box.appendChild(el("h4", {}, "destination (frozen)"));
  box.appendChild(kv(d.destination));
  box.appendChild(el("h4", {}, "state"));
  box.appendChild(kv({state: st.state, claim_gen: st.claim_gen, owner: st.owner, rejections: st.rejections + "/" + st.max_attempts,
    committed: when(st.committed_at_ms), published: when(st.published_at_ms), unknown_since: when(st.unknown_since_ms), primary_attempt: st.primary_attempt_id}));
  box.appendChild(el("h4", {}, "attempts"));
  box.appendChild(table(["attempt", "gen", "claim", "owner", "state", "partition", "started", "detail"],
    d.attempts.map((a) => [el("td", {class: "mono"}, a.attempt_id), String(a.attempt_gen), String(a.claim_gen), a.owner, stateBadge(a.state), String(a.partition), when(a.started_at_ms), a.detail])));
  box.appendChild(el("h4", {}, "receipts"));
  box.appendChild(table(["kind", "attempt", "where", "reason", "at"],
    d.receipts.map((r) => [r.kind, el("td", {class: "mono"}, r.attempt_id), r.cluster + "/" + r.topic + "/" + r.partition + "@" + r.offset, r.reason, when(r.created_at_ms)])));
  box.appendChild(el("h4", {}, "audit"));
  box.appendChild(table(["at", "actor", "who", "from", "to", "claim", "attempt", "reason"],
    d.audit.map((a) => [when(a.at_ms), a.actor, a.who, a.from, a.to, String(a.claim_gen), el("td", {class: "mono"}, a.attempt_id), a.reason])));
  box.appendChild(el("h4", {}, "consumers"));
  if (!d.consumers.length) box.appendChild(el("p", {class: "muted"}, "no critical consumers configured"));
  else box.appendChild(table(["consumer", "receipt", "result", "consume audit", "poison"],
    d.consumers.map((c) => [c.consumer_id,
      c.error ? "unreachable: " + c.error : c.receipt ? c.receipt.outcome + " at " + when(c.receipt.consumed_at_ms) + " (" + c.receipt.duration_us + " µs, " + c.receipt.topic + "/" + c.receipt.partition + "@" + c.receipt.offset + ")" : "not consumed",
      c.receipt ? c.receipt.result : "",
      (c.audit || []).map((a) => a.outcome + (a.detail ? " (" + a.detail + ")" : "")).join("; "),
      c.poison ? c.poison.state + " after " + c.poison.failures + " failures: " + c.poison.last_error : ""])));
  return box;
}

async function search(q) {
  lastQuery = q;
  const out = clear(document.getElementById("trace"));
  try {
    const t = await api("/api/trace?q=" + encodeURIComponent(q));
    if (!t.events.length) out.appendChild(el("p", {class: "muted"}, "no event with this ID or correlation ID"));
    else out.appendChild(el("p", {class: "muted"}, t.events.length + " event(s)"));
    for (const d of t.events) out.appendChild(renderEvent(d));
  } catch (e) {
    out.appendChild(el("p", {class: "error"}, "trace: " + e.message));
  }
}

// ---- wiring --------------------------------------------------------------------------------

document.getElementById("token-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const v = document.getElementById("token").value.trim();
  if (v) sessionStorage.setItem(TOKEN_KEY, v); else sessionStorage.removeItem(TOKEN_KEY);
  document.getElementById("token").value = "";
  document.getElementById("token-state").textContent = v ? "token set for this tab" : "token cleared";
});

document.getElementById("resolve-form").addEventListener("submit", (ev) => ev.preventDefault());

document.getElementById("search-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const q = document.getElementById("search").value.trim();
  if (q) search(q);
});

refresh();
setInterval(refresh, 5000);
// the charts follow the relay's sampling interval (http.series_interval_ms), at most once a second
refreshCharts().then(() => {
  const every = Math.max(1000, Math.min(5000, (window.obxSeriesInterval || 5000)));
  setInterval(refreshCharts, every);
});
