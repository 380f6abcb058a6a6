// A run's events folded into a tree as they arrive, and its live rendering.
//
// TraceModel folds events exactly like server/fleet_rlm/core/trace.py `build_trace` (nodes, their
// steps, each step's sub-calls and children), and also keeps each event's time so the timeline
// can draw it. TraceTree renders the model and updates only the step an event touched, so a
// user's open/closed sections survive a live stream.

import { badge, copyText, fmtCost, fmtInt, fmtSeconds, h, replace, settingsLink } from "./dom.js";
import { highlightPython } from "./highlight.js";

const SUBCALLS_SHOWN = 200; // a batch of thousands stays fast; the rest is counted

function newNode(node, parent, depth) {
  return { node, parent, depth, status: "running", steps: [], children: [], warnings: [],
    queryPreview: null, answerPreview: null, startedTs: null, finishedTs: null };
}

export class TraceModel {
  constructor() {
    this.nodes = new Map([["root", newNode("root", null, 0)]]);
    this.run = { status: "running" };
    this.current = new Map(); // node -> step in progress
    this.events = 0;
    this.lastTs = null;
    this.context = null;
    this.progress = "";
  }

  step(node, number) {
    let step = node.steps.find((s) => s.step === number);
    if (!step) {
      step = { step: number, reasoning: null, code: null, output: null, outputChars: null, error: null,
        duration: null, lm: null, lmTs: null, codeTs: null, subcalls: [], children: [], submitted: false };
      node.steps.push(step);
      node.steps.sort((a, b) => a.step - b.step);
    }
    return step;
  }

  /** Fold one event; returns {node, step} it touched (step null: the node's header). */
  feed(ev) {
    const data = ev.data || {};
    const name = ev.node || "root";
    this.events += 1;
    this.lastTs = ev.ts;
    if (!this.nodes.has(name)) this.nodes.set(name, newNode(name, ev.parent || null, ev.depth || 0));
    const node = this.nodes.get(name);
    const where = name === "root" ? "" : `${name} `;
    switch (ev.kind) {
      case "run.started":
        Object.assign(this.run, { question: data.question, limits: data.limits, startedTs: ev.ts,
          sessionId: data.session_id });
        node.startedTs = ev.ts;
        this.progress = "loading the context";
        return { node: "root", step: null };
      case "context.loaded":
        this.context = data;
        this.progress = `context loaded: ${fmtInt(data.chars)} characters from ${data.sources} source(s) · waiting for the model`;
        return { node: "root", step: null };
      case "run.finished": {
        for (const k of ["status", "answer", "stop_reason", "error", "usage", "iterations", "llm_calls", "seconds"]) {
          this.run[k] = data[k];
        }
        this.run.finishedTs = ev.ts;
        const root = this.nodes.get("root");
        root.status = data.status;
        root.finishedTs = ev.ts;
        root.answerPreview = (data.answer || "").slice(0, 200) || null;
        this.progress = `run ${data.status}${data.error ? `: ${data.error}` : ""}`;
        return { node: "root", step: null };
      }
      case "lm.call": {
        const step = this.step(node, data.step || 0);
        this.current.set(name, step.step);
        step.reasoning = data.reasoning ?? null;
        step.lm = { model: data.model, predictor: data.predictor, prompt_tokens: data.prompt_tokens,
          completion_tokens: data.completion_tokens, cost: data.cost, latency: data.latency, replayed: data.replayed,
          cached_tokens: data.cached_tokens, cache_write_tokens: data.cache_write_tokens, saved: data.saved };
        step.lmTs = ev.ts;
        this.progress = `${where}step ${step.step} · running code`;
        return { node: name, step: step.step };
      }
      case "code.executed": {
        const step = this.step(node, data.step || 0);
        Object.assign(step, { code: data.code ?? null, output: data.output ?? null, error: data.error ?? null,
          errorKind: data.error_kind ?? null, duration: data.duration ?? null });
        step.outputChars = data.output_chars ?? null;
        step.submitted = Boolean(data.submitted);
        step.codeTs = ev.ts;
        this.progress = data.error ? `${where}step ${step.step} · error`
          : data.submitted ? `${where}step ${step.step} · answer submitted`
            : `${where}step ${step.step} · code ran · waiting for the model`;
        return { node: name, step: step.step };
      }
      case "subcall.finished": {
        const step = this.step(node, this.current.get(name) || 0);
        step.subcalls.push({ seq: ev.seq, ts: ev.ts, ...data });
        const b = data.batch;
        const done = b ? step.subcalls.filter((s) => s.batch && s.batch.id === b.id).length : 1;
        this.progress = `${where}step ${step.step} · ${done}/${b ? b.size : 1} sub-queries`;
        return { node: name, step: step.step };
      }
      case "child.started": {
        node.queryPreview = data.query_preview ?? null;
        node.startedTs = ev.ts;
        const parent = this.nodes.get(ev.parent);
        if (parent) {
          parent.children.push(name);
          const step = this.step(parent, this.current.get(ev.parent) || 0);
          step.children.push(name);
          this.progress = `child ${name} started`;
          return { node: ev.parent, step: step.step, added: name };
        }
        return { node: name, step: null };
      }
      case "child.finished":
        Object.assign(node, { status: data.status, answerPreview: data.answer_preview ?? null,
          stopReason: data.stop_reason ?? null, error: data.error ?? null, finishedTs: ev.ts });
        this.progress = `child ${name} ${data.status || "finished"}`;
        return { node: name, step: null };
      case "warning":
        node.warnings.push(String(data.message));
        this.progress = `${where}warning: ${String(data.message).slice(0, 160)}`;
        return { node: name, step: null };
      default:
        return null;
    }
  }
}

/** Fan-out groups of a step's sub-queries: one per batch, one for lone llm_query calls. */
export function subcallGroups(step) {
  const groups = new Map();
  for (const s of step.subcalls) {
    const key = s.batch ? `b${s.batch.id}` : "single";
    if (!groups.has(key)) groups.set(key, { batch: s.batch || null, calls: [] });
    groups.get(key).calls.push(s);
  }
  return [...groups.values()];
}

/** A labelled block of preformatted `content`: text, or nodes built from text (highlighted code). */
function pre(cls, content, label) {
  return h("div", { class: "block" }, h("div", { class: "block-label" }, label),
    h("pre", { class: cls, tabindex: "0", "aria-label": label }, content));
}

function subcallItem(s) {
  const meta = [s.model, s.latency != null ? fmtSeconds(s.latency) : null,
    s.batch ? `#${s.batch.index + 1}` : null].filter(Boolean).join(" · ");
  return h("li", { class: s.error ? "subcall err" : "subcall" },
    h("div", { class: "muted small" }, meta),
    h("div", { class: "sub-prompt" }, h("span", { class: "tag" }, "prompt"), " ", s.prompt_preview || ""),
    s.error ? h("div", { class: "error" }, s.error)
      : h("div", { class: "sub-response" }, h("span", { class: "tag" }, "answer"), " ", s.response_preview || ""));
}

function fanout(group) {
  const size = group.batch ? group.batch.size : group.calls.length;
  const done = group.calls.length;
  const errors = group.calls.filter((c) => c.error).length;
  const label = group.batch ? `Batched sub-queries: ${done} of ${size} done` : `${done} sub-quer${done === 1 ? "y" : "ies"}`;
  const shown = group.calls.slice(0, SUBCALLS_SHOWN);
  return h("div", { class: "fanout" },
    h("div", { class: "fanout-head" },
      h("span", {}, label, errors ? ` · ${errors} failed` : ""),
      h("progress", { max: String(size), value: String(done), "aria-label": label })),
    h("details", { class: "subcalls" },
      h("summary", {}, "Show sub-queries"),
      h("ol", {}, shown.map(subcallItem)),
      group.calls.length > SUBCALLS_SHOWN ? h("p", { class: "muted" }, `${group.calls.length - SUBCALLS_SHOWN} more not shown`) : null));
}

function stepSummary(step) {
  const lm = step.lm || {};
  const tokens = (lm.prompt_tokens || 0) + (lm.completion_tokens || 0);
  return [
    h("span", { class: "step-title" }, `Step ${step.step}`),
    lm.predictor === "extract" ? h("span", { class: "tag" }, "extract") : null,
    step.submitted ? h("span", { class: "badge st-succeeded" }, "submitted") : null,
    step.error ? h("span", { class: "badge st-failed" }, "error") : null,
    step.code === null && !step.error ? h("span", { class: "badge st-running" }, "running") : null,
    lm.replayed ? h("span", { class: "tag", title: "Answered from the record: no model was called" }, "replayed") : null,
    h("span", { class: "muted small" }, [lm.model, lm.latency != null ? `model ${fmtSeconds(lm.latency)}` : null,
      step.duration != null ? `code ${fmtSeconds(step.duration)}` : null, tokens ? `${fmtInt(tokens)} tokens` : null,
      cacheNote(lm), lm.cost ? fmtCost(lm.cost) : null].filter(Boolean).join(" · ")),
  ];
}

export class TraceTree {
  /**
   * `container`: where the tree goes; `model`: a TraceModel fed by the caller. `onFork(node, step, code)`:
   * if given, every step with code gets a "Fork from here" button that calls it.
   */
  constructor(container, model, { onFork = null } = {}) {
    this.model = model;
    this.onFork = onFork;
    this.container = container;
    this.nodeEls = new Map(); // node id -> {root, steps (ol), header, stepEls: Map}
    this.codeBlocks = new WeakMap(); // step -> {code, el}
    this.status = h("p", { class: "progress-line muted", role: "status", "aria-live": "polite" });
    this.tree = h("section", { class: "trace", "aria-label": "Run trace" });
    replace(container, this.status, this.tree);
    this.tree.append(this.nodeEl("root").root);
    this.renderAll();
  }

  nodeEl(id) {
    if (this.nodeEls.has(id)) return this.nodeEls.get(id);
    const header = h("div", { class: "node-head" });
    const steps = h("ol", { class: "steps" });
    const warnings = h("ul", { class: "warnings" });
    const root = h("section", { class: id === "root" ? "node root-node" : "node child-node", dataset: { node: id },
      "aria-label": id === "root" ? "Root RLM" : `Child RLM ${id}` }, header, warnings, steps);
    const entry = { root, header, steps, warnings, stepEls: new Map() };
    this.nodeEls.set(id, entry);
    return entry;
  }

  renderHeader(id) {
    const node = this.model.nodes.get(id);
    const entry = this.nodeEl(id);
    if (id === "root") {
      const ctx = this.model.context;
      replace(entry.header, h("span", { class: "node-title" }, "Root RLM"), " ", badge(node.status),
        ctx ? h("span", { class: "muted small" }, ` context: ${fmtInt(ctx.chars)} characters from ${ctx.sources} source(s)`) : null);
    } else {
      replace(entry.header, h("span", { class: "node-title" }, `Child RLM ${id}`), " ", badge(node.status),
        node.queryPreview ? h("div", { class: "query" }, h("span", { class: "tag" }, "query"), " ", node.queryPreview) : null,
        node.answerPreview ? h("div", { class: "answer-preview" }, h("span", { class: "tag" }, "answer"), " ", node.answerPreview) : null,
        node.error ? h("div", { class: "error" }, node.error) : null);
    }
    replace(entry.warnings, node.warnings.map((w) => h("li", { class: "warning" }, w)));
  }

  renderStep(id, number) {
    const node = this.model.nodes.get(id);
    const step = node.steps.find((s) => s.step === number);
    if (!step) return;
    const entry = this.nodeEl(id);
    let el = entry.stepEls.get(number);
    if (!el) {
      const summary = h("summary", {});
      const body = h("div", { class: "step-body" });
      const details = h("details", { open: true }, summary, body);
      const li = h("li", { class: "step", dataset: { step: String(number) } }, details);
      el = { li, summary, body, children: h("div", { class: "children" }) };
      entry.stepEls.set(number, el);
      // Keep steps in order even if a later event names an earlier step.
      const after = [...entry.stepEls.entries()].filter(([n]) => n > number).sort((a, b) => a[0] - b[0])[0];
      entry.steps.insertBefore(li, after ? after[1].li : null);
    }
    replace(el.summary, stepSummary(step));
    replace(el.body,
      step.reasoning ? h("div", { class: "block" }, h("div", { class: "block-label" }, "Reasoning"),
        h("p", { class: "reasoning" }, step.reasoning)) : null,
      step.code !== null ? this.codeBlock(step) : null,
      this.onFork && step.code !== null ? h("button", { type: "button", class: "secondary small fork-here",
        onclick: () => this.onFork(id, step.step, step.code) }, "Fork from here") : null,
      subcallGroups(step).map(fanout),
      el.children,
      step.output ? pre("output", step.output, step.outputChars ? `Output (${fmtInt(step.outputChars)} characters)` : "Output") : null,
      step.error ? pre("error", step.error, "Error") : null);
    // Child nodes nest under the step that started them.
    for (const child of step.children) {
      const childEntry = this.nodeEl(child);
      if (childEntry.root.parentNode !== el.children) el.children.append(childEntry.root);
      this.renderHeader(child);
    }
  }

  /** The step's highlighted code, built once per code: a step re-renders on each of its sub-queries, and
   *  keeping the element keeps a reader's selection and scroll position in it. */
  codeBlock(step) {
    let cached = this.codeBlocks.get(step);
    if (!cached || cached.code !== step.code) {
      cached = { code: step.code, el: pre("code", highlightPython(step.code), "Code") };
      this.codeBlocks.set(step, cached);
    }
    return cached.el;
  }

  renderAll() {
    for (const [id, node] of this.model.nodes) {
      this.renderHeader(id);
      for (const step of node.steps) this.renderStep(id, step.step);
    }
    this.status.textContent = this.model.progress;
  }

  /** Feed an event to the model and update what it touched. */
  feed(ev) {
    const touched = this.model.feed(ev);
    if (touched) {
      this.renderHeader(touched.node);
      if (touched.step !== null) this.renderStep(touched.node, touched.step);
      if (touched.added) this.renderHeader(touched.added);
    }
    this.status.textContent = this.model.progress;
  }
}

/** "62% of prompt cached, $0.0012 saved" for a call's or a run's counts that read the provider's prompt
 * cache (server/fleet_rlm/core/views.py `cache_note`), or "" when none were read. */
export function cacheNote(u) {
  const cached = (u && u.cached_tokens) || 0;
  const prompt = (u && u.prompt_tokens) || 0;
  if (!cached || !prompt) return "";
  return `${Math.round((100 * cached) / prompt)}% of prompt cached${u.saved ? `, ${fmtCost(u.saved)} saved` : ""}`;
}

/** Tokens and cost per model from a run's usage ({total, by_model, by_name}): per configured model
 * (root, sub, each named one: "fast (openai/gpt-4o-mini)") once a named model answered, else per model. */
export function usageTable(usage) {
  const byName = (usage && usage.by_name) || {};
  const named = Object.keys(byName).some((n) => n !== "root" && n !== "sub");
  const rows = named
    ? Object.entries(byName).map(([n, u]) => [u.model ? `${n} (${u.model})` : n, u])
    : Object.entries((usage && usage.by_model) || {});
  if (!rows.length) return h("p", { class: "muted" }, "No model usage recorded yet.");
  const total = usage.total || {};
  const row = (name, u, cls) => h("tr", { class: cls || null },
    h("th", { scope: "row" }, name), h("td", {}, fmtInt(u.calls)), h("td", {}, fmtInt(u.prompt_tokens)),
    h("td", {}, fmtInt(u.completion_tokens)), h("td", {}, fmtCost(u.cost)));
  return h("div", { class: "table-wrap" }, h("table", { class: "usage" },
    h("caption", {}, "Tokens and cost per model"),
    h("thead", {}, h("tr", {}, ["Model", "Calls", "Prompt tokens", "Completion tokens", "Cost"].map((c) => h("th", { scope: "col" }, c)))),
    h("tbody", {}, rows.map(([m, u]) => row(m, u))),
    h("tfoot", {}, row("Total", total, "total"))));
}

/** The answer of a finished run (or why there is none), with a copy button. `run`: status, answer, error, stop_reason. */
export function answerBlock(run) {
  const status = h("span", { class: "muted small", role: "status" });
  if (run.answer !== null && run.answer !== undefined) {
    const copy = h("button", { type: "button", class: "ghost", onclick: async () => {
      const ok = await copyText(run.answer);
      status.textContent = ok ? "Copied." : "Copy was refused by the browser: select the text instead.";
    } }, "Copy answer");
    return h("section", { class: "answer-block", "aria-label": "Answer" },
      h("div", { class: "answer-head" }, h("h3", {}, "Answer"), copy, status),
      h("div", { class: "answer", tabindex: "0" }, run.answer));
  }
  const why = run.error || run.stop_reason || (run.status === "cancelled" ? "The run was stopped." : "No answer.");
  const fix = run.error ? settingsLink({ message: run.error }) : null;
  return h("section", { class: "answer-block", "aria-label": "Answer" },
    h("div", { class: "answer-head" }, h("h3", {}, "No answer"), badge(run.status)),
    h("p", { class: run.status === "failed" ? "error" : "muted" }, why, fix ? [" ", fix] : null));
}
