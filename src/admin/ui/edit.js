// ---- edit and retry: the poison letter no code fix will make valid, corrected by hand ----

// Headers as the editor shows them: one "name: value" per line ("name" alone for a null).
const headersText = (hs) => hs.filter(h => h[2] !== "binary").map(([k, v]) => v == null ? k : k + ": " + v).join("\n");
function parseHeaders(text) {
  const out = [];
  for (const [i, line] of text.split("\n").entries()) {
    if (!line.trim()) continue;
    const at = line.indexOf(":");
    const name = (at < 0 ? line : line.slice(0, at)).trim();
    if (!name) throw new Error("header line " + (i + 1) + " has no name");
    out.push([name, at < 0 ? null : line.slice(at + 1).trim()]);
  }
  return out;
}

async function viewEdit(id) {
  const e = await api("/api/dlq/messages/" + encodeURIComponent(id) + "/editable");
  const m = await api("/api/dlq/messages/" + encodeURIComponent(id));
  const original = e.body_text;
  const body = el("textarea", { id: "edit-body", rows: "16", spellcheck: "false" });
  body.value = original;
  const bodyError = el("p", { class: "error", id: "edit-body-error" });
  const heads = el("textarea", { id: "edit-headers", rows: "5", spellcheck: "false" });
  heads.value = headersText(e.headers);
  const binary = e.headers.filter(h => h[2] === "binary").map(h => h[0]);
  const reason = el("input", { id: "edit-reason", size: "50", placeholder: "why (required, audited)" });
  const go = el("button", { class: "primary", id: "edit-send", type: "submit" }, "Send as a new message");
  const formError = el("p", { class: "error", id: "edit-error" });
  // JSON is checked as the operator types; the server checks it again, and against the
  // topic's schema when it has one.
  const check = () => {
    let ok = true;
    try { JSON.parse(body.value); bodyError.textContent = ""; } catch (x) { bodyError.textContent = "Not valid JSON: " + x.message; ok = false; }
    go.disabled = !ok || !reason.value.trim() || m.status === "dropped";
  };
  body.addEventListener("input", check);
  reason.addEventListener("input", check);
  const form = el("form", { id: "edit-form", onsubmit: async (ev) => {
    ev.preventDefault();
    formError.textContent = "";
    go.disabled = true;
    try {
      const headersChanged = heads.value.trim() !== headersText(e.headers).trim();
      const r = await api("/api/dlq/messages/" + e.letter + "/edit-retry", { method: "POST", body: {
        body_text: body.value, headers: headersChanged ? parseHeaders(heads.value) : undefined, reason: reason.value.trim() } });
      flash("Letter #" + e.letter + " edited and sent as message " + r.message_id + " (job " + r.job.id + ").");
      location.hash = "#/job/" + r.job.id;
    } catch (x) { formError.textContent = x.message; check(); }
  } },
    el("div", { class: "sidebyside" },
      el("div", {}, el("h3", {}, "As it failed"), el("pre", { id: "edit-original" }, original || "(empty)"),
        el("p", { class: "err muted" }, m.error || "")),
      el("div", {}, el("h3", {}, "Edited"), body, bodyError)),
    el("h3", {}, "Headers"), heads,
    binary.length ? el("p", { class: "muted" }, "Binary headers (" + binary.join(", ") + ") are kept unless you edit the headers.") : "",
    field("Reason", reason), formError, el("p", {}, go, " ", el("a", { href: "#/message/" + e.letter }, "Back to the letter")));
  check();
  return [el("h2", { id: "edit-title" }, "Edit and retry dead letter #" + e.letter),
    el("p", {}, "The edited letter goes to " + e.topic + " as a new message (a new message id; x-edited-from names " +
      (e.message_id || "the original") + "). The letter itself stays as it failed; both are in the audit log." +
      (e.format === "schema" ? " Its body is decoded through schema " + e.schema_id + " and encoded again on send." : "")),
    form];
}
