// What went into a run: the server's inputs view (core/views.py `InputsSummary`, the `inputs` of
// GET /api/runs/ID) drawn as a compact panel. The page never counts anything itself: the summary
// line, the counts and the skipped lines are the server's, as the CLI and the MCP result show them.

import { fmtInt, h } from "./dom.js";

const SKIPPED_OPEN = 5; // up to this many skipped files are listed open; more wait behind their summary

/** The panel for `inputs` (null: the run loaded no context, e.g. a follow-up that kept its session's). */
export function inputsPanel(inputs) {
  if (!inputs) return null;
  const count = inputs.skipped_count || 0;
  const more = count - inputs.skipped.length;
  const skipped = count ? h("details", { class: "inputs-skipped", open: count <= SKIPPED_OPEN },
    h("summary", {}, `${fmtInt(count)} file${count === 1 ? "" : "s"} skipped`),
    h("ul", {}, inputs.skipped.map((line) => h("li", {}, line)),
      more > 0 ? h("li", { class: "muted" }, `… and ${fmtInt(more)} more`) : null)) : null;
  const report = inputs.report ? h("details", { class: "inputs-report" }, h("summary", {}, "Size report"),
    h("pre", { tabindex: "0", "aria-label": "Size report" }, inputs.report)) : null;
  return h("section", { class: "inputs", "aria-label": "Inputs" },
    h("p", { class: "inputs-line" }, h("span", { class: "tag" }, "inputs"), " ",
      h("span", { class: "inputs-summary" }, inputs.summary)),
    skipped, report);
}
