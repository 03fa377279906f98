// The dtask dashboard: one page over /api/v1, with the same token as any API call. No build
// step; every value from the server goes into the page as text, never as HTML.
"use strict";

const API = "/api/v1";
const KEY = "dtask-token";
const TICK = 1000; // ms between refreshes: at most one API round per second
const view = document.getElementById("view");
let page = null;
let ticking = false;

const token = () => sessionStorage.getItem(KEY);

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") node.className = v;
    else if (k === "style" && v) {
      // through the CSSOM: the page's Content-Security-Policy refuses style attributes
      for (const rule of v.split(";")) {
        const [name, value] = rule.split(":");
        if (value !== undefined) node.style.setProperty(name.trim(), value.trim());
      }
    }
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else if (v !== null && v !== undefined && v !== false) node.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) {
    if (c !== null && c !== undefined) node.append(c instanceof Node ? c : String(c));
  }
  return node;
}

async function api(path, options = {}) {
  const headers = { Authorization: `Bearer ${token()}` };
  if (options.body !== undefined) headers["Content-Type"] = "application/json";
  const reply = await fetch(API + path, {
    method: options.method || "GET",
    headers,
    body: options.body === undefined ? undefined : JSON.stringify(options.body),
  });
  const text = await reply.text();
  const data = text ? JSON.parse(text) : null;
  if (reply.status === 401) showLogin("That token was refused: paste a valid one.");
  if (!reply.ok) {
    const error = new Error((data && data.error) || `HTTP ${reply.status}`);
    error.status = reply.status;
    error.fields = data && data.fields;
    throw error;
  }
  return data;
}

// ---- formatting
const seconds = (s) => (s < 90 ? `${Math.round(s)} s` : s < 5400 ? `${Math.round(s / 60)} min` : `${(s / 3600).toFixed(1)} h`);
const since = (iso) => (Date.now() - Date.parse(iso)) / 1000;
const when = (iso) => (iso ? new Date(iso).toLocaleString() : "—");
const badge = (state) => el("span", { class: `state ${state}` }, state);

function trigger(run) {
  if (run.schedule) return `schedule ${run.schedule} @ ${run.slot}`;
  if (run.key && !run.key.startsWith("adhoc:")) return `key ${run.key}`;
  return "ad hoc";
}

function duration(run) {
  const end = run.finished_at ? Date.parse(run.finished_at) : Date.now();
  return seconds((end - Date.parse(run.created_at)) / 1000);
}

function upstreams(run) {
  if (!run.after.length) return "none";
  const shown = run.after.slice(0, 20).map((id) => el("a", { href: `#/runs/${id}`, class: run.waiting_for.includes(id) ? "waiting-for" : "" }, `#${id}`));
  const more = run.after.length > 20 ? ` and ${run.after.length - 20} more` : "";
  return el("span", { id: "run-after" }, ...shown.flatMap((a, i) => (i ? [", ", a] : [a])), more);
}

function progress(run, width) {
  const c = run.children;
  const bar = el("div", { class: "bar", style: width ? `width:${width}` : null });
  if (!c.total) {
    const why = run.state === "waiting" ? `waiting for ${run.waiting_for.length} upstream run(s)` : ["failed", "cancelled"].includes(run.state) ? "no children" : "splitting…";
    return el("div", { class: "pct" }, bar, el("small", {}, why));
  }
  const share = (n) => `${(100 * n) / c.total}%`;
  const done = c.succeeded + c.failed;
  bar.append(
    el("span", { style: `width:${share(c.succeeded)}` }),
    el("span", { class: "fail", style: `left:${share(c.succeeded)};width:${share(c.failed)}` }),
    el("span", { class: "run", style: `left:${share(done)};width:${share(c.running)}` }),
  );
  const pct = Math.floor((100 * done) / c.total);
  return el("div", { class: "pct", "data-pct": pct }, bar, el("small", {}, `${pct} % (${done}/${c.total})`));
}

function table(headings, rows) {
  return el("table", {}, el("thead", {}, el("tr", {}, headings.map((h) => el("th", {}, h)))), el("tbody", {}, rows));
}

function replace(node, ...children) {
  node.replaceChildren(...children.flat().filter((c) => c !== null && c !== undefined));
}

// ---- alerts, on every page
async function refreshAlerts() {
  const box = document.getElementById("alerts");
  const alerts = await api("/alerts");
  replace(box, alerts.map((a) => el("div", { class: "alert", "data-kind": a.kind, "data-subject": a.subject },
    el("b", {}, a.kind.replaceAll("_", " ")), a.message, el("span", { class: "muted" }, ` · open for ${seconds(since(a.opened_at))}`))));
}

// ---- runs
function runsPage() {
  const form = el("form", { class: "submit", id: "submit-form" });
  const templates = el("select", { id: "submit-template", name: "template" });
  const variables = el("textarea", { id: "submit-variables", name: "variables", spellcheck: "false" }, "{}");
  const key = el("input", { id: "submit-key", name: "key", placeholder: "key (optional)" });
  const priority = el("input", { id: "submit-priority", name: "priority", type: "number", min: 0, max: 9, placeholder: "priority" });
  const problem = el("p", { id: "submit-error", class: "error" });
  form.append(templates, variables, key, priority, el("button", { class: "primary", type: "submit" }, "Submit run"), problem);
  const known = {};
  templates.addEventListener("change", () => { variables.value = JSON.stringify(known[templates.value] || {}); });
  api("/templates").then((found) => {
    for (const t of found) {
      known[t.name] = Object.fromEntries(Object.entries(t.params).map(([n, p]) => [n, p.default ?? null]));
      templates.append(el("option", { value: t.name }, t.name));
    }
    templates.dispatchEvent(new Event("change"));
  });
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    problem.textContent = "";
    let parsed;
    try { parsed = JSON.parse(variables.value || "{}"); } catch (e) { problem.textContent = `variables: not JSON (${e.message})`; return; }
    const body = { template: templates.value, variables: parsed };
    if (key.value) body.key = key.value;
    if (priority.value !== "") body.priority = Number(priority.value);
    try {
      const run = await api("/runs", { method: "POST", body });
      location.hash = `#/runs/${run.id}`;
    } catch (e) {
      problem.textContent = e.fields ? Object.values(e.fields).join("; ") : e.message;
    }
  });
  const filter = el("select", { id: "state-filter" }, ["", "waiting", "pending", "splitting", "running", "succeeded", "failed", "cancelled"].map((s) => el("option", { value: s }, s || "every state")));
  const body = el("tbody");
  replace(view, el("h2", {}, "Runs"), el("div", { class: "card" }, el("h3", { style: "margin-top:0" }, "New run"), form),
    el("p", {}, filter), el("table", { id: "runs" }, el("thead", {}, el("tr", {}, ["Run", "State", "Template", "Client", "Trigger", "Progress", "Duration", "Created"].map((h) => el("th", {}, h)))), body));
  filter.addEventListener("change", () => tick());
  return {
    async refresh() {
      const state = filter.value ? `&state=${filter.value}` : "";
      const { runs } = await api(`/runs?limit=50${state}`);
      replace(body, runs.map((r) => el("tr", { class: "link", "data-run": r.id, onclick: () => { location.hash = `#/runs/${r.id}`; } },
        el("td", {}, `#${r.id}`), el("td", {}, badge(r.state)), el("td", {}, r.template), el("td", {}, r.client),
        el("td", { class: "muted" }, trigger(r)), el("td", {}, progress(r)), el("td", {}, duration(r)), el("td", { class: "muted" }, when(r.created_at)))));
    },
  };
}

// ---- one run
const COLOURS = { waiting: "#e6e8ec", pending: "#c9ced6", running: "#3d7be0", succeeded: "#2e9e5b", failed: "#d64545" };

function drawGrid(canvas, grid) {
  const width = canvas.clientWidth || 1000;
  const n = Math.max(grid.total, 1);
  const cell = Math.max(1, Math.min(16, Math.floor(Math.sqrt((width * 360) / n))));
  const columns = Math.max(1, Math.floor(width / cell));
  const rows = Math.ceil(n / columns);
  canvas.width = columns * cell;
  canvas.height = rows * cell;
  canvas.style.height = `${rows * cell}px`;
  canvas.style.width = `${columns * cell}px`;
  const g = canvas.getContext("2d");
  const gap = cell >= 6 ? 1 : 0;
  let i = 0;
  for (const [state, count] of grid.runs) {
    g.fillStyle = COLOURS[state] || "#999";
    for (let k = 0; k < count; k++, i++) {
      g.fillRect((i % columns) * cell, Math.floor(i / columns) * cell, cell - gap, cell - gap);
    }
  }
  canvas.dataset.drawn = String(i);
  canvas.dataset.cell = String(cell);
  canvas.dataset.columns = String(columns);
}

function runPage(id) {
  const head = el("div", { class: "card", id: "run" });
  const canvas = el("canvas", { id: "grid" });
  const tip = el("p", { class: "muted", id: "grid-tip" }, "Each cell is a child, in index order: hover for its index.");
  const failed = el("div", { id: "failed" });
  const logs = el("div", { id: "child-logs" });
  const which = el("input", { id: "log-child", type: "number", min: "0", value: "0", style: "width:6em" });
  async function showLogs(index) {
    which.value = index;
    try {
      const { attempts } = await api(`/runs/${id}/children/${index}/logs`);
      replace(logs, attempts.length ? attempts.map((a) => el("div", { class: "attempt", "data-attempt": a.attempt, "data-state": a.state },
        el("h4", {}, `Child ${a.index}, attempt ${a.attempt} · ${a.worker || "no worker"} · ${a.state}${a.skipped ? ` · ${a.skipped.toLocaleString()} earlier characters not kept` : ""}`),
        a.error ? el("pre", { class: "error" }, a.error) : null,
        el("pre", { class: "log" }, a.output || "(printed nothing)"))) : el("p", { class: "muted" }, `Child ${index} has no output kept yet.`));
    } catch (e) {
      replace(logs, el("p", { class: "error" }, e.message));
    }
  }
  const logCard = el("div", { class: "card" }, el("h3", { style: "margin-top:0" }, "Child logs"),
    el("form", { id: "log-form", onsubmit: (event) => { event.preventDefault(); showLogs(Number(which.value)); } }, "Child ", which, " ", el("button", { type: "submit" }, "Show")), logs);
  const legend = el("div", { class: "legend" }, Object.entries(COLOURS).map(([s, c]) => el("span", {}, el("i", { style: `background:${c}` }), s)));
  replace(view, el("h2", {}, `Run #${id}`), head, el("div", { class: "card" }, el("h3", { style: "margin-top:0" }, "Children"), legend, canvas, tip), failed, logCard);
  let drawnFor = "";
  let drawnAt = 0;
  let failedFor = -1;
  canvas.addEventListener("mousemove", (event) => {
    const cell = Number(canvas.dataset.cell || 0);
    if (!cell) return;
    const index = Math.floor(event.offsetY / cell) * Number(canvas.dataset.columns) + Math.floor(event.offsetX / cell);
    if (index < Number(canvas.dataset.drawn)) tip.textContent = `child ${index}: click for its logs`;
  });
  canvas.addEventListener("click", (event) => {
    const cell = Number(canvas.dataset.cell || 0);
    if (!cell) return;
    const index = Math.floor(event.offsetY / cell) * Number(canvas.dataset.columns) + Math.floor(event.offsetX / cell);
    if (index < Number(canvas.dataset.drawn)) showLogs(index);
  });
  async function act(action) {
    try { await api(`/runs/${id}/${action}`, { method: "POST" }); } catch (e) { alert(e.message); }
    tick();
  }
  return {
    async refresh() {
      let run;
      try {
        run = await api(`/runs/${id}`);
      } catch (e) {
        if (e.status === 404) replace(head, el("p", { class: "error", id: "run-missing" }, e.message));
        throw e;
      }
      const fact = (label, value) => el("div", {}, el("label", {}, label), value);
      replace(head,
        el("div", { class: "facts" },
          fact("State", el("span", { id: "run-state" }, badge(run.state))), fact("Template", run.template), fact("Client", run.client),
          fact("Trigger", trigger(run)), fact("Priority / tier", `${run.priority} / ${run.tier}`),
          fact("Created", when(run.created_at)), fact("Finished", when(run.finished_at)), fact("Duration", duration(run)),
          fact("Deadline", run.deadline ? `${when(run.deadline)}${run.late ? " (late)" : ""}` : "none"),
          fact("Notify", run.notify ? `${run.notify.state} (${run.notify.attempts} tries)` : "none"),
          fact("After", upstreams(run))),
        el("h3", {}, "Progress"), progress(run, "100%"),
        run.waiting_because ? el("p", { class: "why", id: "run-why", "data-reason": run.waiting_reason }, el("strong", {}, "Why it waits: "), run.waiting_because) : null,
        el("h3", {}, "Variables"), el("code", {}, JSON.stringify(run.variables)),
        run.error ? el("pre", { class: "error", id: "run-error" }, run.error) : null,
        el("div", { class: "actions" },
          el("button", { class: "danger", id: "cancel", disabled: ["succeeded", "failed", "cancelled"].includes(run.state), onclick: () => act("cancel") }, "Cancel"),
          el("button", { class: "danger", id: "terminate", title: "Cancel, and kill the process of a running child that has not stopped within DTASK_EXECUTION_CAP_GRACE", disabled: ["succeeded", "failed", "cancelled"].includes(run.state), onclick: () => act("cancel?terminate=true") }, "Cancel and stop children"),
          el("button", { id: "rerun", disabled: !["failed", "cancelled"].includes(run.state), onclick: () => act("rerun") }, "Rerun")));
      // A big grid costs the database about 1 ms per 1,000 children: redrawn at most every
      // total/20 ms (5 s at 100,000) while the run moves, and at once when it ends.
      const seen = JSON.stringify([run.state, run.children]);
      const due = Date.now() - drawnAt >= Math.min(10000, run.children.total / 20);
      if (seen !== drawnFor && (due || run.finished_at)) {
        drawnAt = Date.now();
        drawGrid(canvas, await api(`/runs/${id}/grid`));
        drawnFor = seen;
      }
      if (run.children.failed !== failedFor) {
        const asked = failedFor = run.children.failed;
        const { children } = await api(`/runs/${id}/children?state=failed&limit=100`);
        if (asked !== failedFor) return; // a later refresh asked again: its answer is drawn, not this older one
        replace(failed, children.length ? el("div", { class: "card" }, el("h3", { style: "margin-top:0" }, `Failed children (${run.children.failed})`),
          table(["Child", "Range", "Attempts", "Worker", "Error"], children.map((c) => {
            const full = el("pre", { class: "error", hidden: true }, c.error || "");
            return el("tr", { class: "link failed-child", "data-index": c.index, onclick: () => { full.hidden = !full.hidden; showLogs(c.index); } },
              el("td", {}, c.index), el("td", {}, el("code", {}, JSON.stringify(c.spec))), el("td", {}, `${c.attempt}/${c.max_attempts}`),
              el("td", { class: "muted" }, c.worker || "—"), el("td", {}, el("span", { class: "error" }, (c.error || "").trim().split("\n").pop()), full));
          }))) : null);
      }
    },
  };
}

// ---- schedules, workers, clients
function listPage(title, id, load, headings, row, empty) {
  const body = el("tbody");
  const note = el("p", { class: "muted" });
  replace(view, el("h2", {}, title), note, el("table", { id }, el("thead", {}, el("tr", {}, headings.map((h) => el("th", {}, h)))), body));
  return {
    async refresh() {
      try {
        const found = await load();
        note.textContent = found.length ? "" : empty;
        replace(body, found.map(row));
      } catch (e) {
        if (e.status !== 403) throw e;
        note.textContent = "Only an admin token sees this page (dtask token create --admin).";
      }
    },
  };
}

const schedulesPage = () => listPage("Schedules", "schedules", () => api("/schedules"),
  ["Name", "Template", "When", "Enabled", "Next five", "Latest runs", "Error"],
  (s) => el("tr", { "data-schedule": s.name }, el("td", {}, s.name), el("td", {}, s.template),
    el("td", {}, s.cron ? `cron ${s.cron} (${s.tz})` : `every ${s.every} s`), el("td", {}, s.enabled ? "yes" : "paused"),
    el("td", { class: "muted" }, s.next_slots.map((t) => el("div", {}, when(t)))),
    el("td", {}, s.latest_runs.map((r) => el("div", {}, el("a", { href: `#/runs/${r.id}` }, `#${r.id}`), " ", badge(r.state)))),
    el("td", { class: "error" }, s.last_error || "")),
  "No schedules yet: dtask schedule add NAME TEMPLATE --cron '...'");

const workersPage = () => listPage("Workers", "workers", () => api("/workers"),
  ["Worker", "Queues", "Slots", "Busy", "Idle for", "Last heartbeat", "Up since"],
  (w) => el("tr", { "data-worker": w.name }, el("td", {}, w.name), el("td", { class: "muted" }, w.queues.join(", ")), el("td", {}, w.slots),
    el("td", {}, el("div", { class: "pct" }, el("div", { class: "bar busy-bar" }, el("span", { class: "run", style: `width:${(100 * w.busy) / Math.max(w.slots, 1)}%` })), el("small", {}, `${w.busy}/${w.slots}`))),
    el("td", {}, w.idle_for === null ? "busy" : seconds(w.idle_for)), el("td", {}, `${w.seen_ago} s ago`), el("td", { class: "muted" }, when(w.started_at))),
  "No worker is reporting: start one with dtask worker (or dtask up).");

const clientsPage = () => listPage("Clients", "clients", () => api("/clients"),
  ["Client", "Rate", "Child rate", "Max running", "Weight", "Tier", "Max priority", "Active runs", "Running children", "In rate window"],
  (c) => el("tr", { "data-client": c.name }, el("td", {}, c.name), el("td", {}, c.rate || "—"), el("td", {}, c.child_rate || "—"),
    el("td", {}, c.max_running ?? "—"), el("td", {}, c.weight), el("td", {}, c.tier), el("td", {}, c.max_priority),
    el("td", {}, c.usage ? c.usage.active_runs : 0), el("td", {}, c.usage ? c.usage.running_children : 0),
    el("td", { class: "muted" }, c.usage && "runs_in_window" in c.usage ? `${c.usage.runs_in_window} runs` : "—")),
  "");

// ---- routing, refresh, login
const ROUTES = [
  [/^#\/runs\/(\d+)$/, (m) => runPage(Number(m[1])), "runs"],
  [/^#\/schedules$/, schedulesPage, "schedules"],
  [/^#\/workers$/, workersPage, "workers"],
  [/^#\/clients$/, clientsPage, "clients"],
  [/.*/, runsPage, "runs"],
];

function route() {
  if (!token()) return showLogin("");
  for (const [pattern, make, nav] of ROUTES) {
    const match = location.hash.match(pattern);
    if (!match) continue;
    page = make(match);
    document.querySelectorAll("[data-nav]").forEach((a) => a.classList.toggle("active", a.dataset.nav === nav));
    break;
  }
  tick();
}

async function tick() {
  if (ticking || !token() || !page) return;
  ticking = true;
  try {
    await Promise.all([refreshAlerts(), page.refresh()]);
    document.body.dataset.refreshed = String(Date.now());
  } catch (e) {
    console.warn("refresh failed:", e.message);
  } finally {
    ticking = false;
  }
}

function showLogin(message) {
  sessionStorage.removeItem(KEY);
  document.getElementById("login").hidden = false;
  document.getElementById("login-error").textContent = message;
  document.getElementById("logout").hidden = true;
}

document.getElementById("login-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  sessionStorage.setItem(KEY, document.getElementById("token").value.trim());
  try {
    const me = await api("/me");
    document.getElementById("who").textContent = `${me.client}${me.admin ? " (admin)" : ""}`;
    document.getElementById("login").hidden = true;
    document.getElementById("logout").hidden = false;
    document.getElementById("token").value = "";
    route();
  } catch (e) {
    showLogin(e.status === 401 ? "That token was refused: paste a valid one." : e.message);
  }
});

document.getElementById("logout").addEventListener("click", () => { showLogin(""); replace(view); });
window.addEventListener("hashchange", route);
setInterval(tick, TICK);
if (token()) {
  api("/me").then((me) => {
    document.getElementById("who").textContent = `${me.client}${me.admin ? " (admin)" : ""}`;
    document.getElementById("logout").hidden = false;
    route();
  }).catch(() => {});
} else {
  showLogin("");
}
