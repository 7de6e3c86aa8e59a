// The dashboard's only script (no build step). Text from the server is set with textContent,
// never as HTML. The session cookie goes along by itself (same origin); writes carry the page's
// CSRF token in a header.
"use strict";

function epochCells() {
  for (const el of document.querySelectorAll(".ts[data-epoch]")) {
    const s = parseFloat(el.dataset.epoch);
    if (!isNaN(s)) el.textContent = new Date(s * 1000).toISOString().replace(/\.\d+Z$/, "Z");
  }
}

function followList() {
  const rows = document.getElementById("task-rows");
  if (!rows) return;
  const params = new URLSearchParams(location.search);
  params.set("rows", "1");
  setInterval(async () => {
    const r = await fetch("/dashboard?" + params.toString(), { credentials: "same-origin" });
    if (r.ok) rows.innerHTML = await r.text(); // server-rendered, autoescaped rows
  }, 2000);
}

function followTask() {
  const root = document.getElementById("task");
  if (!root) return;
  const logs = document.getElementById("logs");
  const set = (id, text) => { const el = document.getElementById(id); if (el) el.textContent = text ?? ""; };
  const cancel = document.getElementById("cancel");
  if (cancel) {
    cancel.addEventListener("click", async () => {
      if (!confirm("Cancel task " + root.dataset.task + "? Its job is stopped.")) return;
      const r = await fetch("/dashboard/tasks/" + encodeURIComponent(root.dataset.task) + "/cancel", {
        method: "POST", credentials: "same-origin", headers: { "X-CSRF-Token": root.dataset.csrf },
      });
      const body = await r.json();
      set("cancel-result", r.ok ? (body.acknowledged ? "cancelling…" : body.message) : (body.message || body.error));
      if (r.ok) cancel.disabled = true;
    });
  }
  if (root.dataset.ended === "1") return;
  // The parts of the page a state change alters (artifacts, timeline, cost, times), taken from the
  // page as the server renders it now (autoescaped; a parsed document runs no script).
  const refresh = async () => {
    const r = await fetch(location.pathname, { credentials: "same-origin", headers: { accept: "text/html" } });
    if (!r.ok) return;
    const fresh = new DOMParser().parseFromString(await r.text(), "text/html");
    for (const id of ["artifacts", "timeline", "cost", "started", "completed", "attempt"]) {
      const here = document.getElementById(id), there = fresh.getElementById(id);
      if (here && there) here.replaceWith(document.importNode(there, true));
    }
  };
  let lastState = document.getElementById("state").textContent;
  const url = "/dashboard/tasks/" + encodeURIComponent(root.dataset.task) + "/stream?cursor=" +
    encodeURIComponent(root.dataset.cursor || "");
  const events = new EventSource(url);
  events.addEventListener("status", (e) => {
    const s = JSON.parse(e.data);
    const state = document.getElementById("state");
    state.textContent = s.state;
    state.className = "state state-" + s.state;
    if (s.percent != null) { document.getElementById("progress").value = s.percent; set("percent", Math.round(s.percent)); }
    set("message", s.message);
    if (s.error) set("error", s.error);
    const cost = document.getElementById("cost");
    cost.textContent = s.cost ?? "not recorded yet";
    cost.className = s.cost ? "" : "empty";
    if (s.state !== lastState) { lastState = s.state; refresh(); }
  });
  events.addEventListener("logs", (e) => {
    const stick = logs.scrollTop + logs.clientHeight >= logs.scrollHeight - 4;
    for (const ln of JSON.parse(e.data)) logs.append(ln.ts + " " + ln.stream + " " + ln.message + "\n");
    if (stick) logs.scrollTop = logs.scrollHeight;
  });
  events.addEventListener("end", () => {
    events.close();
    refresh();
    if (cancel) cancel.disabled = true;
    root.dataset.ended = "1";
  });
}

document.addEventListener("DOMContentLoaded", () => { epochCells(); followList(); followTask(); });
