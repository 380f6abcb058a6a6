// Optimization: datasets (import JSON lines or judged runs), a launch form, live progress with a
// score chart over trials (the optimization's event stream), and program versions to compare,
// promote (behind the gate, or with a reason) and roll back. Text from users and models goes in
// as text nodes only (dom.js).

import { api, followRun } from "../api.js";
import { badge, errorBox, field, fmtTime, h, replace, toast } from "../dom.js";

const OPTIMIZERS = ["bootstrap", "gepa", "mipro"];
const METRICS = ["normalised", "exact", "numeric", "f1", "judge"];
const SVG_W = 480;
const SVG_H = 190;
const MARGIN = { left: 46, right: 14, top: 12, bottom: 40 }; // room for the tick labels and axis titles
const MAX_X_TICKS = 10;

function score(v) {
  return v === null || v === undefined ? "–" : Number(v).toFixed(3);
}

/** SVG text in the page's text colour (the chart's own styles live with the SVG, not in style.css). */
function svgText(attrs, text) {
  return h("svg:text", { fill: "currentColor", "font-size": "11", ...attrs }, text);
}

/** Mean score per trial as an SVG line chart with axes: score 0..1 up, trials across; and a text list for screen readers. */
function chart(trials) {
  const n = trials.length;
  const width = SVG_W - MARGIN.left - MARGIN.right;
  const height = SVG_H - MARGIN.top - MARGIN.bottom;
  const x = (i) => MARGIN.left + (n <= 1 ? width / 2 : (i * width) / (n - 1));
  const y = (s) => MARGIN.top + (1 - s) * height;
  const every = Math.ceil(n / MAX_X_TICKS);
  const points = trials.map((t, i) => `${x(i)},${y(t.score)}`).join(" ");
  return h("figure", { class: "score-chart" },
    h("svg:svg", { viewBox: `0 0 ${SVG_W} ${SVG_H}`, role: "img", "aria-label": "Mean score per trial" },
      [0, 0.5, 1].map((s) => [
        h("svg:line", { class: "axis", x1: MARGIN.left, y1: y(s), x2: SVG_W - MARGIN.right, y2: y(s), "stroke-dasharray": s ? "3 3" : null }),
        svgText({ x: MARGIN.left - 6, y: y(s) + 4, "text-anchor": "end" }, String(s))]),
      h("svg:line", { class: "axis", x1: MARGIN.left, y1: y(1), x2: MARGIN.left, y2: y(0) }),
      trials.map((t, i) => (i % every ? null : svgText({ x: x(i), y: y(0) + 15, "text-anchor": "middle" }, String(t.trial)))),
      svgText({ x: MARGIN.left + width / 2, y: SVG_H - 6, "text-anchor": "middle" }, "trial"),
      svgText({ x: -(MARGIN.top + height / 2), y: 13, transform: "rotate(-90)", "text-anchor": "middle" }, "score"),
      n ? h("svg:polyline", { class: "series", points }) : null,
      trials.map((t, i) => h("svg:circle", { class: "dot", cx: x(i), cy: y(t.score), r: 4 }))),
    h("figcaption", { class: "small muted" },
      n ? trials.map((t) => `trial ${t.trial}: ${score(t.score)} (${t.evaluations} evaluations)`).join(" · ") : "No trials yet."));
}

function datasetsSection(onChange) {
  const body = h("tbody", {});
  const name = h("input", { required: true, maxlength: "64", placeholder: "support-questions" });
  const jsonl = h("textarea", { rows: "4", placeholder: '{"question": "...", "context": "...", "answer": "..."}' });
  const file = h("input", { type: "file", accept: ".jsonl,.json,.txt" });
  const folder = h("input", { type: "text", maxlength: "4096", placeholder: "/home/me/questions" });
  const fromFeedback = h("input", { type: "checkbox" });
  const holdout = h("input", { type: "number", min: "0", max: "0.9", step: "0.05", value: "0.2" });
  const out = h("div", { role: "status" });
  file.addEventListener("change", async () => { if (file.files[0]) jsonl.value = await file.files[0].text(); });

  const load = async () => {
    try {
      const res = await api("/api/datasets");
      replace(body, res.datasets.length ? res.datasets.map((d) => h("tr", { dataset: { dataset: d.name } },
        h("td", {}, d.name), h("td", {}, String(d.train)), h("td", {}, String(d.holdout)), h("td", {}, d.source),
        h("td", { class: "nowrap" }, fmtTime(d.created_at))))
        : h("tr", {}, h("td", { colspan: "5", class: "muted" }, "No datasets yet: import one below.")));
      onChange(res.datasets);
    } catch (err) {
      replace(body, h("tr", {}, h("td", { colspan: "5" }, errorBox(err))));
    }
  };
  const submit = async (e) => {
    e.preventDefault();
    try {
      const json = { name: name.value.trim(), holdout: Number(holdout.value || 0) };
      if (fromFeedback.checked) json.feedback = true; else json.jsonl = jsonl.value;
      if (!fromFeedback.checked && folder.value.trim()) json.folder = folder.value.trim();
      const made = await api("/api/datasets", { method: "POST", json });
      replace(out, h("p", { class: "ok" }, `Dataset ${made.name}: ${made.train} train, ${made.holdout} holdout rows.`),
        made.skipped.length ? h("ul", { class: "small muted" }, made.skipped.map((s) => h("li", {}, s))) : null);
      jsonl.value = "";
      await load();
    } catch (err) {
      replace(out, errorBox(err));
    }
  };
  const section = h("section", { class: "card", "aria-labelledby": "ds-h" },
    h("h2", { id: "ds-h" }, "Datasets"),
    h("div", { class: "table-wrap" }, h("table", {},
      h("thead", {}, h("tr", {}, ["Name", "Train", "Holdout", "Source", "Created"].map((c) => h("th", { scope: "col" }, c)))),
      body)),
    h("form", { onsubmit: submit },
      h("h3", {}, "Import"),
      field("Dataset name", name).row,
      field("JSON lines", jsonl, "One object a line: question, context or context_path, answer.").row,
      field("JSONL file", file).row,
      field("Folder the file is in", folder, "Optional: where relative context_path entries are found (a browser does not tell the server).").row,
      h("label", { class: "small" }, fromFeedback, " From runs marked right or wrong instead"),
      field("Holdout share", holdout).row,
      h("div", { class: "actions" }, h("button", { type: "submit" }, "Import dataset"))),
    out);
  return { section, load };
}

function launchSection(onFinished) {
  const dataset = h("select", { required: true });
  const optimizer = h("select", {}, OPTIMIZERS.map((o) => h("option", { value: o }, o)));
  const metric = h("select", {}, METRICS.map((m) => h("option", { value: m }, m)));
  const trials = h("input", { type: "number", min: "1", max: "100", placeholder: "4" });
  const cap = h("input", { type: "number", min: "1", placeholder: "no cap" });
  const live = h("div", { class: "opt-live", "aria-live": "polite" });
  let stream = null;

  const follow = (opt, estimate) => {
    const trials = new Map();
    const line = h("p", { class: "small", role: "status" }, "Starting…");
    const scored = h("ul", { class: "plain small" });
    const chartBox = h("div", {}, chart([]));
    const cancel = h("button", { type: "button", class: "secondary" }, "Cancel");
    const cost = estimate.cost === null ? "cost unknown" : `at most $${estimate.cost}`;
    replace(live, h("h3", {}, `Optimization ${opt}`),
      h("p", { class: "small muted" }, `Estimate: up to ${estimate.evaluations} replays, at most ${estimate.llm_calls} model calls, ${cost}.`),
      line, chartBox, scored, h("div", { class: "actions" }, cancel));
    cancel.addEventListener("click", async () => {
      try { await api(`/api/optimizations/${encodeURIComponent(opt)}/cancel`, { method: "POST" }); } catch (err) { toast(err.message, "error"); }
    });
    stream = followRun(opt, {
      onEvent: (ev) => {
        const d = ev.data;
        if (ev.kind === "optimize.eval") {
          const t = trials.get(d.trial) || { trial: d.trial, sum: 0, evaluations: 0 };
          t.sum += d.score; t.evaluations += 1; t.score = t.sum / t.evaluations;
          trials.set(d.trial, t);
          line.textContent = `Trial ${d.trial} · candidate ${d.candidate} · ${d.evaluations} evaluations · ${d.llm_calls} model calls`;
          replace(chartBox, chart([...trials.values()]));
        } else if (ev.kind === "optimize.scored") {
          scored.append(h("li", { dataset: { scored: `${d.program}-${d.split}` } }, `${d.program}: ${d.split} score ${score(d.score)} (${d.n} rows)`));
        } else if (ev.kind === "optimize.finished") {
          cancel.hidden = true;
          live.append(h("p", { class: "opt-result" }, badge(d.status),
            d.version_id ? ` version ${d.version_id} · gate ${d.gate.passed ? "passes" : "fails"}: ${d.gate.reason}` : ` ${d.error || ""}`));
          onFinished();
        }
      },
    });
  };
  const submit = async (e) => {
    e.preventDefault();
    if (stream) stream.close();
    const json = { dataset: dataset.value, optimizer: optimizer.value, metric: metric.value };
    if (trials.value) json.trials = Number(trials.value);
    if (cap.value) json.max_llm_calls = Number(cap.value);
    try {
      const started = await api("/api/optimizations", { method: "POST", json });
      follow(started.optimization_id, started.estimate);
    } catch (err) {
      replace(live, errorBox(err));
    }
  };
  const section = h("section", { class: "card", "aria-labelledby": "launch-h" },
    h("h2", { id: "launch-h" }, "Optimize"),
    h("form", { class: "grid-limits", onsubmit: submit },
      field("Dataset", dataset).row, field("Optimizer", optimizer).row, field("Metric", metric).row,
      field("Trials", trials).row, field("Model call cap", cap).row,
      h("div", { class: "actions" }, h("button", { type: "submit" }, "Start optimization"))),
    live);
  const setDatasets = (list) => {
    const keep = dataset.value;
    replace(dataset, list.map((d) => h("option", { value: d.name, selected: d.name === keep }, d.name)));
  };
  return { section, setDatasets, close: () => stream && stream.close() };
}

function versionsSection() {
  const body = h("tbody", {});
  const activeLine = h("p", { class: "small" });
  const a = h("select", {});
  const b = h("select", {});
  const out = h("div", { role: "status" });

  const promote = async (id, override) => {
    try {
      const json = override ? { override } : {};
      await api(`/api/programs/${encodeURIComponent(id)}/promote`, { method: "POST", json });
      replace(out, h("p", { class: "ok" }, `Version ${id} is active: new runs use it.`));
      await load();
    } catch (err) {
      replace(out, errorBox(err), err.status === 409 && !override && !/already active/.test(err.message) ? overrideForm(id) : null);
    }
  };
  // A version the gate refuses is promoted only with a reason, kept in the history.
  const overrideForm = (id, why) => {
    const reason = h("input", { maxlength: "2000", placeholder: "why promote it anyway" });
    const send = h("button", { type: "button", class: "danger", disabled: true, onclick: () => promote(id, reason.value.trim()) }, "Promote with this reason");
    reason.addEventListener("input", () => { send.disabled = !reason.value.trim(); });
    return h("div", { class: "inline-form" },
      why ? h("p", { class: "small" }, `Version ${id} does not pass the promotion gate: ${why}.`) : null,
      field("Reason for the override", reason).row, send);
  };
  const promoteButton = (v) => {
    if (v.active) return null;
    if (v.gate.passed) return h("button", { type: "button", onclick: () => promote(v.id) }, `Promote ${v.id}`);
    return h("button", { type: "button", class: "secondary", title: `The gate fails: ${v.gate.reason}`,
      onclick: () => replace(out, overrideForm(v.id, v.gate.reason)) }, "Promote anyway…");
  };
  const rollback = async () => {
    try {
      const res = await api("/api/programs/rollback", { method: "POST" });
      replace(out, h("p", { class: "ok" }, `Rolled back: ${res.active} is active.`));
      await load();
    } catch (err) {
      replace(out, errorBox(err));
    }
  };
  const compare = async (e) => {
    e.preventDefault();
    try {
      const c = await api(`/api/programs/compare?a=${encodeURIComponent(a.value)}&b=${encodeURIComponent(b.value)}`);
      const row = (k) => h("tr", {}, h("th", { scope: "row" }, k), h("td", {}, score(c.scores[c.a][k])), h("td", {}, score(c.scores[c.b][k])));
      replace(out, h("h3", {}, `${c.a} vs ${c.b}`),
        h("div", { class: "table-wrap" }, h("table", { class: "compare" },
          h("thead", {}, h("tr", {}, h("th", {}, "Score"), h("th", {}, c.a), h("th", {}, c.b))),
          h("tbody", {}, ["train_after", "holdout_after"].map(row)))),
        Object.entries(c.instructions).map(([name, diff]) => h("div", {},
          h("h4", {}, `${name}: instructions`), h("pre", { class: "diff" }, diff || "(the same)"),
          h("p", { class: "small" }, `demos only in ${c.a}: ${c.demos[name].only_a.length}, only in ${c.b}: ${c.demos[name].only_b.length}, shared: ${c.demos[name].shared}`))));
    } catch (err) {
      replace(out, errorBox(err));
    }
  };
  const load = async () => {
    try {
      const res = await api("/api/programs");
      activeLine.textContent = `Active: ${res.active}`;
      replace(body, res.versions.length ? res.versions.map((v) => h("tr", { dataset: { version: v.id } },
        h("td", {}, v.active ? "active" : ""), h("td", {}, v.id), h("td", {}, v.optimizer), h("td", {}, v.metric),
        h("td", {}, `${score(v.scores.train_before)} → ${score(v.scores.train_after)}`),
        h("td", {}, `${score(v.scores.holdout_before)} → ${score(v.scores.holdout_after)}`),
        h("td", {}, promoteButton(v))))
        : h("tr", {}, h("td", { colspan: "7", class: "muted" }, "No versions yet: run an optimization.")));
      const ids = ["builtin", ...res.versions.map((v) => v.id)];
      replace(a, ids.map((id) => h("option", { value: id }, id)));
      replace(b, ids.map((id, i) => h("option", { value: id, selected: i === 1 }, id)));
    } catch (err) {
      replace(body, h("tr", {}, h("td", { colspan: "7" }, errorBox(err))));
    }
  };
  const section = h("section", { class: "card", "aria-labelledby": "pv-h" },
    h("h2", { id: "pv-h" }, "Program versions"), activeLine,
    h("div", { class: "table-wrap" }, h("table", {},
      h("thead", {}, h("tr", {}, ["", "Version", "Optimizer", "Metric", "Train", "Holdout", ""].map((c) => h("th", { scope: "col" }, c)))),
      body)),
    h("div", { class: "actions" }, h("button", { type: "button", class: "secondary", onclick: rollback }, "Roll back")),
    h("form", { class: "inline-form", onsubmit: compare },
      field("Compare", a).row, field("with", b).row, h("button", { type: "submit" }, "Compare versions")),
    out);
  return { section, load };
}

export function renderOptimize(main) {
  const versions = versionsSection();
  const launch = launchSection(() => versions.load());
  const data = datasetsSection((list) => launch.setDatasets(list));
  replace(main, h("h1", {}, "Optimization"), data.section, launch.section, versions.section);
  data.load();
  versions.load();
  return () => launch.close();
}
