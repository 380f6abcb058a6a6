// Workbench: ask a question over files (documents and images too), pasted text, web pages, a git
// repository and volume files; watch the trace stream in and see what went in; read and copy the
// answer; ask follow-ups in the same session (the same REPL, its variables kept).

import { api, followRun, upload } from "../api.js";
import { badge, errorBox, field, filePicker, fmtBytes, h, replace, toast } from "../dom.js";
import { inputsPanel } from "../inputs.js";
import { TraceModel, TraceTree, answerBlock } from "../trace.js";
import { renderChat } from "./chat.js";

// Survives leaving the page: the session and its turns are shown again (replayed) on return.
const state = { sessionId: null, turns: [] };

const LIMITS = [
  ["max_iters", "Steps per RLM", "1"],
  ["max_depth", "Child RLM depth", "0"],
  ["max_llm_calls", "Model calls", "1"],
  ["max_seconds", "Seconds", "1"],
  ["max_cost", "Cost (USD)", "0.01"],
  ["max_tokens", "Tokens", "1"],
];

/** Files dropped or picked: uploaded at once, so Run only waits for the last one. */
function attachments() {
  const items = [];
  const list = h("ul", { class: "chips", "aria-label": "Attached files" });
  const render = () => {
    replace(list, items.map((it) => h("li", { class: `chip ${it.status}` },
      h("span", {}, `${it.file.name} (${fmtBytes(it.file.size)})`),
      h("span", { class: "muted small" }, it.status === "failed" ? ` failed: ${it.error}` : ` ${it.status}`),
      h("button", { type: "button", class: "icon", "aria-label": `Remove ${it.file.name}`,
        onclick: () => { items.splice(items.indexOf(it), 1); render(); } }, "×"))));
  };
  const add = (files) => {
    for (const file of files) {
      const it = { file, status: "uploading", id: null, error: null };
      it.done = upload([file]).then(
        ([u]) => { it.id = u.upload_id; it.status = "ready"; },
        (err) => { it.status = "failed"; it.error = err.message; },
      ).finally(render);
      items.push(it);
    }
    render();
  };
  return { list, add, items, clear: () => { items.length = 0; render(); } };
}

/** Pick files of a volume: a folder-by-folder listing with Add buttons. */
function volumePicker(onAdd) {
  const select = h("select", {});
  const listing = h("div", { class: "vol-listing" });
  let path = "";
  const show = async () => {
    const vol = select.value;
    if (!vol) { replace(listing, h("p", { class: "muted" }, "No volumes yet: create one on the Volumes page.")); return; }
    try {
      const res = await api(`/api/volumes/${encodeURIComponent(vol)}/files?path=${encodeURIComponent(path)}`);
      const up = path ? h("li", {}, h("button", { type: "button", class: "link", onclick: () => {
        path = path.split("/").slice(0, -1).join("/"); show(); } }, "↑ up")) : null;
      replace(listing, h("p", { class: "muted small" }, `${vol}/${path}`), h("ul", { class: "plain" }, up,
        res.entries.map((e) => {
          const name = e.path.split("/").pop();
          return e.type === "dir"
            ? h("li", {}, h("button", { type: "button", class: "link", onclick: () => { path = e.path; show(); } }, `${name}/`))
            : h("li", {}, `${name} (${fmtBytes(e.size)}) `, h("button", { type: "button", class: "small",
              "aria-label": `Add ${e.path} as context`, onclick: () => onAdd(`vol:${vol}/${e.path}`) }, "Add"));
        })));
    } catch (err) {
      replace(listing, errorBox(err));
    }
  };
  select.addEventListener("change", () => { path = ""; show(); });
  const el = h("details", { class: "vol-picker" }, h("summary", {}, "Add files from a volume"),
    field("Volume", select).row, listing);
  el.addEventListener("toggle", async () => {
    if (!el.open || select.options.length) return;
    try {
      const res = await api("/api/volumes");
      replace(select, res.volumes.map((v) => h("option", { value: v.name }, v.name)));
    } catch (err) {
      replace(listing, errorBox(err));
      return;
    }
    show();
  });
  return el;
}

/** Which model runs, or that none is set: the first thing to fix on a fresh machine. */
function modelStatus() {
  const line = h("div", { id: "model-status", class: "model-status small" }, "Checking the model…");
  const settingsLink = (text) => h("a", { href: "#/settings" }, text);
  api("/api/settings").then(({ settings }) => {
    const model = settings.find((s) => s.name === "lm_model");
    if (model && model.value) replace(line, "Model: ", h("code", {}, String(model.value)), " · ", settingsLink("change it in Settings"));
    else replace(line, h("strong", { class: "error" }, "No model configured"), ": runs need one. ", settingsLink("Set the root model in Settings"));
  }, (err) => replace(line, errorBox(err)));
  return line;
}

/** What to do first, in the space the runs will fill: three steps, and the sample of a checkout as a first context. */
function firstSteps(useSample) {
  const sample = h("div", {}, h("p", { class: "muted small" }, "Looking for the sample…"));
  api("/api/sample").then((found) => replace(sample, found.path
    ? h("button", { type: "button", class: "secondary", onclick: () => useSample(found) }, "Use the sample: incident logs")
    : h("p", { class: "muted small" }, "A sample to try ships with a fleet-rlm checkout: examples/incident/, the logs of a "
      + "failed deploy (examples/README.md). This server cannot read it here, so start with files of your own.")),
  (err) => replace(sample, errorBox(err)));
  return h("section", { id: "first-steps", class: "card", "aria-labelledby": "first-steps-title" },
    h("h2", { id: "first-steps-title" }, "First steps"),
    h("ol", {},
      h("li", {}, "Set a model in ", h("a", { href: "#/settings" }, "Settings"), " if the line above says none is configured."),
      h("li", {}, "Give the context: drop or choose files (documents and images too), paste text, name web pages "
        + "or a repository, pick files of a volume, or use the sample."),
      h("li", {}, "Write a question and press Run: the trace grows here step by step, and the answer appears above it.")),
    sample);
}

/** One question and its run: live trace, status, stop, answer. */
function turnView(turn) {
  const status = h("span", {}, badge("queued"));
  const stop = h("button", { type: "button", class: "danger small", onclick: async () => {
    stop.disabled = true;
    try {
      const res = await api(`/api/runs/${encodeURIComponent(turn.runId)}/cancel`, { method: "POST" });
      toast(res.message || "Stopping the run…");
    } catch (err) {
      stop.disabled = false;
      toast(err.message, "error");
    }
  } }, "Stop");
  const traceBox = h("div", { class: "trace-box" });
  const answer = h("div", { class: "answer-slot" });
  const inputs = h("div", { class: "inputs-slot" });
  const connection = h("span", { class: "muted small" });
  const el = h("article", { class: "turn card", dataset: { run: turn.runId }, "aria-label": `Run ${turn.runId}` },
    h("header", { class: "turn-head" },
      h("h2", { class: "question" }, turn.question),
      h("div", { class: "turn-meta" }, status, stop, connection,
        h("a", { href: `#/runs/${encodeURIComponent(turn.runId)}` }, "Open in Runs"))),
    inputs, answer, traceBox);
  const tree = new TraceTree(traceBox, new TraceModel());
  // What went in is the server's view of the run (GET /api/runs/ID), asked for once the context is loaded.
  const showInputs = () => api(`/api/runs/${encodeURIComponent(turn.runId)}`).then(
    (s) => replace(inputs, inputsPanel(s.inputs)), () => {});
  const finish = (run) => {
    replace(status, badge(run.status));
    stop.hidden = true;
    connection.textContent = "";
    replace(answer, answerBlock(run));
  };
  const follower = followRun(turn.runId, {
    onEvent: (ev) => {
      tree.feed(ev);
      if (ev.kind === "run.started") replace(status, badge("running"));
      if (ev.kind === "context.loaded") showInputs();
    },
    onEnd: (ev, runState) => finish(ev ? { ...ev.data } : runState),
    onState: (s) => { connection.textContent = s === "live" ? "" : s; },
  });
  return { el, close: () => follower.close() };
}

/** Run mode: one question over inputs, its trace streaming in. */
function renderRunMode(main) {
  const views = [];
  const question = h("textarea", { rows: "3", required: true, placeholder: "What do you want to know about the inputs?" });
  const pasted = h("textarea", { rows: "3", placeholder: "Optional: paste text to use as context" });
  const pages = h("textarea", { rows: "2", placeholder: "https://example.com/report.html", spellcheck: "false",
    autocomplete: "off", inputmode: "url" });
  const repoUrl = h("input", { type: "url", placeholder: "https://github.com/owner/project", spellcheck: "false",
    autocomplete: "off" });
  const repoRef = h("input", { type: "text", placeholder: "default branch", spellcheck: "false", autocomplete: "off" });
  const contextPaths = [];
  const pathChips = h("ul", { class: "chips", "aria-label": "Files and folders added" });
  const renderPathChips = () => replace(pathChips, contextPaths.map((p) => h("li", { class: "chip" }, h("span", {}, p),
    h("button", { type: "button", class: "icon", "aria-label": `Remove ${p}`,
      onclick: () => { contextPaths.splice(contextPaths.indexOf(p), 1); renderPathChips(); } }, "×"))));
  const addPath = (p) => { if (!contextPaths.includes(p)) contextPaths.push(p); renderPathChips(); };
  const files = attachments();
  const { row: pickerRow, input: picker } = filePicker("Choose files");
  picker.addEventListener("change", () => { files.add([...picker.files]); picker.value = ""; });
  const drop = h("div", { class: "dropzone" },
    h("p", {}, "Drop documents, images or text files here, or choose them:"), pickerRow,
    h("p", { class: "muted small" }, "PDF, Word, PowerPoint, Excel, EPUB, notebooks and HTML are read as text; "
      + "PNG, JPEG, GIF and WebP images are kept for sub-queries to a vision model."), files.list);
  drop.addEventListener("dragover", (e) => { e.preventDefault(); drop.classList.add("over"); });
  drop.addEventListener("dragleave", () => drop.classList.remove("over"));
  drop.addEventListener("drop", (e) => {
    e.preventDefault();
    drop.classList.remove("over");
    if (e.dataTransfer && e.dataTransfer.files.length) files.add([...e.dataTransfer.files]);
  });
  const limitInputs = Object.fromEntries(LIMITS.map(([name, , step]) =>
    [name, h("input", { type: "number", min: "0", step, inputmode: "decimal", placeholder: "default", name })]));
  // The MCP servers configured in Settings, one checkbox each: a run mounts only those ticked.
  const serverBoxes = h("div", { class: "server-boxes" });
  const servers = h("fieldset", { class: "mcp-servers", hidden: true },
    h("legend", {}, "Tools from MCP servers"), serverBoxes,
    h("p", { class: "muted small" }, "Their tools become functions in the REPL (server.tool(...)); tools not marked "
      + "read-only are refused unless allowed. Servers are configured in Settings (mcp_servers)."));
  api("/api/settings").then(({ settings }) => {
    const row = settings.find((s) => s.name === "mcp_servers");
    const names = Object.keys((row && row.value) || {}).sort();
    replace(serverBoxes, names.map((name) => {
      const spec = row.value[name] || {};
      const where = spec.url || [spec.command, ...(spec.args || [])].filter(Boolean).join(" ");
      return h("label", {}, h("input", { type: "checkbox", name: "mcp_server", value: name }),
        ` ${name} `, h("span", { class: "muted small" }, where));
    }));
    servers.hidden = names.length === 0;
  }).catch(() => {});  // no servers shown: a run then mounts none, which is the default anyway
  const run = h("button", { type: "submit", id: "run-button" }, "Run");
  const formStatus = h("div", { class: "form-status", "aria-live": "polite" });
  const sessionLine = h("p", { class: "muted small session-line" });
  const newSession = h("button", { type: "button", class: "ghost small", onclick: async () => {
    const old = state.sessionId;
    state.sessionId = null;
    state.turns = [];
    for (const v of views.splice(0)) v.close();
    replace(turns);
    showSession();
    if (old) await api(`/api/sessions/${encodeURIComponent(old)}`, { method: "DELETE" }).catch(() => {});
  } }, "New session");
  const qLabel = h("span", {}, "Question");
  const showSession = () => {
    const follow = state.turns.length > 0;
    qLabel.textContent = follow ? "Follow-up question (same session: the REPL keeps its variables)" : "Question";
    run.textContent = follow ? "Ask follow-up" : "Run";
    sessionLine.textContent = state.sessionId ? `Session ${state.sessionId} · ${state.turns.length} run(s)` : "";
    newSession.hidden = !state.sessionId;
    guide.hidden = follow;
  };
  const qField = field(qLabel, question, "Ctrl+Enter runs.");
  question.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) { e.preventDefault(); form.requestSubmit(); }
  });
  const form = h("form", { class: "card ask", "aria-labelledby": "wb-title" },
    qField.row,
    h("fieldset", {}, h("legend", {}, "Context"), drop, field("Pasted text", pasted).row,
      field("Web pages", pages, "One URL per line, fetched by the server as text.").row,
      h("div", { class: "repo-fields" }, field("Repository", repoUrl, "A git URL, cloned shallowly.").row,
        field("Branch or tag", repoRef).row),
      volumePicker(addPath), pathChips),
    servers,
    h("details", { class: "limits" }, h("summary", {}, "Limits"),
      h("div", { class: "grid-limits" }, LIMITS.map(([name, label]) => field(label, limitInputs[name]).row)),
      h("p", { class: "muted small" }, "Empty: the defaults from Settings.")),
    h("div", { class: "actions" }, run, newSession, sessionLine),
    formStatus);
  const turns = h("div", { class: "turns" });
  const guide = firstSteps((sample) => {
    addPath(sample.path);
    if (!question.value.trim()) question.value = sample.question;
    question.focus();
  });

  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    replace(formStatus);
    const text = question.value.trim();
    if (!text) { replace(formStatus, errorBox(new Error("Write a question first."))); question.focus(); return; }
    if (repoRef.value.trim() && !repoUrl.value.trim()) {
      replace(formStatus, errorBox(new Error("A branch or tag needs its repository: give the repository's URL, "
        + "or clear the branch or tag.")));
      repoUrl.focus();
      return;
    }
    run.disabled = true;
    try {
      if (files.items.some((it) => it.status === "uploading")) {
        formStatus.textContent = "Waiting for uploads to finish…";
        await Promise.all(files.items.map((it) => it.done));
      }
      const failed = files.items.filter((it) => it.status === "failed");
      if (failed.length) throw new Error(`Upload failed for ${failed.map((f) => f.file.name).join(", ")}: remove it or try again.`);
      if (!state.sessionId) {
        state.sessionId = (await api("/api/sessions", { method: "POST", json: { name: text.slice(0, 60) } })).id;
      }
      const body = { question: text, session_id: state.sessionId, upload_ids: files.items.map((it) => it.id),
        context_paths: [...contextPaths], context_text: pasted.value.trim() ? [pasted.value] : [],
        context_urls: pages.value.split("\n").map((u) => u.trim()).filter(Boolean) };
      // The server checks the URLs and the ref (a 400 with its message); a ref alone is caught here already.
      if (repoUrl.value.trim()) body.repo_url = repoUrl.value.trim();
      const ticked = [...serverBoxes.querySelectorAll("input:checked")].map((box) => box.value);
      if (ticked.length) body.mcp_servers = ticked;
      if (repoRef.value.trim()) body.repo_ref = repoRef.value.trim();
      for (const [name, input] of Object.entries(limitInputs)) {
        if (input.value !== "") body[name] = Number(input.value);
      }
      const res = await api("/api/runs", { method: "POST", json: body });
      const turn = { runId: res.run_id, question: text };
      state.turns.push(turn);
      const view = turnView(turn);
      views.push(view);
      turns.prepend(view.el);
      view.el.scrollIntoView({ block: "nearest" });
      question.value = "";
      pasted.value = "";
      pages.value = "";
      repoUrl.value = "";
      repoRef.value = "";
      files.clear();
      contextPaths.length = 0;
      renderPathChips();
      formStatus.textContent = "";
      showSession();
    } catch (err) {
      replace(formStatus, errorBox(err));
    } finally {
      run.disabled = false;
    }
  });

  replace(main, h("div", { class: "workbench" }, form, h("div", {}, guide, turns)));
  for (const turn of state.turns) {
    const view = turnView(turn);
    views.push(view);
    turns.prepend(view.el);
  }
  showSession();
  return () => { for (const v of views) v.close(); };
}

/** The page: Run mode (above) or Chat mode (pages/chat.js: the workspace agent), switched by tabs. Each
 *  mode has its own address (#/workbench, #/workbench/chat), so Back and bookmarks keep it. */
export function renderWorkbench(main, params = {}) {
  const current = params.mode === "chat" ? "chat" : "run";
  const body = h("div", { id: "wb-mode", role: "tabpanel", "aria-labelledby": `wb-tab-${current}` });
  const tabs = [["run", "Run", "#/workbench"], ["chat", "Chat", "#/workbench/chat"]].map(([mode, label, route]) =>
    h("button", { type: "button", role: "tab", class: "ghost small", id: `wb-tab-${mode}`, "aria-controls": "wb-mode",
      "aria-selected": String(mode === current), onclick: () => { location.hash = route; } }, label));
  replace(main, h("h1", { id: "wb-title" }, "Workbench"), modelStatus(),
    h("div", { role: "tablist", class: "mode-tabs", "aria-label": "Workbench mode" }, tabs), body);
  return (current === "chat" ? renderChat : renderRunMode)(body);
}
