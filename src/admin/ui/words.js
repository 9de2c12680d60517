// ---- words: one time format, plurals, a selection and an audit row said in words ----

const plural = (n, one, many) => n + " " + (n === 1 ? one : (many || one + "s"));
const pad2 = (n) => String(n).padStart(2, "0");

// One time format everywhere: the browser's local date and time to the second, then how long
// ago; the exact RFC 3339 instant is the tooltip.
function clock(ts) {
  const d = new Date(ts);
  if (!ts || isNaN(d)) return ts ? String(ts) : "–";
  return d.getFullYear() + "-" + pad2(d.getMonth() + 1) + "-" + pad2(d.getDate()) + " " +
    pad2(d.getHours()) + ":" + pad2(d.getMinutes()) + ":" + pad2(d.getSeconds());
}
const when = (ts) => ts ? el("time", { datetime: ts, title: ts }, clock(ts) + " (" + ago(ts) + ")") : "–";
const whenText = (ts) => ts ? clock(ts) + " (" + ago(ts) + ")" : "–";

// A duration in the unit a person reads it in.
function span(ms) {
  const s = ms / 1000;
  if (s < 1) return Math.round(ms) + " ms";
  if (s < 90) return (s < 10 ? s.toFixed(1) : String(Math.round(s))) + " s";
  if (s < 5400) return Math.round(s / 60) + " min";
  if (s < 172800) return (s / 3600).toFixed(1) + " h";
  return Math.round(s / 86400) + " d";
}

const letterLinks = (ids) => ids.length <= 5
  ? ids.flatMap((id, i) => [i ? ", " : "", el("a", { href: "#/message/" + id }, "#" + id)])
  : [plural(ids.length, "letter")];

// What a replay, a drop or a job selected, as a sentence.
function selectionWords(rec) {
  if (!rec || typeof rec !== "object") return "–";
  if (rec.edit_of != null) return "letter #" + rec.edit_of + " with its " + ((rec.changed || []).join(" and ") || "content") +
    " edited, sent as the new message " + rec.message_id;
  const f = rec.filter && typeof rec.filter === "object" ? rec.filter : rec;
  const p = [];
  if (Array.isArray(f.ids) && f.ids.length) p.push(f.ids.length <= 5 ? "letters " + f.ids.map(i => "#" + i).join(", ") : plural(f.ids.length, "chosen letter"));
  else p.push((f.status || "new") + " letters");
  if (f.topic) p.push("of topic " + f.topic);
  if (f.group) p.push("dead-lettered by group " + f.group);
  if (f.error_group) p.push("with the cause “" + f.error_group + "”");
  if (f.error_contains) p.push("whose error contains “" + f.error_contains + "”");
  if (f.kind) p.push("of kind " + f.kind);
  if (f.since) p.push("failed since " + clock(f.since));
  if (f.until) p.push("before " + clock(f.until));
  if (rec.all) p.push("(all of them: no filter)");
  if (rec.to) p.push("sent to " + rec.to + " instead of their own topic");
  return p.join(" ");
}

// One audit row as a sentence with links to the job and the letters it names.
function auditWords(a) {
  const f = a.filter || {};
  const m = /^replay job (\d+)$/.exec(a.reason || "");
  const job = f.job != null ? f.job : m ? Number(m[1]) : null;
  const jobLink = job != null ? el("a", { href: "#/job/" + job, class: "job-link" }, "job #" + job) : "";
  const ids = a.dead_letter_ids || [];
  const n = a.count;
  switch (a.action) {
    case "replay": return ["replayed ", plural(n, "letter"), " (", selectionWords(f), ") as ", jobLink];
    case "drop": return ["dropped ", plural(n, "letter"), ": ", ...letterLinks(ids)];
    case "restore": return ["restored ", plural(n, "dropped letter"), " to new: ", ...letterLinks(ids)];
    case "archive-purge": return ["purged ", plural(n, "settled letter"), " from the archive"];
    case "requeue": return ["put ", plural(n, "failed outbox row"), " back to pending"];
    case "requeue-sent": return ["put ", plural(n, "sent outbox row"), " back to pending (re-publish)"];
    case "breaker-open": return ["opened the breaker of ", String(f.dependency), " for group ", String(f.group)];
    case "breaker-close": return ["closed the breaker of ", String(f.dependency), " for group ", String(f.group)];
    case "job-pause": return ["paused ", jobLink, " (", plural(n, "letter"), " unsent)"];
    case "job-resume": return ["resumed ", jobLink, " (", plural(n, "letter"), " to send)"];
    case "job-cancel": return ["cancelled ", jobLink, " (", plural(n, "unsent letter"), " stay new)"];
    case "edit-retry": return ["edited ", ...letterLinks(ids), " and retried it as message ", String(f.message_id), " through ", jobLink];
    default: return [a.action + " of ", plural(n, "item")];
  }
}

async function viewAudit() {
  const rows = await api("/api/dlq/audit");
  return [el("h2", {}, "Audit log"), el("table", { id: "audit", class: "stack" },
    el("tr", {}, el("th", {}, "When"), el("th", {}, "Who"), el("th", {}, "What"), el("th", {}, "Reason"), el("th", {}, "Via")),
    rows.map(a => el("tr", { "data-audit": String(a.id), "data-action": a.action },
      el("td", { "data-label": "When" }, when(a.at)), el("td", { "data-label": "Who" }, a.actor),
      el("td", { class: "err audit-what", "data-label": "What" }, ...auditWords(a)),
      el("td", { "data-label": "Reason" }, a.reason && !/^replay job \d+$/.test(a.reason) ? a.reason : "–"),
      el("td", { class: "muted", "data-label": "Via" }, a.via))))];
}
