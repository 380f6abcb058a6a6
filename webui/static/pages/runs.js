// Runs: the history, searchable by question and filtered by status. Refreshes itself while a run
// is still going (runs started from the CLI or an MCP client appear here too).

import { api, qs } from "../api.js";
import { badge, errorBox, field, fmtSeconds, fmtTime, h, replace } from "../dom.js";

const STATUSES = ["", "queued", "running", "succeeded", "partial", "failed", "cancelled", "interrupted"];
const PAGE = 50;
const REFRESH_MS = 2000; // while a listed run is going; twice that otherwise (to catch runs started elsewhere)

// Kept while the app is open, so coming back from a run restores the search.
const filters = { q: "", status: "" };

function row(run) {
  const href = `#/runs/${encodeURIComponent(run.run_id)}`;
  return h("tr", { dataset: { run: run.run_id } },
    h("td", {}, badge(run.status)),
    h("td", { class: "q-cell" }, h("a", { href }, run.question || "(no question)"),
      run.parent_run_id ? h("div", { class: "muted small lineage" },
        `forked from ${run.parent_run_id} at step ${(run.fork_at || "").split(":").pop()}`) : null,
      run.answer_preview ? h("div", { class: "muted small preview-line" }, run.answer_preview) : null),
    h("td", { class: "nowrap" }, fmtTime(run.created_at)),
    h("td", { class: "nowrap" }, fmtSeconds(run.seconds)));
}

export function renderRuns(main) {
  const search = h("input", { type: "search", value: filters.q, placeholder: "Words of the question" });
  const status = h("select", {}, STATUSES.map((s) => h("option", { value: s, selected: s === filters.status }, s || "any")));
  const body = h("tbody", {});
  const info = h("p", { class: "muted small", role: "status" });
  const more = h("button", { type: "button", class: "ghost", hidden: true }, "Load more");
  let runs = [];
  let shown = "";
  let timer = null;
  let stopped = false;

  const load = async (append = false) => {
    try {
      // A refresh re-reads every row already listed ("Load more" included).
      const limit = append ? PAGE : Math.max(PAGE, runs.length);
      const res = await api(`/api/runs${qs({ limit, offset: append ? runs.length : 0, q: filters.q, status: filters.status })}`);
      if (stopped) return;
      runs = append ? runs.concat(res.runs) : res.runs;
      const signature = JSON.stringify(runs);
      if (signature !== shown) replace(body, runs.map(row)); // unchanged: keep the focus where it is
      shown = signature;
      info.textContent = runs.length ? `${runs.length}${res.has_more ? "+" : ""} run(s)` : "No runs match.";
      more.hidden = !res.has_more;
      clearTimeout(timer);
      // While something is going, keep the list fresh: statuses change, new runs start elsewhere.
      if (!stopped) timer = setTimeout(() => load(false), runs.some((r) => r.status === "running" || r.status === "queued") ? REFRESH_MS : REFRESH_MS * 2);
    } catch (err) {
      replace(body, h("tr", {}, h("td", { colspan: "4" }, errorBox(err))));
    }
  };
  let debounce = null;
  search.addEventListener("input", () => {
    clearTimeout(debounce);
    debounce = setTimeout(() => { filters.q = search.value.trim(); load(); }, 250);
  });
  status.addEventListener("change", () => { filters.status = status.value; load(); });
  more.addEventListener("click", () => load(true));

  replace(main, h("h1", {}, "Runs"),
    h("form", { class: "filters", role: "search", onsubmit: (e) => { e.preventDefault(); filters.q = search.value.trim(); load(); } },
      field("Search questions", search).row, field("Status", status).row),
    info,
    h("div", { class: "table-wrap" }, h("table", { class: "runs" },
      h("caption", { class: "visually-hidden" }, "Runs, newest first"),
      h("thead", {}, h("tr", {}, ["Status", "Question", "Started", "Time"].map((c) => h("th", { scope: "col" }, c)))),
      body)),
    more);
  load();
  return () => { stopped = true; clearTimeout(timer); clearTimeout(debounce); };
}
