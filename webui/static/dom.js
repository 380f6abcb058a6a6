// DOM helpers: every page builds nodes with these. Text always goes in through textContent
// (text nodes), never innerHTML, because most of what the UI shows was written by a model or a user.

import { saveAs } from "./api.js";

/**
 * Create an element. `attrs`: attributes, plus `on<event>` handlers, `class`, `dataset` and
 * boolean properties (`hidden`, `disabled`, `checked`, `open`). Children: nodes, strings
 * (as text nodes), arrays, or null/false (skipped).
 */
export function h(tag, attrs = {}, ...children) {
  const el = tag.startsWith("svg:")
    ? document.createElementNS("http://www.w3.org/2000/svg", tag.slice(4))
    : document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith("on") && typeof value === "function") {
      el.addEventListener(key.slice(2), value);
    } else if (key === "dataset") {
      Object.assign(el.dataset, value);
    } else if (["hidden", "disabled", "checked", "open", "value", "selected", "required", "multiple"].includes(key)) {
      el[key] = value;
    } else {
      el.setAttribute(key, value === true ? "" : String(value));
    }
  }
  append(el, children);
  return el;
}

/** Append children (nodes, strings, arrays; null and false are skipped). */
export function append(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

/** Replace all children of `el`. */
export function replace(el, ...children) {
  el.replaceChildren();
  return append(el, children);
}

let uid = 0;
/** A unique id for label/aria wiring. */
export function newId(prefix = "f") {
  uid += 1;
  return `${prefix}-${uid}`;
}

/** A labelled form field: returns {row, input}. `input` is created by the caller or from `type`. */
export function field(label, input, hint) {
  if (!input.id) input.id = newId("in");
  const hintId = hint ? newId("hint") : null;
  if (hintId) input.setAttribute("aria-describedby", hintId);
  const row = h("div", { class: "field" }, h("label", { for: input.id }, label), input,
    hint ? h("small", { id: hintId, class: "muted" }, hint) : null);
  return { row, input };
}

/**
 * A file input shown as a button (its label): the browser's own "No file chosen" beside it would
 * contradict the list of picked files, as the input is emptied after each pick. Returns {row, input}.
 */
export function filePicker(label) {
  const input = h("input", { type: "file", multiple: true, class: "file-input", id: newId("in") });
  const row = h("div", { class: "file-picker" }, input,
    h("label", { for: input.id, class: "button secondary small" }, label));
  return { row, input };
}

/** Show a short message in the shared live region. */
export function toast(message, kind = "info") {
  const el = document.getElementById("toast");
  el.textContent = message;
  el.dataset.kind = kind;
  el.hidden = false;
  clearTimeout(toast.timer);
  toast.timer = setTimeout(() => { el.hidden = true; }, 4000);
}

/**
 * A link to the Settings page for an error whose fix is a setting: the API marks those (`hint`); a
 * run's error text names the terminal's way, `fleet-rlm config set`, which here is that page.
 * Null for any other error.
 */
export function settingsLink(err) {
  const message = err && err.message ? err.message : String(err);
  if (!(err && err.hint === "settings") && !message.includes("`fleet-rlm config set ")) return null;
  return h("a", { href: "#/settings", class: "settings-link" }, "Open Settings to fix it");
}

/** An error box for a failed call: the API's message says what to do (and links to Settings when it is there). */
export function errorBox(err) {
  const message = err && err.message ? err.message : String(err);
  const link = settingsLink(err);
  return h("p", { class: "error", role: "alert" }, message, link ? [" ", link] : null);
}

/** A link that downloads `path` as `name` through the API, which wants the session header a plain link lacks. */
export function downloadLink(path, name, label, attrs = {}) {
  const save = (ev) => {
    ev.preventDefault();
    saveAs(path, name).catch((err) => toast(err.message, "error"));
  };
  return h("a", { ...attrs, href: path, download: name, onclick: save }, label);
}

/** Copy text; resolves true on success. Clipboard access can be refused, which is not an error. */
export async function copyText(text) {
  try {
    await navigator.clipboard.writeText(text);
    return true;
  } catch {
    return false;
  }
}

// -- formatting ---------------------------------------------------------------------------------

export function fmtBytes(n) {
  if (n === null || n === undefined) return "–";
  const units = ["B", "KB", "MB", "GB", "TB"];
  let v = Number(n);
  let i = 0;
  while (v >= 1024 && i < units.length - 1) { v /= 1024; i += 1; }
  return `${i === 0 ? v : v.toFixed(v < 10 ? 1 : 0)} ${units[i]}`;
}

export function fmtSeconds(s) {
  if (s === null || s === undefined) return "–";
  if (s < 1) return `${Math.round(s * 1000)} ms`;
  if (s < 60) return `${s.toFixed(1)} s`;
  const m = Math.floor(s / 60);
  return `${m} min ${Math.round(s - m * 60)} s`;
}

export function fmtTime(epochSeconds) {
  if (!epochSeconds) return "–";
  return new Date(epochSeconds * 1000).toLocaleString();
}

export function fmtInt(n) {
  return Number(n || 0).toLocaleString();
}

export function fmtCost(c) {
  if (!c) return "$0";
  return c < 0.01 ? `$${c.toFixed(4)}` : `$${c.toFixed(2)}`;
}

/** A status badge: text plus a class for colour (never colour alone). */
const STATUS_TITLES = {
  partial: "A budget (steps, model calls, time or cost) ran out before the run submitted; the answer was extracted from its work so far.",
};

export function badge(status) {
  return h("span", { class: `badge st-${status || "unknown"}`, title: STATUS_TITLES[status] || null }, status || "unknown");
}

/** Ask before deleting; resolves true when confirmed. A real <dialog>: focus is trapped and Esc cancels. */
export function confirmDialog(message, action = "Delete") {
  return new Promise((resolve) => {
    const dialog = h("dialog", { class: "confirm", "aria-labelledby": "confirm-text" },
      h("p", { id: "confirm-text" }, message),
      h("form", { method: "dialog", class: "actions" },
        h("button", { value: "cancel", class: "secondary", autofocus: true }, "Cancel"),
        h("button", { value: "ok", class: "danger" }, action)));
    dialog.addEventListener("close", () => { resolve(dialog.returnValue === "ok"); dialog.remove(); });
    document.body.append(dialog);
    dialog.showModal();
  });
}
