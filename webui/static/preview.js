// File previews for the volume browser: plain text, Markdown, JSON and CSV/TSV as a table.
// Every piece of file text becomes a text node; the Markdown renderer builds elements for a small
// safe subset (headings, paragraphs, lists, quotes, code, emphasis, http(s) links) and nothing else.

import { h } from "./dom.js";

const MAX_ROWS = 500;

/** Parse CSV (RFC 4180: quoted fields, doubled quotes, newlines inside quotes). */
export function parseCsv(text, delimiter = ",") {
  const rows = [];
  let row = [];
  let cell = "";
  let quoted = false;
  for (let i = 0; i < text.length; i += 1) {
    const c = text[i];
    if (quoted) {
      if (c === '"' && text[i + 1] === '"') { cell += '"'; i += 1; }
      else if (c === '"') quoted = false;
      else cell += c;
    } else if (c === '"' && cell === "") {
      quoted = true;
    } else if (c === delimiter) {
      row.push(cell); cell = "";
    } else if (c === "\n" || c === "\r") {
      if (c === "\r" && text[i + 1] === "\n") i += 1;
      row.push(cell); rows.push(row); row = []; cell = "";
    } else {
      cell += c;
    }
  }
  if (cell !== "" || row.length) { row.push(cell); rows.push(row); }
  return rows;
}

export function csvTable(text, { delimiter = ",", truncated = false, name = "file" } = {}) {
  const rows = parseCsv(text, delimiter);
  // A range cut mid-file may end in a partial row: drop it rather than show half a record.
  if (truncated && rows.length > 1) rows.pop();
  if (!rows.length) return h("p", { class: "muted" }, "The file is empty.");
  const [head, ...body] = rows;
  const shown = body.slice(0, MAX_ROWS);
  const more = body.length - shown.length;
  return h("div", { class: "table-wrap" },
    h("table", { class: "csv" },
      h("caption", {}, `${name}: ${body.length}${truncated ? "+" : ""} rows`),
      h("thead", {}, h("tr", {}, head.map((c) => h("th", { scope: "col" }, c)))),
      h("tbody", {}, shown.map((r) => h("tr", {}, r.map((c) => h("td", {}, c)))))),
    more > 0 ? h("p", { class: "muted" }, `${more} more rows not shown`) : null);
}

// -- Markdown -------------------------------------------------------------------------------------

const INLINE = /(`[^`]+`)|(\*\*[^*]+\*\*)|(\*[^*\s][^*]*\*)|(\[[^\]]+\]\([^)\s]+\))/;

/** Inline Markdown to nodes: `code`, **bold**, *italic*, [text](http...) links. */
export function inline(text) {
  const out = [];
  let rest = text;
  while (rest) {
    const m = INLINE.exec(rest);
    if (!m) { out.push(rest); break; }
    if (m.index) out.push(rest.slice(0, m.index));
    const tok = m[0];
    if (m[1]) out.push(h("code", {}, tok.slice(1, -1)));
    else if (m[2]) out.push(h("strong", {}, inline(tok.slice(2, -2))));
    else if (m[3]) out.push(h("em", {}, inline(tok.slice(1, -1))));
    else {
      const [, label, href] = /^\[([^\]]+)\]\(([^)\s]+)\)$/.exec(tok);
      // Only web links: javascript:, data: and the like stay text.
      out.push(/^https?:\/\//i.test(href)
        ? h("a", { href, rel: "noopener noreferrer nofollow", target: "_blank" }, label)
        : tok);
    }
    rest = rest.slice(m.index + tok.length);
  }
  return out;
}

/** Block Markdown to a fragment of elements. */
export function markdown(text) {
  const lines = text.replace(/\r\n?/g, "\n").split("\n");
  const root = h("div", { class: "markdown" });
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    const fence = /^```(.*)$/.exec(line);
    if (fence) {
      const code = [];
      i += 1;
      while (i < lines.length && !/^```/.test(lines[i])) { code.push(lines[i]); i += 1; }
      i += 1;
      root.append(h("pre", {}, h("code", {}, code.join("\n"))));
      continue;
    }
    const heading = /^(#{1,6})\s+(.*)$/.exec(line);
    if (heading) {
      // Shifted down two levels: the page's own h1/h2 stay the outline's top.
      root.append(h(`h${Math.min(6, heading[1].length + 2)}`, {}, inline(heading[2])));
      i += 1;
      continue;
    }
    if (/^\s*([-*+]|\d+[.)])\s+/.test(line)) {
      const ordered = /^\s*\d/.test(line);
      const list = h(ordered ? "ol" : "ul", {});
      while (i < lines.length && /^\s*([-*+]|\d+[.)])\s+/.test(lines[i])) {
        list.append(h("li", {}, inline(lines[i].replace(/^\s*([-*+]|\d+[.)])\s+/, ""))));
        i += 1;
      }
      root.append(list);
      continue;
    }
    if (/^>\s?/.test(line)) {
      const quote = [];
      while (i < lines.length && /^>\s?/.test(lines[i])) { quote.push(lines[i].replace(/^>\s?/, "")); i += 1; }
      root.append(h("blockquote", {}, inline(quote.join(" "))));
      continue;
    }
    if (!line.trim()) { i += 1; continue; }
    const para = [];
    while (i < lines.length && lines[i].trim() && !/^(#{1,6}\s|```|>|\s*([-*+]|\d+[.)])\s)/.test(lines[i])) {
      para.push(lines[i]);
      i += 1;
    }
    root.append(h("p", {}, inline(para.join(" "))));
  }
  return root;
}

// -- choose by file name -------------------------------------------------------------------------

/** The preview of a text range of file `name` (a TextRange's content). */
export function preview(name, content, truncated) {
  const ext = (/\.([^./]+)$/.exec(name.toLowerCase()) || [])[1] || "";
  if (ext === "csv" || ext === "tsv") {
    return csvTable(content, { delimiter: ext === "tsv" ? "\t" : ",", truncated, name });
  }
  if (ext === "md" || ext === "markdown") return markdown(content);
  if (ext === "json" && !truncated) {
    try {
      return h("pre", { class: "json", tabindex: "0" }, JSON.stringify(JSON.parse(content), null, 2));
    } catch {
      // Not valid JSON: fall through to the raw text, which shows where it breaks.
    }
  }
  return h("pre", { class: "text", tabindex: "0" }, content);
}
