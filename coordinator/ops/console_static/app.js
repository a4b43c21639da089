// herd's operator console: read-only, served by herd, no outside host, no build step.
// Every value from the server goes into the page as text (textContent / attributes set one by one),
// never as HTML: group ids, client ids and hosts are whatever clients sent.
"use strict";

const REFRESH_MS = 3000;
const app = document.getElementById("app");
const state = {
  list: { q: "", state: "", sort: "group_id", order: "asc", offset: 0, limit: 50 },
  paused: false, timer: null, seq: 0, route: null,
};

// ---- DOM helpers ----------------------------------------------------------------------------------

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") el.className = v;
    else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, String(v));
  }
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined || c === false) continue;
    el.appendChild(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

function fmtInt(n) { return n === null || n === undefined ? "–" : Number(n).toLocaleString("en-US"); }

function fmtDuration(s) {
  if (s === null || s === undefined) return "–";
  if (s < 1) return `${Math.round(s * 1000)} ms`;
  if (s < 60) return `${s < 10 ? s.toFixed(1) : Math.round(s)} s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m}m ${Math.round(s - m * 60)}s`;
  const hr = Math.floor(m / 60);
  if (hr < 48) return `${hr}h ${m - hr * 60}m`;
  return `${Math.floor(hr / 24)}d ${hr % 24}h`;
}

function fmtMs(ms) { return ms === null || ms === undefined ? "–" : fmtDuration(ms / 1000); }

function fmtTime(ms) {
  if (ms === null || ms === undefined || ms < 0) return "–";
  const d = new Date(ms);
  const pad = (x, n = 2) => String(x).padStart(n, "0");
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ` +
         `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
}

function stateBadge(s) { return h("span", { class: `state ${String(s).replace(/[^A-Za-z]/g, "")}` }, s); }

function who(m) {
  if (!m) return "–";
  const name = m.client_id || m.member_id || "?";
  return m.client_host ? `${name}@${m.client_host}` : name;
}

async function getJSON(url) {
  const resp = await fetch(url, { cache: "no-store", credentials: "same-origin" });
  const body = await resp.json().catch(() => ({}));
  if (!resp.ok) { const e = new Error(body.error || `HTTP ${resp.status}`); e.status = resp.status; throw e; }
  return body;
}

// ---- header ------------------------------------------------------------------------------------------

function renderHeader(data) {
  const summary = document.getElementById("summary");
  summary.replaceChildren();
  if (data.by_state) {
    summary.appendChild(h("span", { class: "chip" }, `${fmtInt(data.total)} groups`));
    for (const [s, n] of Object.entries(data.by_state).sort()) {
      summary.appendChild(h("span", { class: "chip" }, `${s} ${fmtInt(n)}`));
    }
  }
  const pill = document.getElementById("lag-status");
  const lag = data.lag || {};
  if (!lag.reader) {
    pill.className = "pill off";
    pill.textContent = lag.configured ? "data cluster set: no reader, commit ages only" : "no data cluster: commit ages only";
  } else if (lag.up) {
    pill.className = "pill ok";
    pill.textContent = `lag live · every ${fmtMs(lag.interval_ms)}`;
  } else {
    pill.className = "pill stale";
    pill.textContent = lag.refreshes ? `lag stale: ${lag.last_error || "data cluster not answering"}` : "lag: first read pending";
    pill.title = lag.last_error || "";
  }
  document.getElementById("updated").textContent = `updated ${new Date().toLocaleTimeString()}`;
}

// how a time lag was found: a small tag after the number, its explanation on hover
const LAG_METHODS = {
  interpolated: ["history", "interpolated from herd's log-end history"],
  record: ["record", "the timestamp of the record at the committed offset (older than herd's log-end history)"],
  extrapolated: ["extrap.", "extrapolated along herd's log-end history (older than it; the record's time not read yet)"],
};
function lagMethod(method) {
  const m = method && LAG_METHODS[method];
  return m ? h("span", { class: "lag-method muted", "data-method": method, title: m[1] }, m[0]) : null;
}

// ---- the group list -------------------------------------------------------------------------------------

const COLUMNS = [
  ["group_id", "Group", "group"], ["state", "State", ""], ["type", "Type", ""],
  ["members", "Members", "num"], ["partitions", "Partitions", "num"], ["lag", "Lag (offsets)", "num"],
  ["lag_seconds", "Lag (time)", "num"], ["last_commit_age", "Last commit", "num"],
  ["rebalances_1h", "Rebalances 1h", "num"],
];

function listURL() {
  const p = new URLSearchParams();
  const l = state.list;
  for (const k of ["q", "state", "sort", "order", "offset", "limit"]) if (l[k] !== "") p.set(k, l[k]);
  return `api/groups?${p.toString()}`;
}

function buildListView() {
  const search = h("input", { type: "search", id: "filter", placeholder: "Filter groups by id…", value: state.list.q,
    "aria-label": "Filter groups", oninput: (e) => { state.list.q = e.target.value; state.list.offset = 0; refreshSoon(); } });
  const stateSel = h("select", { id: "state-filter", "aria-label": "State", onchange: (e) => {
    state.list.state = e.target.value; state.list.offset = 0; refreshSoon(); } },
    h("option", { value: "" }, "All states"),
    ...["Stable", "Empty", "PreparingRebalance", "CompletingRebalance", "Dead"].map((s) =>
      h("option", { value: s, selected: state.list.state === s ? "selected" : null }, s)));
  const sizeSel = h("select", { id: "page-size", "aria-label": "Page size", onchange: (e) => {
    state.list.limit = Number(e.target.value); state.list.offset = 0; refreshSoon(); } },
    ...[25, 50, 100, 200].map((n) => h("option", { value: n, selected: state.list.limit === n ? "selected" : null }, `${n} / page`)));
  const head = h("tr", {}, COLUMNS.map(([key, label, cls]) => h("th", {
    class: `sortable ${cls === "num" ? "num" : ""}`, "data-sort": key,
    onclick: () => {
      const l = state.list;
      if (l.sort === key) l.order = l.order === "asc" ? "desc" : "asc";
      else { l.sort = key; l.order = cls === "num" ? "desc" : "asc"; }
      l.offset = 0; refreshSoon();
    } }, label)));
  app.replaceChildren(
    h("div", { class: "toolbar" }, search, stateSel, h("span", { class: "spacer" }), h("span", { id: "matched", class: "muted" }), sizeSel),
    h("div", { class: "card" },
      h("table", { id: "groups" }, h("thead", {}, head), h("tbody", {})),
      h("div", { class: "pager" },
        h("button", { id: "prev", type: "button", onclick: () => { state.list.offset = Math.max(0, state.list.offset - state.list.limit); refreshSoon(); } }, "‹ Prev"),
        h("span", { id: "page", class: "muted" }),
        h("button", { id: "next", type: "button", onclick: () => { state.list.offset += state.list.limit; refreshSoon(); } }, "Next ›"))));
}

function renderList(data) {
  if (!document.getElementById("groups")) buildListView();
  for (const th of app.querySelectorAll("th[data-sort]")) {
    const on = th.getAttribute("data-sort") === data.sort;
    th.classList.toggle("sorted", on);
    th.classList.toggle("desc", on && data.order === "desc");
  }
  // the flight recorder is in memory: less than an hour after a start it counts since the start
  const rb = app.querySelector('th[data-sort="rebalances_1h"]');
  if (rb && data.rebalances) {
    rb.textContent = `Rebalances ${data.rebalances.label}`;
    rb.title = data.rebalances.since_start ? `herd started ${fmtTime(data.rebalances.since_ms)}: rebalances before are not known (the flight recorder is in memory)` : "rebalances in the last hour";
  }
  const tbody = app.querySelector("#groups tbody");
  const rows = data.groups.map((g) => {
    const lagCls = g.lag_seconds !== null && g.lag_seconds >= 60 ? "num lag-hot" : "num";
    return h("tr", { class: "group-row", "data-group": g.group_id },
      h("td", { class: "group" }, h("a", { href: `#/group/${encodeURIComponent(g.group_id)}` }, g.group_id)),
      h("td", {}, stateBadge(g.state)),
      h("td", { class: "muted group-type", title: g.protocol_type ? `protocol type: ${g.protocol_type}` : null }, g.type || "–",
        g.type === "classic" && g.protocol_type && g.protocol_type !== "consumer" ? h("span", { class: "lag-method" }, g.protocol_type) : null),
      h("td", { class: "num" }, fmtInt(g.members)),
      h("td", { class: "num" }, fmtInt(g.partitions)),
      h("td", { class: "num" }, fmtInt(g.lag), g.stale_partitions ? h("span", { class: "stale-mark", title: `${g.stale_partitions} partition(s) stale` }, "stale") : null),
      h("td", { class: lagCls }, fmtDuration(g.lag_seconds), lagMethod(g.lag_seconds_method)),
      h("td", { class: "num", title: fmtTime(g.last_commit_ms) }, g.last_commit_age === null ? "never" : `${fmtDuration(g.last_commit_age)} ago`),
      h("td", { class: "num", title: g.rebalances_1h_or_more ? "every rebalance the flight recorder keeps is from the last hour" : null },
        g.rebalances_1h_or_more ? `${fmtInt(g.rebalances_1h)}+` : fmtInt(g.rebalances_1h)));
  });
  if (!rows.length) rows.push(h("tr", {}, h("td", { colspan: COLUMNS.length, class: "muted" }, data.total ? "No group matches." : "No groups yet.")));
  tbody.replaceChildren(...rows);
  const pages = Math.max(1, Math.ceil(data.matched / data.limit));
  const page = Math.floor(data.offset / data.limit) + 1;
  document.getElementById("page").textContent = `page ${page} of ${pages}`;
  document.getElementById("matched").textContent = data.matched === data.total ? `${fmtInt(data.total)} groups` : `${fmtInt(data.matched)} of ${fmtInt(data.total)} groups`;
  document.getElementById("prev").disabled = data.offset === 0;
  document.getElementById("next").disabled = data.offset + data.limit >= data.matched;
}

// ---- one group ------------------------------------------------------------------------------------------

function membersCard(g) {
  const card = h("div", { class: "card", id: "members" }, h("h2", {}, "Members", h("span", { class: "muted" }, `${g.members.length}`)));
  if (!g.members.length) { card.appendChild(h("div", { class: "empty" }, "No members (an Empty group: its offsets stay, and so does its lag).")); return card; }
  card.appendChild(h("table", {},
    h("thead", {}, h("tr", {}, h("th", {}, "Client id"), h("th", {}, "Host"), h("th", {}, "Assigned partitions"), h("th", {}, "Member id"))),
    h("tbody", {}, g.members.map((m) => h("tr", { class: "member-row", "data-member": m.member_id },
      h("td", {}, m.client_id || "–", m.group_instance_id ? h("div", { class: "muted" }, `static: ${m.group_instance_id}`) : null),
      h("td", { class: "mono" }, m.client_host || "–"),
      h("td", {}, m.assignment === null ? h("span", { class: "muted" }, "not a consumer assignment")
        : m.assignment.length ? m.assignment.map(([t, ps]) => ps.map((p) => h("span", { class: "tp" }, `${t}-${p}`)))
          : h("span", { class: "muted" }, "none")),
      h("td", { class: "mono muted" }, m.member_id))))));
  return card;
}

function partitionsCard(g) {
  const owners = Object.fromEntries(g.members.map((m) => [m.member_id, m]));
  const card = h("div", { class: "card", id: "partitions" }, h("h2", {}, "Partitions", h("span", { class: "muted" }, `${g.partitions.length}`)));
  if (!g.partitions.length) { card.appendChild(h("div", { class: "empty" }, "No committed offsets.")); return card; }
  card.appendChild(h("table", {},
    h("thead", {}, h("tr", {}, ["Topic", "Partition", "Committed", "Committed at", "Log end", "Lag", "Lag (time)", "Owner"].map((t, i) =>
      h("th", { class: i >= 1 && i <= 6 && i !== 3 ? "num" : "" }, t)))),
    h("tbody", {}, g.partitions.map((p) => h("tr", { class: "partition-row", "data-tp": `${p.topic}-${p.partition}` },
      h("td", {}, p.topic), h("td", { class: "num" }, p.partition),
      h("td", { class: "num committed" }, fmtInt(p.committed)),
      h("td", { title: fmtTime(p.commit_ms) }, p.commit_ms === null ? "–" : `${fmtMs(g.now_ms - p.commit_ms)} ago`),
      h("td", { class: "num" }, fmtInt(p.log_end)),
      h("td", { class: "num" }, fmtInt(p.lag), p.stale ? h("span", { class: "stale-mark", title: `last log end read ${fmtTime(p.sampled_ms)}` }, "stale") : null),
      h("td", { class: p.lag_seconds >= 60 ? "num lag-hot" : "num" }, fmtDuration(p.lag_seconds), lagMethod(p.lag_seconds_method)),
      h("td", {}, p.owner ? who(owners[p.owner]) : h("span", { class: "muted" }, "unowned")))))));
  return card;
}

function triggerText(t) {
  if (!t) return null;
  if (Array.isArray(t.members) && t.members.length) return t.members.map(who).join(", ");
  if (t.member_id || t.client_id) return who(t);
  return Object.entries(t).map(([k, v]) => `${k}: ${typeof v === "object" ? JSON.stringify(v) : v}`).join(", ");
}

function rebalanceItem(r, longest) {
  const dur = r.duration_ms;
  const prep = r.phases.preparing_ms || 0, comp = r.phases.completing_ms || 0;
  // the bar's length is the rebalance's duration against the longest shown; its colours the phases
  const scale = Math.max(0.015, (prep + comp) / Math.max(1, longest));
  const trig = triggerText(r.trigger);
  const lines = [];
  if (r.detail) lines.push(h("div", {}, h("span", { class: "k" }, "why"), r.detail));
  if (trig) lines.push(h("div", {}, h("span", { class: "k" }, "trigger"), trig));
  if (r.client_reason) lines.push(h("div", {}, h("span", { class: "k" }, "client says"), r.client_reason));
  if (r.awaited.length) lines.push(h("div", { class: "awaited" }, h("span", { class: "k" }, "waited for"),
    r.awaited.map((a, i) => [i ? "; " : "", who(a), ": ", a.rejoined_after_ms === null ? (a.outcome || "not rejoined") : `rejoined after ${fmtMs(a.rejoined_after_ms)}`])));
  if (r.joined.length) lines.push(h("div", {}, h("span", { class: "k" }, "joined"), r.joined.map((j, i) => [i ? ", " : "", who(j)])));
  if (r.removed.length) lines.push(h("div", { class: "removed" }, h("span", { class: "k" }, "removed"),
    r.removed.map((x, i) => [i ? "; " : "", x.member_id, ` (${x.why}, after ${fmtMs(x.after_ms)})`])));
  lines.push(h("div", {}, h("span", { class: "k" }, "phases"), `preparing ${fmtMs(r.phases.preparing_ms)}, completing ${fmtMs(r.phases.completing_ms)}`,
    h("div", { class: "bar", title: `preparing ${prep} ms, completing ${comp} ms` },
      h("span", { class: "prep", "data-w": prep + comp ? scale * prep / (prep + comp) : scale }),
      h("span", { class: "comp", "data-w": prep + comp ? scale * comp / (prep + comp) : 0 }))));
  const result = r.outcome === "in_progress" ? "in progress" : r.outcome === "stable" ? `stable, ${r.members} member(s), ${r.protocol || ""}` : r.outcome;
  const item = h("li", { class: `rebalance ${r.outcome}`, "data-generation": r.generation ?? "", "data-reason": r.reason },
    h("div", { class: "rb-head" },
      h("span", { class: "gen" }, `generation ${r.previous_generation} → ${r.generation ?? "?"}`),
      h("span", { class: "reason" }, r.reason),
      h("span", {}, result),
      h("span", { class: "muted" }, `${fmtTime(r.started_wall_ms)} · ${fmtMs(dur)}`)),
    h("div", { class: "rb-body" }, lines));
  // widths via the CSSOM (the page's CSP allows no inline style attributes)
  for (const seg of item.querySelectorAll(".bar span")) seg.style.width = `${(Number(seg.getAttribute("data-w")) * 100).toFixed(1)}%`;
  return item;
}

function timelineCard(g) {
  const card = h("div", { class: "card", id: "timeline" }, h("h2", {}, "Rebalances",
    h("span", { class: "muted" }, `the flight recorder keeps the last ${g.history_size}; newest first`),
    h("span", { class: "legend" }, h("i", { class: "prep-i" }), "preparing", h("i", { class: "comp-i" }), "completing")));
  for (const i of card.querySelectorAll(".legend i")) i.style.background = i.classList.contains("prep-i") ? "var(--bar-prep)" : "var(--bar-comp)";
  if (!g.history.length) { card.appendChild(h("div", { class: "empty" }, "No rebalance recorded.")); return card; }
  const longest = Math.max(1, ...g.history.map((r) => (r.phases.preparing_ms || 0) + (r.phases.completing_ms || 0)));
  card.appendChild(h("ol", { class: "timeline" }, g.history.slice().reverse().map((r) => rebalanceItem(r, longest))));
  return card;
}

function renderGroup(g) {
  const lastCommit = Math.max(-1, ...g.partitions.map((p) => p.commit_ms ?? -1));
  const totalLag = g.partitions.some((p) => p.lag !== null) ? g.partitions.reduce((a, p) => a + (p.lag || 0), 0) : null;
  const maxLagS = g.partitions.reduce((a, p) => (p.lag_seconds !== null && (a === null || p.lag_seconds > a) ? p.lag_seconds : a), null);
  app.replaceChildren(
    h("div", { class: "group-head" }, h("a", { href: "#/" }, "← all groups"), h("h1", { id: "group-title" }, g.group_id), stateBadge(g.state)),
    h("div", { class: "facts", style: null },
      h("span", {}, "type ", h("b", {}, g.type || "–")), h("span", {}, "protocol type ", h("b", {}, g.protocol_type || "–")),
      h("span", {}, "protocol ", h("b", {}, g.protocol || "–")),
      h("span", {}, "generation ", h("b", {}, g.generation)), h("span", {}, "state since ", h("b", {}, fmtTime(g.state_since_ms))),
      h("span", {}, "lag ", h("b", {}, fmtInt(totalLag)), " offsets, ", h("b", {}, fmtDuration(maxLagS))),
      h("span", {}, "last commit ", h("b", {}, lastCommit < 0 ? "never" : `${fmtMs(g.now_ms - lastCommit)} ago`))),
    h("div", { class: "spacer-12" }),
    membersCard(g), partitionsCard(g),
    timelineCard(g));
  app.querySelector(".spacer-12").style.height = "14px";
}

// ---- routing and refresh --------------------------------------------------------------------------------

function currentRoute() {
  const m = location.hash.match(/^#\/group\/(.*)$/);
  if (m) { try { return { group: decodeURIComponent(m[1]) }; } catch { return { group: m[1] }; } }
  return { list: true };
}

async function refresh() {
  clearTimeout(state.timer);
  const seq = ++state.seq;
  const route = currentRoute();
  try {
    if (route.group !== undefined) {
      const g = await getJSON(`api/group?id=${encodeURIComponent(route.group)}`);
      if (seq !== state.seq) return;
      renderGroup(g);
      renderHeader({ lag: g.lag });
    } else {
      const data = await getJSON(listURL());
      if (seq !== state.seq) return;
      renderList(data);
      renderHeader(data);
    }
    document.body.setAttribute("data-loaded", String(seq));
    if (seq === 1) performance.mark("herd:first-render");  // read by bench/console.py
  } catch (e) {
    if (seq !== state.seq) return;
    if (route.group !== undefined && e.status === 404) {
      app.replaceChildren(h("div", { class: "group-head" }, h("a", { href: "#/" }, "← all groups")),
        h("p", { class: "error" }, `No group "${route.group}" (deleted, or its offsets expired).`));
    } else if (route.group !== undefined && e.status === 403) {
      app.replaceChildren(h("div", { class: "group-head" }, h("a", { href: "#/" }, "← all groups")),
        h("p", { class: "error" }, `Not authorized to describe group "${route.group}" (its ACLs).`));
    } else {
      document.getElementById("updated").textContent = `refresh failed: ${e.message}`;
    }
  }
  if (!state.paused) state.timer = setTimeout(refresh, REFRESH_MS);
}

let soon = null;
function refreshSoon() { clearTimeout(soon); soon = setTimeout(refresh, 120); }

window.addEventListener("hashchange", () => { if (currentRoute().list) app.replaceChildren(); refresh(); });
document.addEventListener("visibilitychange", () => { if (!document.hidden && !state.paused) refresh(); });
document.getElementById("pause").addEventListener("click", (e) => {
  state.paused = !state.paused;
  e.target.textContent = state.paused ? "Resume" : "Pause";
  if (state.paused) clearTimeout(state.timer); else refresh();
});
refresh();
