// Run inspector (#/runs/ID): status, answer, the trace tree and the timeline (live while the run
// goes, wherever it was started), tokens and cost per model, export, feedback, delete; its lineage
// (a fork's or replay's source), Replay, and "Fork from here" on every step; what went in (inputs.js).

import { api, followRun } from "../api.js";
import { badge, confirmDialog, downloadLink, errorBox, field, fmtInt, fmtSeconds, fmtTime, h, replace, toast } from "../dom.js";
import { lineageLine, openForkEditor, replayButton } from "../fork.js";
import { inputsPanel } from "../inputs.js";
import { renderTimeline } from "../timeline.js";
import { TraceModel, TraceTree, answerBlock, cacheNote, usageTable } from "../trace.js";

/** Accessible tabs: arrow keys move between them; `onSelect(name)` on every change. */
function tabs(panels, onSelect) {
  const buttons = [];
  const list = h("div", { class: "tabs", role: "tablist", "aria-label": "Run views" });
  const select = (i) => panels.forEach((p, j) => {
    buttons[j].setAttribute("aria-selected", String(i === j));
    buttons[j].tabIndex = i === j ? 0 : -1;
    p.panel.hidden = i !== j;
    if (i === j) onSelect(p.name);
  });
  panels.forEach((p, i) => {
    const id = `tab-${p.name}`;
    p.panel.setAttribute("role", "tabpanel");
    p.panel.setAttribute("aria-labelledby", id);
    p.panel.id = `panel-${p.name}`;
    const b = h("button", { type: "button", role: "tab", id, "aria-controls": p.panel.id, onclick: () => select(i),
      onkeydown: (e) => {
        const step = { ArrowRight: 1, ArrowLeft: -1 }[e.key];
        if (!step) return;
        const next = (i + step + panels.length) % panels.length;
        select(next);
        buttons[next].focus();
      } }, p.label);
    buttons.push(b);
    list.append(b);
  });
  select(0);
  return h("div", {}, list, panels.map((p) => p.panel));
}

function feedbackForm(runId) {
  const expected = h("input", { type: "text", placeholder: "Optional: the right answer" });
  const comment = h("textarea", { rows: "2", placeholder: "Optional: what went wrong or right" });
  const saved = h("ul", { class: "plain feedback-list" });
  const status = h("p", { role: "status", class: "muted small" });
  const showList = (res) => replace(saved, (Array.isArray(res) ? res : res.feedback || []).map((r) => h("li", {},
    h("span", { class: r.correct ? "badge st-succeeded" : "badge st-failed" }, r.correct ? "correct" : "wrong"),
    r.expected ? ` expected: ${r.expected}` : "", r.comment ? ` · ${r.comment}` : "")));
  const send = async (correct) => {
    const body = { correct };
    if (expected.value.trim()) body.expected = expected.value.trim();
    if (comment.value.trim()) body.comment = comment.value.trim();
    try {
      await api(`/api/runs/${encodeURIComponent(runId)}/feedback`, { method: "POST", json: body });
      status.textContent = "Feedback saved. Thank you.";
      expected.value = "";
      comment.value = "";
      showList(await api(`/api/runs/${encodeURIComponent(runId)}/feedback`));
    } catch (err) {
      replace(status, errorBox(err));
    }
  };
  api(`/api/runs/${encodeURIComponent(runId)}/feedback`).then(showList, () => {});
  const correct = h("button", { type: "button", onclick: () => send(true) }, "✓ Correct");
  const noAnswer = h("p", { class: "muted small", hidden: true },
    "This run gave no answer, so it cannot be correct: mark it wrong and give the expected answer.");
  const section = h("section", { class: "card feedback", "aria-labelledby": "fb-title" },
    h("h2", { id: "fb-title" }, "Was the answer right?"),
    h("div", { class: "actions" },
      correct,
      h("button", { type: "button", class: "secondary", onclick: () => send(false) }, "✗ Wrong")),
    noAnswer,
    h("details", {}, h("summary", {}, "Add the expected answer or a comment"),
      field("Expected answer", expected).row, field("Comment", comment).row),
    status, saved);
  // Only an answer can be right (the server refuses it too).
  const showRun = (run) => {
    const answered = Boolean((run.answer || "").trim());
    correct.disabled = !answered;
    noAnswer.hidden = answered || run.status === "running" || run.status === "queued";
  };
  return { section, showRun };
}

export function renderInspector(main, { id }) {
  const rid = encodeURIComponent(id);
  const meta = h("dl", { class: "meta" });
  const inputs = h("div", { class: "inputs-slot" });
  const statusSlot = h("span", {});
  const answer = h("div", { class: "answer-slot" });
  const usage = h("div", {});
  const treeBox = h("div", { class: "trace-box" });
  const timelineBox = h("div", { class: "timeline-box" });
  const connection = h("span", { class: "muted small" });
  const model = new TraceModel();
  const tree = new TraceTree(treeBox, model, { onFork: (node, step, code) => openForkEditor(id, node, step, code) });
  const lineage = h("div", {});
  const replay = replayButton(id, (err) => toast(err.message, "error"));
  let timelineVisible = false;
  let pending = null;
  const drawTimeline = () => {
    if (!timelineVisible || pending) return;
    // Redraw at most a few times a second while events pour in.
    pending = setTimeout(() => { pending = null; renderTimeline(timelineBox, model); }, 250);
  };
  const stop = h("button", { type: "button", class: "danger small", hidden: true, onclick: async () => {
    try {
      toast((await api(`/api/runs/${rid}/cancel`, { method: "POST" })).message || "Stopping…");
    } catch (err) {
      toast(err.message, "error");
    }
  } }, "Stop");
  const del = h("button", { type: "button", class: "secondary small", onclick: async () => {
    if (!(await confirmDialog(`Delete run ${id}, its trace and its uploads? This cannot be undone.`))) return;
    try {
      await api(`/api/runs/${rid}`, { method: "DELETE" });
      toast(`Run ${id} deleted.`);
      location.hash = "#/runs";
    } catch (err) {
      toast(err.message, "error");
    }
  } }, "Delete");

  // Pinned runs are kept when retention deletes old runs (docs/web.md).
  const pin = h("button", { type: "button", class: "secondary small", "aria-pressed": "false",
    title: "Keep this run when retention deletes old runs", onclick: async () => {
      try {
        const want = pin.getAttribute("aria-pressed") !== "true";
        const s = await api(`/api/runs/${rid}/pin`, { method: "POST", json: { pinned: want } });
        showPin(s.pinned);
        toast(s.pinned ? `Run ${id} pinned: retention keeps it.` : `Run ${id} unpinned.`);
      } catch (err) {
        toast(err.message, "error");
      }
    } }, "Pin");
  const showPin = (pinned) => {
    pin.setAttribute("aria-pressed", String(pinned));
    pin.textContent = pinned ? "Pinned" : "Pin";
  };

  let poll = null;
  const showState = (s) => {
    showPin(Boolean(s.pinned));
    const active = s.status === "running" || s.status === "queued";
    replace(statusSlot, badge(s.status));
    stop.hidden = !active;
    replay.hidden = active || s.kind === "replay";
    replace(lineage, lineageLine(s));
    clearTimeout(poll);
    if (active) poll = setTimeout(refresh, 3000); // counters and time move while it runs
    const tokens = ((s.usage.total || {}).prompt_tokens || 0) + ((s.usage.total || {}).completion_tokens || 0);
    replace(meta, [["Started", fmtTime(s.started_at || s.created_at)], ["Time", fmtSeconds(s.seconds)],
      ["Steps", fmtInt(s.iterations)], ["Model calls", fmtInt(s.llm_calls)], ["Tokens", fmtInt(tokens || s.progress.tokens)],
      ["Prompt cache", cacheNote(s.usage.total) || "–"], ["Session", s.session_id || "–"]].map(([k, v]) => h("div", {}, h("dt", {}, k), h("dd", {}, v))));
    replace(usage, usageTable(s.usage));
    replace(inputs, inputsPanel(s.inputs));
    if (!active) replace(answer, answerBlock(s));
    feedback.showRun(s);
  };
  const feedback = feedbackForm(id);
  let closed = false;
  const refresh = () => api(`/api/runs/${rid}`).then(
    (s) => { if (!closed) { heading.textContent = s.question; showState(s); } },
    (err) => replace(answer, errorBox(err)));

  const view = tabs([
    { name: "trace", label: "Trace", panel: treeBox },
    { name: "timeline", label: "Timeline", panel: timelineBox },
  ], (name) => {
    timelineVisible = name === "timeline";
    if (timelineVisible) renderTimeline(timelineBox, model);
  });
  const heading = h("h1", { class: "run-question" }, "Run");
  replace(main, heading,
    h("div", { class: "run-head" }, statusSlot, stop, replay, connection,
      downloadLink(`/api/runs/${rid}/export`, `${id}.ndjson`, "Export", { class: "button secondary small" }),
      downloadLink(`/api/runs/${rid}/export.html`, `${id}.html`, "HTML",
        { class: "button secondary small", title: "The run as one page to share: opens offline, secrets masked" }),
      pin, del, h("a", { href: "#/runs" }, "All runs")),
    lineage, meta, inputs, answer, view,
    h("section", { class: "card", "aria-labelledby": "usage-title" }, h("h2", { id: "usage-title" }, "Tokens and cost"), usage),
    feedback.section);

  const follower = followRun(id, {
    onEvent: (ev) => {
      tree.feed(ev);
      if (ev.kind === "run.started") heading.textContent = ev.data.question || "Run";
      if (ev.kind === "context.loaded" && !inputs.firstChild) refresh(); // what went in, without waiting for the poll
      drawTimeline();
    },
    onEnd: () => { refresh(); drawTimeline(); },
    onState: (s) => { connection.textContent = s === "live" ? "" : s; },
  });
  refresh();
  const onResize = () => { if (timelineVisible) renderTimeline(timelineBox, model); };
  window.addEventListener("resize", onResize);
  return () => {
    closed = true;
    follower.close();
    clearTimeout(pending);
    clearTimeout(poll);
    window.removeEventListener("resize", onResize);
  };
}
