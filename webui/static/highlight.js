// Python syntax highlighting for the code in traces: keywords, strings, comments and numbers become
// spans with a class (style.css colours them). The code was written by a model, so every piece goes
// in as text (dom.js `h`): markup inside the code stays visible text, never elements.

import { h } from "./dom.js";

const KEYWORDS = new Set(("False None True and as assert async await break class continue def del elif else " +
  "except finally for from global if import in is lambda nonlocal not or pass raise return try while with yield").split(" "));

// One alternative per token kind, tried left to right at each position. Strings take an optional
// prefix (r, b, f, u, rb...); an unclosed one runs to the end of its line (triple-quoted: of the code).
const TOKEN = new RegExp([
  /(#[^\n]*)/.source,
  /((?:[rRbBuUfF]{1,2})?(?:"""[\s\S]*?(?:"""|$)|'''[\s\S]*?(?:'''|$)|"(?:[^"\\\n]|\\.)*(?:"|(?=\n)|$)|'(?:[^'\\\n]|\\.)*(?:'|(?=\n)|$)))/.source,
  /(\b(?:0[xXoObB][\da-fA-F_]+|\d[\d_]*(?:\.[\d_]*)?(?:[eE][+-]?\d+)?[jJ]?)\b)/.source,
  /([A-Za-z_]\w*)/.source,
].join("|"), "g");

const CLASSES = ["tok-com", "tok-str", "tok-num"];

/** The code as nodes and strings for `h`/`append`: highlighted tokens as spans, the rest as plain text. */
export function highlightPython(code) {
  const parts = [];
  let last = 0;
  for (const match of code.matchAll(TOKEN)) {
    const [text, ...groups] = match;
    const kind = groups.findIndex((g) => g !== undefined);
    const cls = kind < CLASSES.length ? CLASSES[kind] : KEYWORDS.has(text) ? "tok-kw" : null;
    if (!cls) continue; // an ordinary name: stays in the plain text around it
    if (match.index > last) parts.push(code.slice(last, match.index));
    parts.push(h("span", { class: cls }, text));
    last = match.index + text.length;
  }
  if (last < code.length) parts.push(code.slice(last));
  return parts;
}
