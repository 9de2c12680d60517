// The outbox dashboard: plain JavaScript, no build step. Every call goes to the admin API with
// the bearer token kept in sessionStorage; the server enforces roles, the page only hides
// buttons a viewer could not use anyway.
"use strict";

const $ = (sel, el = document) => el.querySelector(sel);
const el = (tag, attrs = {}, ...kids) => {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    // Through the CSSOM: the server's Content-Security-Policy refuses inline style attributes.
    else if (k === "style") e.style.cssText = v;
    else if (v !== undefined && v !== null && v !== false) e.setAttribute(k, v === true ? "" : v);
  }
  for (const k of kids.flat()) e.append(k instanceof Node ? k : document.createTextNode(k ?? ""));
  return e;
};
let me = null;

async function api(path, opts = {}) {
  const token = sessionStorage.getItem("outbox-token") || "";
  const res = await fetch(path, {
    method: opts.method || "GET",
    headers: Object.assign({ Authorization: "Bearer " + token },
      opts.body ? { "Content-Type": "application/json" } : {}),
    body: opts.body ? JSON.stringify(opts.body) : undefined,
  });
  let data = null;
  try { data = await res.json(); } catch (_) { /* not JSON */ }
  if (res.status === 401) { showLogin("Sign in: the token was missing or wrong."); throw new Error("unauthorized"); }
  if (!res.ok) throw new Error((data && data.error) || res.status + " " + res.statusText);
  return data;
}

function flash(msg, bad) {
  const f = $("#flash");
  f.replaceChildren(el("p", { class: bad ? "error" : "okmsg", id: "flash-msg" }, msg));
  setTimeout(() => { if (f.firstChild && f.firstChild.textContent === msg) f.replaceChildren(); }, 8000);
}

function ago(ts) {
  if (!ts) return "–";
  const s = Math.max(0, (Date.now() - Date.parse(ts)) / 1000);
  if (s < 90) return Math.round(s) + " s ago";
  if (s < 5400) return Math.round(s / 60) + " min ago";
  if (s < 172800) return Math.round(s / 3600) + " h ago";
  return Math.round(s / 86400) + " d ago";
}
const age = (secs) => secs == null ? "–" : ago(new Date(Date.now() - secs * 1000).toISOString()).replace(" ago", "");
const can = (role) => me && ["viewer", "operator", "admin"].indexOf(me.role) >= ["viewer", "operator", "admin"].indexOf(role);

function showLogin(msg) {
  $("#login").hidden = false;
  $("#login-error").textContent = msg || "";
  $("#view").replaceChildren();
}

async function signIn(ev) {
  ev.preventDefault();
  sessionStorage.setItem("outbox-token", $("#token").value.trim());
  await start();
}

async function start() {
  try {
    me = await api("/api/whoami");
  } catch (e) {
    if (e.message !== "unauthorized") showLogin(e.message);
    return;
  }
  $("#login").hidden = true;
  $("#who").replaceChildren(me.holder + " (" + me.role + ") ",
    el("button", { id: "sign-out", onclick: signOut }, "Sign out"));
  route();
}

function signOut() {
  sessionStorage.removeItem("outbox-token");
  me = null;
  $("#who").replaceChildren();
  $("#token").value = "";
  showLogin("Signed out.");
}

// ---- modal: confirmation with inputs ----
// `opts.ready` says whether the confirmation may be given yet (the button stays disabled
// until then), re-checked whenever one of `opts.watch` changes.
function modal(title, body, confirmText, onConfirm, opts = {}) {
  const box = $("#modal-box");
  const err = el("p", { class: "error", id: "modal-error" });
  const ready = opts.ready || (() => true);
  const go = el("button", { class: "primary", id: "modal-confirm", onclick: async () => {
    go.disabled = true;
    try { await onConfirm(); closeModal(); } catch (e) { err.textContent = e.message; go.disabled = !ready(); }
  } }, confirmText);
  const recheck = () => { go.disabled = !ready(); };
  for (const w of opts.watch || []) { w.addEventListener("input", recheck); w.addEventListener("change", recheck); }
  recheck();
  box.replaceChildren(el("h2", {}, title), ...body, err,
    el("div", { class: "row" }, go, el("button", { id: "modal-cancel", onclick: closeModal }, "Close")));
  $("#modal").classList.add("open");
}
function closeModal() { $("#modal").classList.remove("open"); }
const field = (label, input) => el("div", { class: "row" }, el("label", {}, label), input);

// ---- replay / drop of a selection ----
// What a replay alone cannot fix, per kind of letter in the selection.
const KIND_RISK = {
  decode: (n) => plural(n, "decode letter") + ": the bytes fail the same way again unless the consumer's decoding changed (or edit them: Edit and retry).",
  permanent: (n) => plural(n, "permanent letter") + ": the handler refused them; they succeed only once its fix is deployed.",
  panic: (n) => plural(n, "panic letter") + ": the handler crashed on them; they succeed only once its fix is deployed.",
};

// The confirmation is written for this selection: how many letters, which causes and groups,
// where they go, and what the canary will do; the button stays disabled until every risk is
// ticked.
async function replayDialog(selection, label) {
  const dry = await api("/api/dlq/replay", { method: "POST", body: Object.assign({ dry_run: true }, selection) });
  const rate = el("input", { id: "replay-rate", type: "number", value: "100", min: "1" });
  // Every selection of more than one letter sends a canary first: a small group is where
  // "replay before the fix" is likeliest and cheapest to catch.
  const canary = el("input", { id: "replay-canary", type: "number", min: "0",
    value: String(dry.count > 1 ? Math.min(10, Math.max(1, Math.ceil(dry.count / 10))) : 0) });
  const named = (pairs, what) => pairs.filter(([k]) => k).map(([k, n]) => (pairs.length > 1 ? n + " " : "") + what(k)).join(", ");
  const causes = named(dry.by_cause || [], (c) => "“" + c + "”");
  const groups = named(dry.by_group || [], (g) => g);
  const targets = dry.by_topic.map(([t, n]) => (dry.by_topic.length > 1 ? n + " to " : "to ") + t).join(", ");
  const says = el("p", { id: "replay-says" }, plural(dry.count, "letter") + (groups ? " dead-lettered by " + groups : "") +
    (causes ? ", cause " + causes : "") + ", will be sent back " + (targets || "to their topics") + "." +
    (dry.skipped_loop_guard ? " " + plural(dry.skipped_loop_guard, "letter") + " skipped: already replayed 3 times." : ""));
  const canarySays = el("p", { id: "replay-canary-says", class: "muted" });
  const explain = () => {
    const c = Math.min(Number(canary.value) || 0, dry.count);
    canarySays.textContent = c > 0
      ? "The canary: " + (c === 1 ? "the first letter goes" : "the first " + c + " letters go") + " alone, then the job waits 30 s. " +
        "If any comes back to the DLQ, the job pauses and the other " + plural(Math.max(0, dry.count - c), "letter") +
        " stay new; the job's page then advises cancelling."
      : "No canary: all " + plural(dry.count, "letter") + " go at once, at the rate below.";
  };
  canary.addEventListener("input", explain);
  explain();
  const risky = (dry.risky_kinds || []).filter(([k]) => KIND_RISK[k]);
  const confirmKinds = el("input", { id: "replay-confirm-kinds", type: "checkbox" });
  const confirmOld = el("input", { id: "replay-accept-duplicates", type: "checkbox" });
  const confirmOrder = el("input", { id: "replay-confirm-order", type: "checkbox" });
  const risks = [];
  if (dry.passed_by_newer) risks.push(el("p", { class: "warn", id: "replay-risk-order" },
    el("label", {}, confirmOrder, " " + plural(dry.passed_by_newer, "letter") + " (" +
      dry.passed_sample.map(i => "#" + i).join(" ") + ") have newer messages of their key already handled by their group: " +
      "replayed, each lands behind them and may undo newer state. Tick to replay anyway (it is audited).")));
  if ((dry.risky_kinds || []).length) risks.push(el("div", { class: "warn", id: "replay-risk-kinds" },
    ...risky.map(([k, n]) => el("p", { "data-kind": k }, KIND_RISK[k](n))),
    el("label", {}, confirmKinds, " The fix for these letters is deployed.")));
  if (dry.older_than_marks) risks.push(el("p", { class: "warn", id: "replay-risk-old" },
    el("label", {}, confirmOld, " " + plural(dry.older_than_marks, "letter") + " are older than the consumers keep processed marks: " +
      "a group that already handled them would handle them again. Tick to accept that (it is audited).")));
  const ready = () => dry.count > 0 && (!(dry.risky_kinds || []).length || confirmKinds.checked) && (!dry.older_than_marks || confirmOld.checked) &&
    (!dry.passed_by_newer || confirmOrder.checked);
  modal("Replay " + label, [
    says, ...risks,
    el("p", { class: "muted" }, "The selection is frozen now; letters arriving later are not part of this job."),
    field("Rate (msg/s)", rate),
    field("Canary", canary), canarySays,
  ], "Replay " + plural(dry.count, "letter"), async () => {
    if (!ready()) throw new Error(dry.count ? "tick every risk above first" : "nothing to replay");
    const job = await api("/api/dlq/replay", { method: "POST", body: Object.assign({
      rate: Number(rate.value), canary: Number(canary.value), canary_wait_secs: 30,
      confirm_kinds: confirmKinds.checked, accept_duplicates: confirmOld.checked, confirm_order: confirmOrder.checked }, selection) });
    flash("Replay job " + job.id + " started (" + plural(job.pending, "letter") + ").");
    location.hash = "#/job/" + job.id;
  }, { ready, watch: [confirmKinds, confirmOld, confirmOrder] });
}

function restoreDialog(selection, label) {
  const reason = el("input", { id: "restore-reason", size: "50", placeholder: "why (required, audited)" });
  modal("Restore " + label, [
    el("p", {}, "The selected dropped letters go back to new: they can be replayed or dropped again."),
    el("label", {}, "Reason ", reason),
  ], "Restore", async () => {
    if (!reason.value.trim()) throw new Error("a reason is required");
    const r = await api("/api/dlq/restore", { method: "POST", body: Object.assign({ reason: reason.value }, selection) });
    flash(plural(r.restored, "letter") + " restored to new.");
    route();
  });
}

function dropDialog(selection, label, count) {
  const reason = el("input", { id: "drop-reason", size: "50", placeholder: "why (required, audited)" });
  modal("Drop " + label, [
    el("p", {}, (count != null ? plural(count, "new letter") : "The selected letters") + " will be marked dropped. They stay in the archive until retention."),
    field("Reason", reason),
  ], "Drop", async () => {
    if (!reason.value.trim()) throw new Error("a reason is required");
    const r = await api("/api/dlq/drop", { method: "POST", body: Object.assign({ reason: reason.value }, selection) });
    flash(plural(r.dropped, "letter") + " dropped.");
    route();
  });
}

// ---- views ----
// ---- the system at a glance: outbox, relays, consumers, breakers, archiver ----
const secsText = (v) => v == null ? "–" : (v < 90 ? Math.round(v) + " s" : v < 5400 ? Math.round(v / 60) + " min" : Math.round(v / 3600) + " h");
const stateText = (st) => Object.entries(st || {}).filter(([k]) => k !== "lag")
  .map(([k, v]) => k + ": " + (typeof v === "object" ? JSON.stringify(v) : String(v))).join(", ");
// The verdicts of an overview: the navigation's badge (parts not ok) and a lookup by tile.
function showVerdicts(o) {
  const bad = o.verdicts.filter(v => v.level === "bad").length;
  const notOk = o.verdicts.filter(v => v.level !== "ok");
  const b = $("#nav-badge");
  b.hidden = !notOk.length;
  b.className = bad ? "bad" : "warn";
  b.textContent = notOk.length ? notOk.length + (bad ? " wrong" : " to look at") : "";
  b.title = notOk.map(v => v.says).join("\n");
  const level = {};
  for (const v of o.verdicts) level[v.tile] = v.level;
  return (tile) => level[tile] || "";
}

async function overviewStrip() {
  const o = await api("/api/overview");
  const alive = (kind) => o.instances.filter(i => i.kind === kind && i.alive);
  const count = (st) => (o.outbox.counts.find(c => c.status === st) || { count: 0 }).count;
  const secs = secsText;
  const groups = {};
  for (const i of alive("consumer")) (groups[i.name] = groups[i.name] || []).push(i);
  const consumerRows = Object.entries(groups).map(([g, members]) => {
    const lag = members.reduce((n, m) => n + Object.values(m.state.lag || {}).reduce((a, b) => a + b, 0), 0);
    const modes = [...new Set(members.map(m => m.state.mode))].join(", ");
    const paused = members.reduce((n, m) => n + (m.state.paused_partitions || 0), 0);
    const parts = members.flatMap(m => Object.entries(m.state.lag || {}).map(([p, l]) => p + ": " + l)).join(", ");
    return el("tr", { "data-consumer": g }, el("td", {}, el("a", { href: "#/system?show=consumers&group=" + encodeURIComponent(g) }, g)), el("td", { class: "num" }, String(members.length)),
      el("td", { class: "mode" }, modes), el("td", { class: "num" }, String(paused)),
      el("td", { class: "num", title: parts }, String(lag)));
  });
  const breakerRows = o.outbox.open_breakers.map(b => el("tr", { "data-breaker": b.consumer_group + "/" + b.dependency },
    el("td", {}, b.consumer_group), el("td", {}, b.dependency), el("td", {}, "open, closes in " + secs(b.closes_in_secs)),
    el("td", {}, can("operator") ? el("button", { class: "close-breaker", onclick: () => closeBreakerDialog(b.consumer_group, b.dependency) }, "Close") : "")));
  for (const u of o.untrusted) breakerRows.push(el("tr", {}, el("td", {}, u.consumer_group), el("td", {}, u.dependency),
    el("td", {}, "expired, probing" + (u.probe_by ? " (" + u.probe_by + ")" : "")), el("td", {}, "")));
  const verdict = showVerdicts(o);
  // What is wrong, in words: the worst first.
  const banners = o.verdicts.filter(v => v.level !== "ok").sort((a, b) => (b.level === "bad") - (a.level === "bad"))
    .map(v => el("p", { class: "banner " + v.level + (v.level === "bad" ? " error" : ""),
      id: v.tile === "archiver" ? "archiver-banner" : "banner-" + v.tile }, v.says));
  const card = (id, title, ...body) => el("div", { class: "card tile " + verdict(id.replace("tile-", "")), id }, el("h3", {}, title), ...body);
  return el("div", { id: "overview" }, ...banners, el("div", { class: "tiles" },
    card("tile-outbox", "Outbox", el("p", {}, count("pending") + " pending, " + count("failed") + " failed"),
      el("p", { class: "muted" }, "oldest pending " + secs(o.outbox.oldest_pending_age_secs)),
      el("a", { href: "#/outbox" }, "details")),
    card("tile-relays", "Relays", el("p", {}, alive("relay").length + " alive"), el("a", { href: "#/system?show=relays" }, "details")),
    card("tile-consumers", "Consumers", consumerRows.length ? el("table", { id: "consumers" },
      el("tr", {}, el("th", {}, "Group"), el("th", { class: "num" }, "Replicas"), el("th", {}, "Mode"),
        el("th", { class: "num" }, "Paused"), el("th", { class: "num" }, "Lag")), consumerRows) : el("p", { class: "muted" }, "none running"),
      el("a", { href: "#/system?show=consumers" }, "details")),
    card("tile-breakers", "Circuit breakers", breakerRows.length ? el("table", { id: "breakers" }, breakerRows) : el("p", { class: "muted" }, "all closed"),
      el("a", { href: "#/system?show=breakers" }, "details")),
    card("tile-archiver", "DLQ archiver", el("p", {}, o.archiver.alive + " alive"),
      el("p", { class: "muted" }, o.archiver.last_seen_secs == null ? "never seen in the last hour"
        : "last seen " + secs(o.archiver.last_seen_secs) + " ago"), el("a", { href: "#/system?show=archivers" }, "details"))));
}

// ---- the tiles' details: every process, every partition's lag, every breaker ----

// The handled count per group at the last render of the system view: throughput is the
// difference to the next one.
const handledBefore = {};
async function viewSystem(params) {
  const o = await api("/api/overview");
  showVerdicts(o);
  const seen = (i) => el("td", { class: i.alive || i.stopped ? "" : "error" },
    (i.alive ? "alive, seen " : i.stopped ? "stopped cleanly " : "gone, seen ") + secsText(i.seen_secs_ago) + " ago");
  const processes = (kind, id, empty) => {
    const rows = o.instances.filter(i => i.kind === kind);
    return rows.length ? el("table", { id }, el("tr", {}, el("th", {}, "Instance"), el("th", {}, "Name"), el("th", {}, "Heartbeat"), el("th", {}, "State")),
      rows.map(i => el("tr", { "data-instance": i.instance }, el("td", {}, i.instance), el("td", {}, i.name), seen(i), el("td", { class: "err" }, stateText(i.state)))))
      : el("p", { class: "muted" }, empty);
  };
  // One card per consumer group: its replicas, then each partition's lag and who reads it.
  const names = [...new Set(o.instances.filter(i => i.kind === "consumer").map(i => i.name))]
    .filter(g => !params.get("group") || g === params.get("group"));
  const now = Date.now();
  const groups = names.map(g => {
    const members = o.instances.filter(i => i.kind === "consumer" && i.name === g);
    const live = members.filter(m => m.alive);
    const lag = live.flatMap(m => Object.entries(m.state.lag || {}).map(([p, l]) => [p, l, m.instance, (m.state.lag_secs || {})[p]]))
      .sort((a, b) => a[0].localeCompare(b[0], undefined, { numeric: true }));
    // Main topics' lag and the retry topics' backlog apart: a backlog waiting for its delay is
    // not a consumer falling behind.
    const isRetry = (p) => /\.retry-\d+[smh]\//.test(p);
    const mainLag = lag.filter(x => !isRetry(x[0])).reduce((n, x) => n + x[1], 0);
    const backlog = lag.filter(x => isRetry(x[0])).reduce((n, x) => n + x[1], 0);
    const oldest = Math.max(0, ...lag.filter(x => !isRetry(x[0]) && x[3] != null).map(x => x[3]));
    // Throughput from the handled counts of two refreshes in a row.
    const handled = live.reduce((n, m) => n + (m.state.handled || 0), 0);
    const prev = handledBefore[g];
    handledBefore[g] = [now, handled];
    const rate = prev && now > prev[0] && handled >= prev[1] ? (handled - prev[1]) / ((now - prev[0]) / 1000) : null;
    const stats = el("p", { class: "group-stats", "data-stats": g },
      el("span", { class: "stat-lag" }, "Lag " + plural(mainLag, "message") + (mainLag ? ", the oldest waiting up to " + secsText(oldest) : "")), " · ",
      el("span", { class: "stat-backlog" }, "retry backlog " + plural(backlog, "message")), " · ",
      el("span", { class: "stat-rate" }, rate == null ? "throughput: measuring (next refresh)" : "throughput " + (rate < 10 ? rate.toFixed(1) : Math.round(rate)) + " msg/s"));
    return el("div", { class: "card", "data-group": g }, el("h3", {}, g), stats,
      el("table", { class: "members" }, el("tr", {}, el("th", {}, "Replica"), el("th", {}, "Mode"), el("th", { class: "num" }, "Paused partitions"),
        el("th", { class: "num" }, "In flight"), el("th", { class: "num" }, "Handled"), el("th", { class: "num" }, "Dead-lettered"), el("th", {}, "Heartbeat")),
        members.map(m => el("tr", {}, el("td", {}, m.instance), el("td", { class: "mode" }, String(m.state.mode ?? "–")),
          el("td", { class: "num" }, String(m.state.paused_partitions ?? "–")), el("td", { class: "num" }, String(m.state.in_flight ?? "–")),
          el("td", { class: "num" }, String(m.state.handled ?? "–")), el("td", { class: "num" }, String(m.state.dead_lettered ?? "–")), seen(m)))),
      lag.length ? el("table", { class: "lag" }, el("tr", {}, el("th", {}, "Partition"), el("th", { class: "num" }, "Lag"), el("th", { class: "num" }, "Oldest waits"), el("th", {}, "Read by")),
        lag.map(([p, l, who, secs]) => el("tr", {}, el("td", {}, p), el("td", { class: "num" }, String(l)),
          el("td", { class: "num" }, secs == null ? "–" : secsText(secs)), el("td", {}, who))))
        : el("p", { class: "muted" }, "no partitions assigned"));
  });
  const breakers = el("table", { id: "breaker-list" },
    el("tr", {}, el("th", {}, "Group"), el("th", {}, "Dependency"), el("th", {}, "State"), el("th", {}, "Why"), el("th", { class: "num" }, "Opens"), el("th", {}, "")),
    o.outbox.open_breakers.map(b => el("tr", { "data-breaker": b.consumer_group + "/" + b.dependency },
      el("td", {}, b.consumer_group), el("td", {}, b.dependency), el("td", {}, "open, closes in " + secsText(b.closes_in_secs) +
        (b.opened_by ? "; opened by " + b.opened_by : "") + (b.opened_secs_ago != null ? ", " + secsText(b.opened_secs_ago) + " ago" : "")),
      el("td", { class: "err" }, b.reason || "–"), el("td", { class: "num" }, String(b.generation)),
      el("td", {}, can("operator") ? el("button", { class: "close-breaker", onclick: () => closeBreakerDialog(b.consumer_group, b.dependency) }, "Close") : ""))),
    o.untrusted.map(u => el("tr", {}, el("td", {}, u.consumer_group), el("td", {}, u.dependency),
      el("td", {}, "expired, probing" + (u.probe_by ? " (" + u.probe_by + ")" : "")), el("td", {}, "–"), el("td", {}, ""), el("td", {}, ""))));
  const sections = [
    el("section", { id: "sys-relays" }, el("h2", {}, "Relays"), processes("relay", "relay-list", "No relay has checked in within the hour: nothing publishes the outbox.")),
    el("section", { id: "sys-consumers" }, el("h2", {}, "Consumer groups"), groups.length ? groups : el("p", { class: "muted" }, "No consumer has checked in within the hour.")),
    el("section", { id: "sys-breakers" }, el("h2", {}, "Circuit breakers"),
      o.outbox.open_breakers.length + o.untrusted.length ? breakers : el("p", { class: "muted", id: "no-breakers" }, "All closed."),
      can("operator") ? el("p", {}, el("button", { id: "open-breaker", onclick: openBreakerDialog }, "Open a breaker…")) : ""),
    el("section", { id: "sys-archivers" }, el("h2", {}, "DLQ archivers"), processes("archiver", "archiver-list", "No archiver has checked in within the hour.")),
  ];
  const show = params.get("show");
  if (show) setTimeout(() => { const s = document.getElementById("sys-" + show); if (s) s.scrollIntoView(); }, 0);
  return [el("h2", {}, "System"), ...sections];
}

// A breaker protects only what its group calls: the group and the dependency are chosen from
// what live replicas declare in their heartbeats; anything else is typed and confirmed.
async function openBreakerDialog() {
  const o = await api("/api/overview");
  const declared = {};
  for (const i of o.instances.filter(i => i.kind === "consumer")) {
    const deps = Array.isArray(i.state && i.state.dependencies) ? i.state.dependencies : [];
    declared[i.name] = [...new Set([...(declared[i.name] || []), ...deps])].sort();
  }
  const group = el("select", { id: "open-group" }, Object.keys(declared).sort().map(g => el("option", { value: g }, g)));
  const dependency = el("select", { id: "open-dependency" });
  const fill = () => dependency.replaceChildren(...(declared[group.value] || []).map(d => el("option", { value: d }, d)));
  group.addEventListener("change", fill);
  fill();
  const other = el("input", { id: "open-other", type: "checkbox" });
  const otherGroup = el("input", { id: "open-other-group", placeholder: "consumer group" });
  const otherDep = el("input", { id: "open-other-dependency", placeholder: "dependency" });
  const typed = el("div", { id: "open-typed", hidden: true }, field("Group", otherGroup), field("Dependency", otherDep),
    el("p", { class: "error" }, "No live replica declares this: a misspelt name protects nothing."));
  other.addEventListener("change", () => { typed.hidden = !other.checked; });
  const minutes = el("input", { id: "open-minutes", type: "number", value: "5", min: "1" });
  const reason = el("input", { id: "open-reason", size: "50", placeholder: "why (required, audited)" });
  modal("Open a circuit breaker", [
    el("p", {}, "Every replica of the group stops calling the dependency: new messages wait parked (not retried, not dead-lettered) until it closes or you close it."),
    Object.keys(declared).length ? "" : el("p", { class: "muted" }, "No consumer replica has checked in within the hour."),
    field("Group", group), field("Dependency", dependency),
    el("p", {}, el("label", {}, other, " Another group or dependency (no live replica declares it)")), typed,
    field("Minutes", minutes), field("Reason", reason),
  ], "Open breaker", async () => {
    const g = other.checked ? otherGroup.value.trim() : group.value;
    const d = other.checked ? otherDep.value.trim() : dependency.value;
    if (!g || !d) throw new Error("choose the group and the dependency");
    if (!reason.value.trim()) throw new Error("a reason is required");
    await api("/api/breakers/open", { method: "POST", body: { group: g, dependency: d,
      reason: reason.value, open_for_secs: Math.round(Number(minutes.value) * 60), confirm: other.checked } });
    flash("Breaker of " + d + " for " + g + " opened.");
    route();
  });
}

function closeBreakerDialog(group, dependency) {
  const reason = el("input", { id: "breaker-reason", size: "50", placeholder: "why (required, audited)" });
  modal("Close the breaker of " + dependency + " for " + group, [
    el("p", {}, "Every replica of " + group + " trusts " + dependency + " again at once (no probe): it drains its parked letters, then resumes."),
    el("label", {}, "Reason ", reason),
  ], "Close breaker", async () => {
    if (!reason.value.trim()) throw new Error("a reason is required");
    await api("/api/breakers/close", { method: "POST", body: { group, dependency, reason: reason.value } });
    flash("Breaker of " + dependency + " for " + group + " closed.");
    route();
  });
}

async function viewGroups() {
  const strip = await overviewStrip();
  const s = await api("/api/dlq/summary");
  const held = (await api("/api/holds")).holds;
  // Strict per-key order: each held key, its head (the letter to replay or drop), how many
  // wait behind it, since when.
  const holds = el("table", { id: "holds" },
    el("tr", {}, el("th", {}, "Group"), el("th", {}, "Topic"), el("th", {}, "Key"), el("th", {}, "Waiting for"),
      el("th", { class: "num" }, "Held behind it"), el("th", {}, "Since"), el("th", {}, "State")),
    held.map(h => el("tr", { class: "hold" },
      el("td", {}, h.group), el("td", {}, h.topic),
      el("td", { class: "key" }, h.key === null ? "(hidden)" : h.key),
      el("td", {}, h.head_letter ? el("a", { href: "#/message/" + h.head_letter, class: "head" }, "#" + h.head_letter)
        : (h.head_message_id || "?"), el("div", { class: "muted" }, h.head_message_id || "")),
      el("td", { class: "num waiting" }, String(h.waiting)),
      el("td", {}, age(h.age_secs), el("div", { class: "muted" }, h.since)),
      el("td", {}, el("span", { class: "pill" }, h.state), h.released_reason ? el("div", { class: "muted" }, h.released_reason) : ""))));
  const topics = el("table", { id: "topics" },
    el("tr", {}, el("th", {}, "Topic"), el("th", {}, "Group"), el("th", { class: "num" }, "New"),
      el("th", { class: "num" }, "Replayed"), el("th", { class: "num" }, "Dropped"), el("th", {}, "Oldest new")),
    s.topics.map(t => el("tr", {},
      el("td", {}, t.original_topic), el("td", {}, t.consumer_group || "–"),
      el("td", { class: "num" }, String(t.new)), el("td", { class: "num" }, String(t.replayed)),
      el("td", { class: "num" }, String(t.dropped)), el("td", {}, age(t.oldest_new_age_secs)))));
  const groups = el("table", { id: "groups", class: "stack" },
    el("tr", {}, el("th", { class: "num" }, "Count"), el("th", {}, "Cause"), el("th", {}, "Kind"),
      el("th", {}, "Topic / group"), el("th", {}, "First seen"), el("th", {}, "Last seen"),
      el("th", {}, "Sample"), el("th", {}, "")),
    s.groups.map((g, i) => {
      const sel = { error_group: g.error_group, topic: g.original_topic, group: g.consumer_group || undefined,
        kind: g.error_kind || undefined };
      return el("tr", { "data-group": String(i) },
        el("td", { class: "num count", "data-label": "Count" }, String(g.count)),
        el("td", { class: "err", "data-label": "Cause" }, g.error_group || "(no error text)",
          el("div", { class: "muted" }, g.example_error || "")),
        el("td", { "data-label": "Kind" }, el("span", { class: "pill" }, g.error_kind || "–")),
        el("td", { "data-label": "Topic / group" }, g.original_topic, el("div", { class: "muted" }, g.consumer_group || "")),
        el("td", { "data-label": "First seen" }, when(g.first_seen)),
        el("td", { "data-label": "Last seen" }, when(g.last_seen)),
        el("td", { "data-label": "Sample" }, el("a", { href: "#/message/" + g.example_id, class: "sample" }, "#" + g.example_id)),
        el("td", { class: "actions" },
          el("a", { href: "#/messages?" + new URLSearchParams(Object.entries(Object.assign({ status: "new" }, sel)).filter(([, v]) => v)) }, "list"), " ",
          // A decode letter's bytes fail the same way again: replaying is not the main action.
          can("operator") ? el("button", { class: g.error_kind === "decode" ? "replay-group" : "primary replay-group",
            onclick: () => replayDialog(sel, "this group") }, g.error_kind === "decode" ? "Replay (needs a consumer fix)" : "Replay group") : "",
          " ",
          can("operator") ? el("button", { class: "danger drop-group", onclick: () => dropDialog(sel, "this group", g.count) }, "Drop group") : ""));
    }));
  // Letters of a fleet's tenants (their x-tenant header): where one tenant's failures pile up.
  const tenants = el("table", { id: "tenants" },
    el("tr", {}, el("th", {}, "Tenant"), el("th", { class: "num" }, "New"),
      el("th", { class: "num" }, "Replayed"), el("th", { class: "num" }, "Dropped"), el("th", {}, "Oldest new"), el("th", {}, "")),
    (s.tenants || []).map(t => el("tr", { class: "tenant" },
      el("td", { class: "name" }, t.tenant),
      el("td", { class: "num new" }, String(t.new)), el("td", { class: "num" }, String(t.replayed)),
      el("td", { class: "num" }, String(t.dropped)), el("td", {}, age(t.oldest_new_age_secs)),
      el("td", { class: "actions" }, el("a", { href: "#/messages?" + new URLSearchParams({ tenant: t.tenant, status: "new" }) }, "list")))));
  return [
    strip,
    el("h2", {}, "Dead letters by topic"),
    s.topics.length ? topics : el("p", { class: "muted" }, "The archive is empty. Is `outbox dlq archive` running?"),
    el("h2", {}, "New dead letters grouped by cause"),
    s.groups.length ? groups : el("p", { class: "muted", id: "no-groups" }, "No new dead letters."),
    (s.tenants || []).length ? [el("h2", {}, "Dead letters by tenant"), tenants] : "",
    el("h2", {}, "Held keys (strict order)"),
    held.length ? holds : el("p", { class: "muted", id: "no-holds" }, "No key is held."),
  ];
}

async function viewMessages(params) {
  const form = el("form", { class: "filters", id: "filters" });
  const inputs = {};
  for (const [name, ph] of [["topic", "topic"], ["group", "group"], ["error_contains", "error contains"],
    ["kind", "kind"], ["tenant", "tenant"], ["status", "status (new, replayed, dropped)"], ["since", "since (2h, RFC 3339)"],
    ["until", "until (1h, RFC 3339)"]]) {
    inputs[name] = el("input", { name, placeholder: ph, value: params.get(name) || "" });
    form.append(inputs[name]);
  }
  form.append(el("button", { class: "primary", type: "submit" }, "Filter"));
  // The cause a group's "list" link filters by is shown, and can be removed.
  if (params.get("error_group")) {
    const rest = new URLSearchParams(params); rest.delete("error_group"); rest.delete("before_id");
    form.append(" ", el("span", { class: "chip", id: "cause-filter" }, "cause: " + params.get("error_group") + " ",
      el("a", { href: "#/messages?" + rest, id: "remove-cause", title: "remove this filter" }, "✕")));
  }
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    const q = new URLSearchParams();
    for (const [k, i] of Object.entries(inputs)) if (i.value.trim()) q.set(k, i.value.trim());
    if (params.get("error_group")) q.set("error_group", params.get("error_group"));
    if (params.get("order")) q.set("order", params.get("order"));
    location.hash = "#/messages?" + q;
  });
  const q = new URLSearchParams(params);
  if (!q.get("limit")) q.set("limit", "50");
  // A filter the server refuses (a typo in "since", an unknown status) is said beside the
  // form, which stays as typed: the view never blanks.
  let page;
  try { page = await api("/api/dlq/messages?" + q); }
  catch (e) {
    if (e.message === "unauthorized") throw e;
    return [el("h2", {}, "Dead letters"), form, el("p", { class: "error", id: "filter-error" }, "This filter does not work: " + e.message)];
  }
  const sel = {};
  for (const k of ["topic", "group", "error_contains", "error_group", "kind", "since", "until"]) if (params.get(k)) sel[k] = params.get(k);
  // Listing dropped letters offers their restore; every other action works on new letters.
  if (params.get("status") === "dropped") sel.status = "dropped";
  // Sorting by failure order, either way; each order pages with its own cursor.
  const oldest = params.get("order") === "oldest";
  const cursor = oldest ? "after_id" : "before_id";
  const more = [];
  if (page["next_" + cursor]) {
    const n = new URLSearchParams(params); n.set(cursor, page["next_" + cursor]);
    more.push(el("a", { href: "#/messages?" + n, id: "next-page" }, oldest ? "Newer →" : "Older →"));
  }
  if (params.get(cursor)) {
    const n = new URLSearchParams(params); n.delete(cursor);
    more.push(" ", el("a", { href: "#/messages?" + n }, oldest ? "↑ Oldest" : "↑ Newest"));
  }
  const flipped = new URLSearchParams(params);
  flipped.delete("before_id"); flipped.delete("after_id");
  if (oldest) flipped.delete("order"); else flipped.set("order", "oldest");
  const sortLink = el("a", { href: "#/messages?" + flipped, id: "sort-toggle", title: "change the order" },
    oldest ? "Failed ▲ (oldest first)" : "Failed ▼ (newest first)");
  // A fleet's letters name their tenant; the column is shown only where some letter has one.
  const tenanted = page.messages.some(m => m.tenant);
  const rows = el("table", { id: "messages" },
    el("tr", {}, el("th", {}, "Id"), el("th", {}, sortLink), el("th", {}, "Status"), el("th", {}, "Kind"),
      el("th", {}, "Topic"), el("th", {}, "Group"), tenanted ? el("th", {}, "Tenant") : "", el("th", {}, "Error")),
    page.messages.map(m => el("tr", {},
      el("td", {}, el("a", { href: "#/message/" + m.id }, "#" + m.id)),
      el("td", {}, when(m.failed_at)), el("td", {}, m.status),
      el("td", {}, m.error_kind || "–"), el("td", {}, m.original_topic), el("td", {}, m.consumer_group || "–"),
      tenanted ? el("td", { class: "tenant" }, m.tenant || "–") : "",
      el("td", { class: "err" }, m.error || ""))));
  // Actions need a narrowing filter: never "every letter" from one click.
  const actions = !Object.keys(sel).some(k => k !== "status") || !can("operator") ? "" : sel.status === "dropped"
    ? el("p", {}, el("button", { class: "primary", id: "restore-these", onclick: () => restoreDialog(sel, "the filtered letters") }, "Restore these (undo the drop)"))
    : el("p", {},
      el("button", { class: "primary", onclick: () => replayDialog(sel, "the filtered letters") }, "Replay these (new only)"), " ",
      el("button", { class: "danger", onclick: () => dropDialog(sel, "the filtered letters") }, "Drop these"));
  const total = el("p", { id: "match-count", class: "muted" }, page.total > 10000 ? "More than 10,000 letters match."
    : plural(page.total, "letter") + " match" + (page.total === 1 ? "es" : "") + (page.total > page.messages.length ? "; showing " + page.messages.length + " per page, " + (oldest ? "oldest" : "newest") + " first." : "."));
  return [el("h2", {}, "Dead letters"), form, total, actions, rows, el("p", {}, more)];
}

function bytesView(v) {
  if (v == null) return el("span", { class: "muted" }, "(none)");
  if (v.redacted) return el("span", { class: "muted" }, "(redacted for your role)");
  if (v.text != null) return el("pre", {}, v.text);
  return el("pre", {}, "(base64) " + v.base64);
}

async function viewMessage(id) {
  const m = await api("/api/dlq/messages/" + encodeURIComponent(id));
  const facts = [["Status", m.status + (m.status_reason ? " — " + m.status_reason : "")],
    ["Original", m.original_topic + " [" + (m.original_partition ?? "?") + "] @" + (m.original_offset ?? "?")],
    ["Consumer group", m.consumer_group], ["Kind", m.error_kind], ["Error", m.error],
    ["Attempts", m.attempts], ["DLQ retries", m.dlq_retries], ["First failed", whenText(m.first_failed_at)],
    ["Failed", whenText(m.failed_at)], ["Archived", whenText(m.archived_at)], ["Message id", m.message_id],
    ["Type", m.message_type], ["DLQ record", m.dlq_topic + " [" + m.partition + "] @" + m.offset],
    ["Times replayed", m.times_replayed]];
  const headers = el("table", { id: "headers" }, el("tr", {}, el("th", {}, "Header"), el("th", {}, "Value")),
    m.headers.map(h => el("tr", {}, el("td", {}, h.name),
      el("td", { class: "err" }, h.value == null ? "(null)" : h.value.redacted ? el("span", { class: "muted" }, "(redacted for your role)")
        : (h.value.text != null ? h.value.text : "(base64) " + h.value.base64)))));
  const sel = { ids: [m.id] };
  return [
    el("h2", { id: "message-title" }, "Dead letter #" + m.id),
    el("p", {}, el("a", { href: "#/trace?q=" + encodeURIComponent("#" + m.id), id: "trace-letter" }, "Its whole journey →")),
    can("operator") && m.status !== "dropped" ? el("p", {},
      el("button", { class: "primary", id: "replay-one", onclick: () => replayDialog(sel, "dead letter #" + m.id) }, "Replay"), " ",
      // The poison letter no code fix will make valid: corrected by hand, sent as a new message.
      el("a", { class: "button", id: "edit-one", href: "#/edit/" + m.id }, "Edit and retry"), " ",
      m.status === "new" ? el("button", { class: "danger", id: "drop-one", onclick: () => dropDialog(sel, "dead letter #" + m.id, 1) }, "Drop") : "") :
    can("operator") ? el("p", {},
      el("button", { class: "primary", id: "restore-one", onclick: () => restoreDialog(sel, "dead letter #" + m.id) }, "Restore (undo the drop)")) : "",
    el("table", { id: "facts" }, facts.map(([k, v]) => el("tr", {}, el("th", {}, k), el("td", { class: "err" }, v == null ? "–" : String(v))))),
    el("h2", {}, "Key"), bytesView(m.key),
    el("h2", {}, "Headers"), headers,
    el("h2", {}, "Body"), bytesView(m.body),
  ];
}

// ---- one message's journey: outbox → each group → dead letters → replays → audit ----
async function viewTrace(q) {
  const input = el("input", { id: "trace-q", size: "40", value: q, placeholder: "message id, key, #letter or an order number" });
  const form = el("form", { id: "trace-form", onsubmit: (ev) => { ev.preventDefault();
    location.hash = "#/trace?q=" + encodeURIComponent(input.value.trim()); } },
    input, " ", el("button", { class: "primary", type: "submit" }, "Trace"));
  const head = [el("h2", {}, "Trace a message"), form];
  if (!q) return head;
  const r = await api("/api/trace?q=" + encodeURIComponent(q));
  if (!r.messages.length) return [...head, el("p", { id: "trace-none" }, "Nothing found for " + q + ".")];
  const or = (v) => v == null ? "–" : String(v);
  // One message's journey as a timeline: every step in time order, with how long it took
  // since the step before and since the first.
  const journeys = r.messages.map(m => {
    const steps = [];
    const add = (at, kind, text) => steps.push({ at, kind, text });
    for (const o of m.outbox) {
      add(o.created_at, "committed", "outbox row #" + o.id + " → " + o.topic + " (key " + (o.key_redacted ? "hidden from viewers" : or(o.key)) + ")");
      if (o.sent_at) add(o.sent_at, "published", "by the relay after " + plural(o.attempts, "attempt"));
      else add(null, "outbox", "#" + o.id + " " + o.status + " after " + plural(o.attempts, "attempt") + (o.last_error ? " — " + o.last_error : ""));
    }
    if (!m.outbox.length) add(null, "outbox", "no row (cleaned up, or not published through the outbox)");
    for (const h of m.handled) add(h.at, "handled", h.group + " from " + h.topic);
    for (const h of m.holds || []) add(h.since, h.role === "held" ? "held" : "holding",
      h.role === "held" ? h.group + " behind " + (h.head || "?") : h.group + ": " + h.waiting + " waiting behind it");
    for (const l of m.dead_letters) add(l.failed_at, "dead-lettered", el("span", {},
      el("a", { href: "#/message/" + l.id }, "#" + l.id), " by " + or(l.group) + " (" + or(l.kind) + "): " + or(l.error) +
      " — now " + l.status + (l.status_reason ? " (" + l.status_reason + ")" : "") + (l.comeback_of ? " — came back from job " + l.comeback_of[0] : "")));
    for (const p of m.replays) add(p.sent_at || null, "replayed", el("span", {}, el("a", { href: "#/job/" + p.job }, "job " + p.job),
      " (" + p.job_status + ", by " + p.by + ") sent letter #" + p.letter + " — " + p.state + (p.came_back_as ? ", came back as #" + p.came_back_as : "")));
    for (const a of m.audit) add(a.at, "audit", a.action + " by " + a.actor + " via " + a.via + (a.reason ? " — " + a.reason : ""));
    const timed = steps.filter(x => x.at).sort((x, y) => Date.parse(x.at) - Date.parse(y.at));
    const ordered = [...timed, ...steps.filter(x => !x.at)];
    const first = timed.length ? Date.parse(timed[0].at) : null;
    return el("div", { class: "card journey" }, el("h3", {}, "Message " + or(m.message_id)),
      el("table", { class: "steps timeline stack" }, el("tr", {}, el("th", {}, "When"), el("th", {}, "After"), el("th", {}, "Total"), el("th", {}, "Step"), el("th", {}, "")),
        ordered.map((x, i) => el("tr", { "data-step": x.kind },
          el("td", { "data-label": "When" }, x.at ? clock(x.at) : "–"),
          el("td", { class: "num", "data-label": "After" }, x.at && i && ordered[i - 1].at ? "+" + span(Date.parse(x.at) - Date.parse(ordered[i - 1].at)) : "–"),
          el("td", { class: "num", "data-label": "Total" }, x.at && first != null ? span(Date.parse(x.at) - first) : "–"),
          el("th", {}, x.kind), el("td", { class: "err" }, x.text)))));
  });
  return [...head, el("p", { id: "trace-count" }, plural(r.messages.length, "message")), ...journeys];
}

async function viewOutbox() {
  const s = await api("/api/outbox/status");
  const counts = el("table", { id: "outbox-counts" }, el("tr", {}, el("th", {}, "Status"), el("th", { class: "num" }, "Rows"), el("th", {}, "Oldest")),
    s.counts.map(c => el("tr", {}, el("td", {}, c.status), el("td", { class: "num" }, String(c.count)), el("td", {}, when(c.oldest)))));
  const failed = el("table", {}, el("tr", {}, el("th", { class: "num" }, "Rows"), el("th", {}, "Ids"), el("th", {}, "Last error")),
    s.failed_by_error.map(g => el("tr", {}, el("td", { class: "num" }, String(g.count)), el("td", {}, g.min_id + "…" + g.max_id), el("td", { class: "err" }, g.last_error))));
  return [
    el("h2", {}, "Outbox"), counts,
    el("p", {}, "Oldest pending: ", el("strong", {}, s.oldest_pending_age_secs == null ? "none" : s.oldest_pending_age_secs.toFixed(1) + " s")),
    el("h2", {}, "Failed rows by error"),
    s.failed_by_error.length ? failed : el("p", { class: "muted" }, "No failed rows."),
    s.failed_by_error.length && can("operator") ? el("button", { class: "primary", onclick: () => modal("Requeue failed rows",
      [el("p", {}, "Every failed row goes back to pending. Fix the cause first.")], "Requeue", async () => {
        const r = await api("/api/outbox/requeue", { method: "POST", body: { failed: true } });
        flash(plural(r.requeued, "row") + " requeued."); route();
      }) }, "Requeue all failed") : "",
  ];
}

// Views of live state refresh while the tab is visible, and say when they last did: on-call
// must never look at a frozen picture without knowing it.
const REFRESH_MS = 5000;
let refreshTimer = null;
function scheduleRefresh(name) {
  clearTimeout(refreshTimer);
  if (!["groups", "system", "jobs", "outbox"].includes(name) || document.visibilityState !== "visible") return;
  refreshTimer = setTimeout(async () => {
    if (name === "groups") {
      // The strip alone: the cause list below keeps the operator's place.
      try {
        const strip = await overviewStrip();
        const old = $("#overview");
        if (old && document.body.dataset.ready === "groups") old.replaceWith(strip);
        stamp();
      } catch (e) { /* the next refresh tries again */ }
      scheduleRefresh("groups");
    } else route();
  }, REFRESH_MS);
}
function stamp() {
  $("#updated").textContent = "updated " + new Date().toLocaleTimeString([], { hour12: false });
}
document.addEventListener("visibilitychange", () => { if (document.visibilityState === "visible" && me) route(); });

let routeSeq = 0;
async function route() {
  clearTimeout(jobsTimer);
  clearTimeout(refreshTimer);
  if (!me) return;
  // A slow view must not overwrite the one the operator navigated to meanwhile.
  const seq = ++routeSeq;
  const h = location.hash.replace(/^#/, "") || "/";
  const [path, query] = h.split("?");
  const params = new URLSearchParams(query || "");
  let name = "groups", render;
  if (path.startsWith("/message/")) { name = "messages"; render = () => viewMessage(path.slice(9)); }
  else if (path.startsWith("/edit/")) { name = "messages"; render = () => viewEdit(path.slice(6)); }
  else if (path.startsWith("/job/")) { name = "jobs"; render = () => viewJob(path.slice(5)); }
  else if (path === "/messages") { name = "messages"; render = () => viewMessages(params); }
  else if (path === "/jobs") { name = "jobs"; render = viewJobs; }
  else if (path === "/outbox") { name = "outbox"; render = viewOutbox; }
  else if (path === "/audit") { name = "audit"; render = viewAudit; }
  else if (path === "/system") { name = "system"; render = () => viewSystem(params); }
  else if (path === "/trace") { name = "trace"; render = () => viewTrace(params.get("q") || ""); }
  else render = viewGroups;
  for (const a of document.querySelectorAll("nav a")) a.classList.toggle("active", a.dataset.view === name);
  try {
    const nodes = await render();
    if (seq !== routeSeq) return;
    $("#view").replaceChildren(...nodes.flat().filter(n => n !== ""));
    document.body.dataset.ready = name;
    stamp();
    // The jobs view follows a running job every second itself.
    if (!(name === "jobs" && jobsTimer)) scheduleRefresh(name);
  } catch (e) {
    if (seq === routeSeq && e.message !== "unauthorized") $("#view").replaceChildren(el("p", { class: "error", id: "view-error" }, e.message));
  }
}
