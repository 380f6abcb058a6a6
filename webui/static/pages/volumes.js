// Volumes: the durable folders runs can read and write. Browse a volume as a tree, preview files
// (text, Markdown, JSON, CSV as a table), upload, download, delete (after asking), see quota use.

import { api } from "../api.js";
import { confirmDialog, downloadLink, errorBox, field, fmtBytes, fmtInt, h, replace, toast } from "../dom.js";
import { preview } from "../preview.js";

const PREVIEW_BYTES = 65536;

const enc = encodeURIComponent;

function quota(v) {
  const label = `${fmtBytes(v.bytes)} of ${fmtBytes(v.quota_bytes)} used, ${fmtInt(v.files)} of ${fmtInt(v.max_files)} entries`;
  return h("div", { class: "quota" },
    h("meter", { min: "0", max: String(v.quota_bytes), value: String(v.bytes), high: String(v.quota_bytes * 0.9),
      "aria-label": `Quota use of ${v.name}` }),
    h("span", { class: "muted small" }, label));
}

export function renderVolumes(main) {
  const list = h("ul", { class: "plain volume-list", "aria-label": "Volumes" });
  const detail = h("div", { class: "volume-detail" });
  const newName = h("input", { type: "text", pattern: "[A-Za-z0-9_.\\-]+", placeholder: "letters, digits, - _ ." });
  const createStatus = h("div", { "aria-live": "polite" });
  let current = null;

  const loadVolumes = async () => {
    try {
      const res = await api("/api/volumes");
      replace(list, res.volumes.length ? res.volumes.map((v) => h("li", { class: current === v.name ? "selected" : null },
        h("button", { type: "button", class: "link vol-name", "aria-current": current === v.name ? "true" : null,
          onclick: () => openVolume(v.name) }, v.name), quota(v)))
        : h("li", { class: "muted" }, "No volumes yet."));
      return res.volumes;
    } catch (err) {
      replace(list, h("li", {}, errorBox(err)));
      return [];
    }
  };

  const create = h("form", { class: "inline-form", onsubmit: async (e) => {
    e.preventDefault();
    const name = newName.value.trim();
    if (!name) return;
    try {
      await api("/api/volumes", { method: "POST", json: { name } });
      newName.value = "";
      replace(createStatus);
      await loadVolumes();
      openVolume(name);
    } catch (err) {
      replace(createStatus, errorBox(err));
    }
  } }, field("New volume", newName).row, h("button", { type: "submit" }, "Create"));

  function openVolume(name) {
    current = name;
    loadVolumes();
    const tree = h("ul", { class: "tree", "aria-label": `Files of ${name}` });
    const pane = h("div", { class: "preview-pane", "aria-live": "polite" },
      h("p", { class: "muted" }, "Choose a file to preview it."));
    const folderLabel = h("span", { class: "muted small" });
    let folder = "";
    // Files live under the durable folders (memory/, artifacts/, ...): uploads go to the folder
    // opened last, artifacts/ until one is.
    const setFolder = (path) => { folder = path; folderLabel.textContent = `Uploads go to ${name}/${path}/`; };
    setFolder("artifacts");
    const listings = new Map(); // folder path -> its <ul>

    const loadFolder = async (path, ul) => {
      listings.set(path, ul);
      try {
        const res = await api(`/api/volumes/${enc(name)}/files?path=${enc(path)}`);
        replace(ul, res.entries.length ? res.entries.map((e) => entry(e)) : h("li", { class: "muted small" }, "(empty)"),
          res.truncated ? h("li", { class: "muted small" }, "More entries not listed.") : null);
      } catch (err) {
        replace(ul, h("li", {}, errorBox(err)));
      }
    };
    const refreshFolder = (path) => loadFolder(path, listings.get(path) || tree);

    function entry(e) {
      const base = e.path.split("/").pop();
      if (e.type === "dir") {
        const sub = h("ul", { hidden: true });
        const toggle = h("button", { type: "button", class: "tree-dir", "aria-expanded": "false", onclick: () => {
          const open = toggle.getAttribute("aria-expanded") !== "true";
          toggle.setAttribute("aria-expanded", String(open));
          sub.hidden = !open;
          if (open) { setFolder(e.path); loadFolder(e.path, sub); }
        } }, `${base}/`);
        return h("li", { dataset: { path: e.path } }, toggle, sub);
      }
      if (e.type !== "file") {
        return h("li", { class: "muted", dataset: { path: e.path } }, `${base} (${e.type}: not opened)`);
      }
      return h("li", { dataset: { path: e.path } },
        h("button", { type: "button", class: "tree-file", onclick: () => showFile(e) }, base),
        h("span", { class: "muted small" }, ` ${fmtBytes(e.size)}`));
    }

    async function showFile(e) {
      const raw = `/api/volumes/${enc(name)}/raw?path=${enc(e.path)}`;
      const parent = e.path.split("/").slice(0, -1).join("/");
      const del = h("button", { type: "button", class: "danger small", onclick: async () => {
        if (!(await confirmDialog(`Delete ${name}/${e.path}? This cannot be undone.`))) return;
        try {
          await api(raw, { method: "DELETE" });
          toast(`Deleted ${e.path}.`);
          replace(pane, h("p", { class: "muted" }, `${e.path} was deleted.`));
          refreshFolder(parent);
          loadVolumes();
        } catch (err) {
          toast(err.message, "error");
        }
      } }, "Delete");
      const head = h("div", { class: "preview-head" }, h("h2", {}, e.path),
        h("span", { class: "muted small" }, fmtBytes(e.size)),
        downloadLink(raw, e.path.split("/").pop(), "Download", { class: "button secondary small" }), del);
      replace(pane, head, h("p", { class: "muted" }, "Loading…"));
      try {
        const text = await api(`/api/volumes/${enc(name)}/text?path=${enc(e.path)}&offset=0&length=${PREVIEW_BYTES}`);
        replace(pane, head,
          text.truncated ? h("p", { class: "muted small" }, `Showing the first ${fmtBytes(text.bytes_read)} of ${fmtBytes(text.size)}.`) : null,
          preview(e.path, text.content, text.truncated));
      } catch (err) {
        replace(pane, head, errorBox(err));
      }
    }

    const picker = h("input", { type: "file", multiple: true });
    const uploadForm = h("form", { class: "inline-form", onsubmit: async (ev) => {
      ev.preventDefault();
      const files = [...picker.files];
      if (!files.length) return;
      try {
        for (const f of files) {
          const path = `${folder}/${f.name}`;
          await api(`/api/volumes/${enc(name)}/raw?path=${enc(path)}`, { method: "PUT", body: f,
            headers: { "Content-Type": "application/octet-stream" } });
        }
        toast(`Uploaded ${files.length} file(s) to ${name}/${folder}.`);
        picker.value = "";
        refreshFolder(folder);
        loadVolumes();
      } catch (err) {
        toast(err.message, "error");
      }
    } }, field("Upload files", picker).row, h("button", { type: "submit" }, "Upload"), folderLabel);
    const dropVolume = h("button", { type: "button", class: "danger small", onclick: async () => {
      if (!(await confirmDialog(`Delete the volume ${name} and every file in it? This cannot be undone.`))) return;
      try {
        await api(`/api/volumes/${enc(name)}`, { method: "DELETE" });
        toast(`Volume ${name} deleted.`);
        current = null;
        replace(detail);
        loadVolumes();
      } catch (err) {
        toast(err.message, "error");
      }
    } }, "Delete volume");
    replace(detail, h("div", { class: "detail-head" }, h("h2", {}, name), dropVolume), uploadForm,
      h("div", { class: "browser" }, h("nav", { class: "tree-wrap", "aria-label": `Folders of ${name}` }, tree), pane));
    loadFolder("", tree);
  }

  replace(main, h("h1", {}, "Volumes"),
    h("div", { class: "volumes-layout" },
      h("section", { class: "card", "aria-label": "All volumes" }, list, create, createStatus),
      h("section", { class: "card", "aria-label": "Volume contents" }, detail)));
  loadVolumes().then((vols) => { if (vols.length && !current) openVolume(vols[0].name); });
}
