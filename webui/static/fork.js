// Forks and replays from a run's page (docs/replay.md): the "Fork from here" editor, and the line
// saying where a fork or a replay comes from, with a replay's verdict.

import { api } from "./api.js";
import { errorBox, field, h, replace } from "./dom.js";

/** A plain textarea with line numbers beside it (they follow edits and scrolling). */
export function codeEditor(text, label) {
  const gutter = h("pre", { class: "gutter", "aria-hidden": "true" });
  const area = h("textarea", { class: "code-input", spellcheck: "false", wrap: "off", rows: "14", "aria-label": label });
  area.value = text;
  const number = () => {
    const lines = area.value.split("\n").length;
    gutter.textContent = Array.from({ length: lines }, (_, i) => String(i + 1)).join("\n");
    gutter.scrollTop = area.scrollTop;
  };
  area.addEventListener("input", number);
  area.addEventListener("scroll", () => { gutter.scrollTop = area.scrollTop; });
  number();
  return { el: h("div", { class: "code-editor" }, gutter, area), area };
}

/**
 * The fork editor for step `step` of node `node` of run `runId`, opened on the step's code: run the
 * edited code at that step, or ask the model there with an added instruction. The new run's page opens.
 */
export function openForkEditor(runId, node, step, code) {
  const where = node === "root" ? `step ${step}` : `step ${step} of ${node}`;
  const editor = codeEditor(code, `Code for ${where} of the fork`);
  const instruction = h("input", { type: "text", placeholder: "e.g. check the totals before you submit" });
  const maxIters = h("input", { type: "number", min: "1", max: "1000", placeholder: "as the run had" });
  const status = h("div", { role: "status" });
  const dialog = h("dialog", { class: "fork-dialog", "aria-labelledby": "fork-title" });
  const start = async (body) => {
    const iters = Number(maxIters.value);
    if (maxIters.value && Number.isInteger(iters) && iters > 0) body.max_iters = iters;
    replace(status, h("p", { class: "muted small" }, "Starting the fork…"));
    try {
      const res = await api(`/api/runs/${encodeURIComponent(runId)}/fork`, { method: "POST", json: { at: `${node}:${step}`, ...body } });
      dialog.close();
      location.hash = `#/runs/${encodeURIComponent(res.run_id)}`;
    } catch (err) {
      replace(status, errorBox(err));
    }
  };
  replace(dialog,
    h("h2", { id: "fork-title" }, `Fork from ${where}`),
    h("p", { class: "muted small" }, `Steps before ${where} are replayed from this run's record (no model calls, no cost); `
      + "from there the fork runs live."),
    editor.el,
    field("Or ask the model at this step, with this instruction", instruction).row,
    field("Steps per node", maxIters).row,
    status,
    h("div", { class: "actions" },
      h("button", { type: "button", class: "run-fork-code", onclick: () => start({ code: editor.area.value }) }, "Run this code"),
      h("button", { type: "button", class: "secondary", onclick: () => start(instruction.value.trim() ? { instruction: instruction.value.trim() } : {}) },
        "Ask the model instead"),
      h("button", { type: "button", class: "ghost", onclick: () => dialog.close() }, "Cancel")));
  dialog.addEventListener("close", () => dialog.remove());
  document.body.append(dialog);
  dialog.showModal();
  editor.area.focus();
}

const REASONS = { prompt: "the model's request changed", missing: "a call had no recorded reply",
  host: "a host call returned something else", inputs: "the inputs changed", code: "other code ran",
  output: "the output differs", ended: "the replay stopped early", answer: "the answer differs" };

/** "forked from RUN at step N" / "replay of RUN" with, for a finished replay, its verdict. */
export function lineageLine(state) {
  if (!state.parent_run_id) return null;
  const link = h("a", { href: `#/runs/${encodeURIComponent(state.parent_run_id)}` }, state.parent_run_id);
  if (state.kind !== "replay") {
    const [node, step] = (state.fork_at || "root:?").split(/:(?=[^:]*$)/);
    return h("p", { class: "lineage" }, "forked from ", link, ` at step ${step}${node === "root" ? "" : ` of ${node}`}`);
  }
  const verdict = h("span", { class: "replay-verdict" });
  if (state.status !== "running" && state.status !== "queued") {
    api(`/api/runs/${encodeURIComponent(state.run_id)}/replay`).then((r) => {
      const first = r.first_divergence;
      replace(verdict, first
        ? h("span", { class: "badge st-failed", title: first.detail },
          `diverged at ${first.reason === "inputs" ? "the inputs" : `${first.node} step ${first.step}`}: ${REASONS[first.reason] || first.reason}`)
        : h("span", { class: "badge st-succeeded" }, "no divergence"));
    }, (err) => replace(verdict, errorBox(err)));
  }
  return h("p", { class: "lineage" }, "replay of ", link, " ", verdict);
}

/** A button that replays `runId` and opens the replay's page. */
export function replayButton(runId, onError) {
  return h("button", { type: "button", class: "secondary small", title: "Run it again from its record: no model calls",
    onclick: async () => {
      try {
        const res = await api(`/api/runs/${encodeURIComponent(runId)}/replay`, { method: "POST" });
        location.hash = `#/runs/${encodeURIComponent(res.run_id)}`;
      } catch (err) {
        onError(err);
      }
    } }, "Replay");
}
