// ---- replay jobs: the list, one job's page, and an operator's pause, resume and cancel ----

let jobsTimer = null;
const ACTIVE_JOB = ["running", "pending"];

// Pause, resume or cancel, each with the reason the audit log keeps.
function jobActionDialog(j, what) {
  const reason = el("input", { id: "job-reason", size: "50", placeholder: "why (required, audited)" });
  const left = plural(j.pending, "letter");
  const [title, says, go] = {
    pause: ["Pause replay job #" + j.id, "The runner stops after the letters in flight; " + left +
      " wait. Resume continues where it stopped.", "Pause the job"],
    resume: j.canary_failed
      ? ["Resume replay job #" + j.id + " anyway", "Its canary failed (" + j.status_reason + "): the cause is not fixed. " +
        "Resuming sends the remaining " + left + " into the same failure; they will most likely come back to the DLQ.", "Resume anyway"]
      : ["Resume replay job #" + j.id, "The runner sends the remaining " + left + " at up to " + j.rate + " msg/s.", "Resume the job"],
    cancel: ["Cancel replay job #" + j.id, "The " + plural(j.pending, "unsent letter") + " stay new (replay or drop them later); " +
      "what was sent stays sent. A cancelled job cannot be resumed.", "Cancel the job"],
  }[what];
  modal(title, [el("p", { class: what === "resume" && j.canary_failed ? "warn" : "", id: "job-action-says" }, says), field("Reason", reason)], go, async () => {
    if (!reason.value.trim()) throw new Error("a reason is required");
    await api("/api/dlq/jobs/" + j.id + "/" + what, { method: "POST", body: { reason: reason.value.trim() } });
    flash("Job " + j.id + " " + { pause: "paused", resume: "resumed", cancel: "cancelled" }[what] + ".");
    route();
  }, { ready: () => reason.value.trim() !== "", watch: [reason] });
}

// The actions a job offers. After a failed canary, Cancel is the advice and comes first;
// resuming is still possible, named for what it is.
function jobActions(j) {
  if (!can("operator")) return [];
  const b = (cls, what, text) => el("button", { class: cls + " job-" + what, onclick: () => jobActionDialog(j, what) }, text);
  if (j.canary_failed) return [b("primary danger", "cancel", "Cancel (recommended)"), " ", b("", "resume", "Resume anyway")];
  const out = [];
  if (ACTIVE_JOB.includes(j.status)) out.push(b("", "pause", "Pause"), " ");
  if (["paused", "pending"].includes(j.status)) out.push(b("", "resume", "Resume"), " ");
  if (["running", "pending", "paused"].includes(j.status)) out.push(b("danger", "cancel", "Cancel"));
  return out;
}

const progressBar = (j) => {
  const done = j.sent + j.failed + j.skipped;
  return [el("div", { class: "progress" }, el("div", { style: "width:" + (j.total ? Math.round(100 * done / j.total) : 0) + "%" })),
    el("span", { class: "muted" }, done + " / " + j.total)];
};

async function viewJobs() {
  const jobs = await api("/api/dlq/jobs");
  const t = el("table", { id: "jobs", class: "stack" },
    el("tr", {}, el("th", {}, "Job"), el("th", {}, "Status"), el("th", {}, "Progress"), el("th", { class: "num" }, "Sent"),
      el("th", { class: "num" }, "Failed"), el("th", { class: "num" }, "Came back"), el("th", {}, "By"), el("th", {}, "Created"), el("th", {}, "")),
    jobs.map(j => el("tr", { "data-job": String(j.id) },
      el("td", { "data-label": "Job" }, el("a", { href: "#/job/" + j.id, class: "job-link" }, "#" + j.id)),
      el("td", { class: "job-status", "data-label": "Status" }, j.canary_failed ? el("span", { class: "pill bad" }, "canary failed") : j.status,
        el("div", { class: "muted" }, j.status_reason || "")),
      el("td", { "data-label": "Progress" }, ...progressBar(j)),
      el("td", { class: "num", "data-label": "Sent" }, String(j.sent)), el("td", { class: "num", "data-label": "Failed" }, String(j.failed)),
      el("td", { class: "num", "data-label": "Came back" }, String(j.came_back)), el("td", { "data-label": "By" }, j.created_by),
      el("td", { "data-label": "Created" }, when(j.created_at)),
      el("td", { class: "actions" }, ...jobActions(j)))));
  // A pending job is about to run (its runner has not marked it running yet, which under load
  // can take longer than this render): follow it too, or the view would stop at "pending".
  jobsTimer = null;
  if (jobs.some(j => ACTIVE_JOB.includes(j.status))) jobsTimer = setTimeout(route, 1000);
  return [el("h2", {}, "Replay jobs"), jobs.length ? t : el("p", { class: "muted" }, "No replay jobs yet.")];
}

// One job: what it selected in words, its options, its timeline with durations, each letter
// and what became of it, and the comeback each one became.
async function viewJob(id) {
  const base = "/api/dlq/jobs/" + encodeURIComponent(id);
  const [j, events, items] = await Promise.all([api(base), api(base + "/events"), api(base + "/items?limit=200")]);
  const advice = j.canary_failed ? el("div", { class: "banner bad error", id: "canary-advice" },
    el("p", {}, "The canary failed: " + j.status_reason.replace(/^canary: /, "") + ". The cause is not fixed. " +
      "Cancel this job (recommended), fix the consumer or edit the letters, then replay again. Resuming sends the remaining " +
      plural(j.pending, "letter") + " into the same failure."), el("p", {}, ...jobActions(j))) : "";
  const facts = [
    ["Status", el("span", { id: "job-status" }, j.status + (j.status_reason ? " — " + j.status_reason : ""))],
    ["Selection", el("span", { id: "job-selection" }, selectionWords(j.filter))],
    ["Options", "up to " + j.rate + " msg/s; " + (j.canary ? "a canary of " + plural(j.canary, "letter") + " first, then a wait of " +
      span(j.canary_wait_ms) + " for comebacks" : "no canary") + "; stops when more than " + Math.round(100 * j.max_refail) + " % come back"],
    ["Created", [when(j.created_at), " by " + j.created_by]],
    ["Progress", progressBar(j)],
    ["Letters", el("span", { id: "job-counts" }, plural(j.total, "letter") + ": " + j.sent + " sent, " + j.pending + " pending, " + j.failed +
      " failed, " + j.skipped + " skipped; " + plural(j.came_back, "comeback"))],
  ];
  // The timeline: created, then every status the job took, each with the time since the last.
  const steps = [{ at: j.created_at, status: "created", reason: "by " + j.created_by }, ...events];
  const timeline = el("table", { id: "job-timeline", class: "stack" }, el("tr", {}, el("th", {}, "When"), el("th", {}, "After"), el("th", {}, "Status"), el("th", {}, "Why")),
    steps.map((e, i) => el("tr", { "data-status": e.status }, el("td", { "data-label": "When" }, when(e.at)),
      el("td", { class: "num", "data-label": "After" }, i ? "+" + span(Date.parse(e.at) - Date.parse(steps[i - 1].at)) : "–"),
      el("td", { "data-label": "Status" }, e.status), el("td", { class: "err", "data-label": "Why" }, e.reason || "–"))));
  const rows = el("table", { id: "job-items", class: "stack" },
    el("tr", {}, el("th", { class: "num" }, "#"), el("th", {}, "Letter"), el("th", {}, "State"), el("th", {}, "Sent"), el("th", {}, "Came back as"), el("th", {}, "Cause")),
    items.map(it => el("tr", { "data-letter": String(it.letter), "data-state": it.state },
      el("td", { class: "num", "data-label": "#" }, String(it.seq)),
      el("td", { "data-label": "Letter" }, el("a", { href: "#/message/" + it.letter }, "#" + it.letter), it.edited ? el("span", { class: "pill" }, "edited") : ""),
      el("td", { "data-label": "State" }, it.state + (it.error ? " — " + it.error : "")),
      el("td", { "data-label": "Sent" }, when(it.sent_at)),
      el("td", { class: "err", "data-label": "Came back as" }, it.came_back_as ? [el("a", { href: "#/message/" + it.came_back_as, class: "comeback" }, "#" + it.came_back_as),
        " " + (it.came_back_error || "")] : "–"),
      el("td", { class: "err", "data-label": "Cause" }, (it.kind ? it.kind + ": " : "") + (it.cause || "–")))));
  jobsTimer = ACTIVE_JOB.includes(j.status) ? setTimeout(route, 1000) : null;
  return [el("h2", { id: "job-title" }, "Replay job #" + j.id), advice,
    j.canary_failed ? "" : el("p", { id: "job-actions" }, ...jobActions(j)),
    el("table", { id: "job-facts" }, facts.map(([k, v]) => el("tr", {}, el("th", {}, k), el("td", {}, v)))),
    el("h2", {}, "Timeline"), timeline,
    el("h2", {}, "Letters"), rows,
    items.length < j.total ? el("p", { class: "muted" }, "The first " + items.length + " of " + plural(j.total, "letter") + " are shown.") : ""];
}
