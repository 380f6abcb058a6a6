// The run timeline: a hand-written SVG waterfall of root steps (model call, then code), sub-queries
// and child RLMs over time. Concurrent sub-queries of a batch are packed into lanes, so the number
// of lanes is how many ran at once.

import { fmtSeconds, h, replace } from "./dom.js";
import { cacheNote, subcallGroups } from "./trace.js";

const KINDS = { run: "run", child: "child RLM", lm: "model call", code: "code", sub: "sub-query" };

/** Pack intervals into the fewest lanes without overlap (greedy by start). */
export function packLanes(items) {
  const lanes = [];
  for (const item of [...items].sort((a, b) => a.start - b.start)) {
    const lane = lanes.find((l) => l[l.length - 1].end <= item.start + 1e-6);
    if (lane) lane.push(item);
    else lanes.push([item]);
  }
  return lanes;
}

/**
 * Rows of the waterfall from a TraceModel: [{label, depth, thin, caption, items: [{start, end, kind, title}]}].
 * `thin`: one lane of concurrent sub-queries; `caption`: the label row above a batch's lanes.
 */
export function timelineRows(model) {
  const now = model.lastTs;
  const rows = [];
  const run = model.run;
  if (run.startedTs) {
    rows.push({ label: "run", depth: 0, items: [{ start: run.startedTs, end: run.finishedTs || now, kind: "run",
      title: `run ${run.status || "running"}` }] });
  }
  const visit = (id, depth) => {
    const node = model.nodes.get(id);
    if (!node) return;
    if (id !== "root" && node.startedTs) {
      rows.push({ label: id, depth, items: [{ start: node.startedTs, end: node.finishedTs || now, kind: "child",
        title: `child ${id} ${node.status}${node.queryPreview ? `: ${node.queryPreview.slice(0, 80)}` : ""}` }] });
    }
    for (const step of node.steps) {
      const items = [];
      const lm = step.lm || {};
      if (step.lmTs) {
        items.push({ start: step.lmTs - (lm.latency || 0), end: step.lmTs, kind: "lm",
          title: [`${id} step ${step.step}: ${lm.model || "model"} ${fmtSeconds(lm.latency || 0)}`, cacheNote(lm)]
            .filter(Boolean).join(" · ") });
      }
      if (step.codeTs) {
        items.push({ start: step.codeTs - (step.duration || 0), end: step.codeTs, kind: "code",
          title: `${id} step ${step.step}: code ${fmtSeconds(step.duration || 0)}${step.error ? " (error)" : ""}` });
      }
      if (items.length) rows.push({ label: `${id === "root" ? "" : `${id} `}step ${step.step}`, depth, items });
      for (const group of subcallGroups(step)) {
        const calls = group.calls.map((s) => ({ start: s.ts - (s.latency || 0), end: s.ts, kind: "sub",
          title: `sub-query${s.batch ? ` ${s.batch.index + 1}/${s.batch.size}` : ""}: ${fmtSeconds(s.latency || 0)}${s.error ? " (error)" : ""}` }));
        const lanes = packLanes(calls);
        rows.push({ label: `${calls.length} sub-quer${calls.length === 1 ? "y" : "ies"}, ${lanes.length} at once`,
          depth: depth + 1, caption: true, items: [] });
        for (const lane of lanes) rows.push({ label: "", depth: depth + 1, thin: true, items: lane });
      }
      for (const child of step.children) visit(child, depth + 1);
    }
  };
  visit("root", 0);
  return rows;
}

function niceStep(span, target) {
  const raw = span / Math.max(1, target);
  const pow = 10 ** Math.floor(Math.log10(raw || 1));
  for (const m of [1, 2, 5, 10]) if (raw <= m * pow) return m * pow;
  return 10 * pow;
}

function svg(tag, attrs, ...children) {
  return h(`svg:${tag}`, attrs, ...children);
}

/** Draw the timeline of `model` into `container` (replacing what was there). */
export function renderTimeline(container, model) {
  const rows = timelineRows(model);
  if (!rows.length) {
    replace(container, h("p", { class: "muted" }, "Nothing to draw yet: the timeline fills in as the run goes."));
    return;
  }
  const items = rows.flatMap((r) => r.items);
  const t0 = Math.min(...items.map((i) => i.start));
  const t1 = Math.max(...items.map((i) => i.end), t0 + 0.001);
  const width = Math.max(320, Math.floor(container.clientWidth || 800));
  const labelW = Math.min(190, Math.floor(width * 0.32));
  const plotW = width - labelW - 12;
  const axisH = 22;
  const heights = rows.map((r) => (r.thin ? 7 : r.caption ? 14 : 18));
  const height = axisH + heights.reduce((a, b) => a + b, 0) + 6;
  const x = (t) => labelW + ((t - t0) / (t1 - t0)) * plotW;

  const root = svg("svg", { class: "timeline", width: String(width), height: String(height),
    viewBox: `0 0 ${width} ${height}`, role: "img",
    "aria-label": `Timeline of ${rows.length} rows over ${fmtSeconds(t1 - t0)}` });
  const step = niceStep(t1 - t0, Math.floor(plotW / 90));
  for (let t = 0; t <= t1 - t0 + 1e-9; t += step) {
    const px = x(t0 + t);
    root.append(svg("line", { class: "tl-grid", x1: px, x2: px, y1: axisH - 4, y2: height }),
      svg("text", { class: "tl-tick", x: px + 2, y: 12 }, fmtSeconds(t)));
  }
  let y = axisH;
  rows.forEach((row, i) => {
    const rh = heights[i];
    if (row.label) {
      root.append(svg("text", { class: row.caption ? "tl-label tl-caption" : "tl-label", x: 4 + row.depth * 10,
        y: y + (row.caption ? 11 : 13) }, row.label));
    }
    for (const item of row.items) {
      const w = Math.max(1.5, x(item.end) - x(item.start));
      root.append(svg("rect", { class: `tl-${item.kind}`, x: x(item.start).toFixed(1), y: y + 1,
        width: w.toFixed(1), height: rh - 2, rx: row.thin ? 1 : 2 }, svg("title", {}, item.title)));
    }
    y += rh;
  });
  const legend = h("ul", { class: "legend" }, Object.entries(KINDS).map(([k, label]) =>
    h("li", {}, h("span", { class: `swatch tl-${k}`, "aria-hidden": "true" }), label)));
  const subs = items.filter((i) => i.kind === "sub").length;
  replace(container, h("figure", { class: "timeline-figure" },
    h("div", { class: "timeline-scroll" }, root),
    h("figcaption", {}, legend,
      h("span", { class: "muted small" }, `${fmtSeconds(t1 - t0)} in all · ${subs} sub-queries`))));
}
