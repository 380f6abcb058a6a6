// Workbench, Chat mode: a conversation with the workspace agent (docs/agent.md). Replies stream in;
// tool calls show as cards (RLM runs link to their traces); an action with side effects shows an
// approval card (Approve, Always, Reject with a reason) and the turn waits until it is answered
// here, in the terminal or over MCP, even across a server restart. Every text comes from a model or
// a person, so it only ever goes in through text nodes (dom.js `h`).

import { api, readEvents, request, upload } from "../api.js";
import { errorBox, field, filePicker, fmtBytes, h, replace, toast } from "../dom.js";

const TITLE_SOURCE = 200; // characters of the first message the server makes its title of (the API's most)
// Survives leaving the page: the conversation is shown again on return.
const state = { conversationId: null };

/** POST JSON and read the answer as Server-Sent Events; calls onEvent(event) per frame. */
async function streamPost(path, json, onEvent) {
  const resp = await request(path, {
    method: "POST", body: JSON.stringify(json),
    headers: { "Content-Type": "application/json", Accept: "text/event-stream" },
  });
  await readEvents(resp.body, (frame) => {
    let event;
    try { event = JSON.parse(frame.data); } catch { return; } // a frame without an event
    onEvent(event);
  });
}

const LONG_RESULT = 600; // characters: a longer tool result starts collapsed

function pretty(value) {
  try { return JSON.stringify(value, null, 2); } catch { return String(value); }
}

/** A tool's result, readably: a JSON object as key/value rows (an unset value left out, nested ones
 *  pretty-printed), other JSON pretty-printed, anything else (an error, a cut dump) as its text. */
function resultView(text) {
  let value;
  try { value = JSON.parse(text); } catch { return h("pre", {}, text); }
  if (!value || typeof value !== "object" || Array.isArray(value)) return h("pre", {}, pretty(value));
  return h("dl", { class: "kv" }, Object.entries(value).filter(([, v]) => v !== null).map(([key, v]) =>
    [h("dt", {}, key), h("dd", {}, typeof v === "object" ? h("pre", {}, pretty(v)) : String(v))]));
}

/** A tool call as a card; `result(text)` fills in what it returned, `progress(line)` an RLM run's state. */
function toolCard(call) {
  const status = h("p", { class: "muted small tool-status" });
  const links = h("p", { class: "small" });
  const result = h("div", { class: "tool-result", hidden: true });
  const el = h("div", { class: "tool-card", dataset: { call: call.call_id || "" } },
    h("p", { class: "tool-name" }, h("strong", {}, call.tool), " ", h("span", { class: "muted small" }, "tool call")),
    h("details", {}, h("summary", {}, "Arguments"), h("pre", {}, pretty(call.arguments || {}))),
    status, links, result);
  const linkRun = (runId) => {
    if (links.querySelector(`[data-run="${CSS.escape(runId)}"]`)) return;
    links.append(h("a", { href: `#/runs/${encodeURIComponent(runId)}`, dataset: { run: runId } }, `Trace of run ${runId}`), " ");
  };
  return {
    el,
    progress: (line) => { status.textContent = line; },
    linkRun,
    result: (text) => {
      result.hidden = false;
      const view = resultView(text);
      replace(result, text.length > LONG_RESULT
        ? h("details", {}, h("summary", {}, `Result (${text.length.toLocaleString()} characters)`), view) : view);
      try { const parsed = JSON.parse(text); if (parsed && parsed.run_id) linkRun(parsed.run_id); } catch { /* text */ }
    },
  };
}

/** An approval card; answering it streams the resumed turn into the log. A blocked call (its summary
 *  cannot show it exactly) offers Reject only, as the server refuses to approve it. */
function approvalCard(approval, onAnswer) {
  const reason = h("input", { type: "text", maxlength: "2000", placeholder: "Why (the agent reads it)" });
  const approveButtons = approval.blocked ? [] : [
    h("button", { type: "button", class: "small", onclick: () => onAnswer(approval, true, false, reason.value) }, "Approve"),
    h("button", { type: "button", class: "secondary small", onclick: () => onAnswer(approval, true, true, reason.value) },
      "Always in this conversation"),
  ];
  const buttons = [...approveButtons,
    h("button", { type: "button", class: "danger small", onclick: () => onAnswer(approval, false, false, reason.value) }, "Reject"),
  ];
  const expires = new Date(approval.expires_at * 1000).toLocaleString();
  return h("div", { class: "approval-card card", role: "group", "aria-label": `Approval for ${approval.tool}`,
    dataset: { approval: approval.id } },
    h("p", { class: "approval-summary" }, h("strong", {}, "The agent asks to: "), approval.summary),
    approval.blocked ? h("p", { class: "warning" }, `It cannot be approved: ${approval.blocked}.`) : null,
    h("p", { class: "muted small" }, `Tool ${approval.tool} · waits until ${expires}`),
    field("Reason", reason).row, h("div", { class: "actions" }, buttons));
}

export function renderChat(main) {
  let closed = false;
  let busy = false;
  const list = h("ul", { class: "plain conv-list", "aria-label": "Conversations" });
  const log = h("div", { class: "chat-log", role: "log", "aria-live": "polite", "aria-label": "Conversation" });
  const audit = h("ol", { class: "audit small" });
  const status = h("div", { class: "form-status", "aria-live": "polite" });
  const message = h("textarea", { rows: "3", placeholder: "Ask the agent about your workspace…", id: "chat-input" });
  const picker = filePicker("Attach files");
  const send = h("button", { type: "submit", id: "chat-send" }, "Send");
  const uploads = [];
  const chips = h("ul", { class: "chips", "aria-label": "Files to attach" });
  const renderChips = () => replace(chips, uploads.map((u) => h("li", { class: "chip" }, `${u.name} (${fmtBytes(u.size)})`)));
  picker.input.addEventListener("change", async () => {
    try {
      uploads.push(...await upload([...picker.input.files]));
      renderChips();
    } catch (err) {
      replace(status, errorBox(err));
    }
    picker.input.value = "";
  });

  const cards = new Map(); // call id -> tool card of the shown conversation
  let bubble = null; // the assistant reply streaming now

  const say = (role, text) => {
    const el = h("div", { class: `msg ${role}` }, h("span", { class: "who" }, role === "user" ? "You" : "Agent"),
      h("div", { class: "text" }, text));
    log.append(el);
    return el.querySelector(".text");
  };

  const onEvent = (ev) => {
    if (closed) return;
    if (ev.kind === "text") {
      if (!bubble) bubble = say("assistant", "");
      bubble.textContent += ev.text;
    } else if (ev.kind === "tool.call") {
      bubble = null;
      const card = toolCard(ev);
      cards.set(ev.call_id, card);
      log.append(card.el);
    } else if (ev.kind === "tool.result") {
      bubble = null;
      if (cards.get(ev.call_id)) cards.get(ev.call_id).result(ev.result);
    } else if (ev.kind === "run.started" || ev.kind === "run.progress" || ev.kind === "run.finished") {
      const card = [...cards.values()].pop();
      if (card) {
        card.linkRun(ev.run_id);
        card.progress(ev.kind === "run.finished" ? `run ${ev.status}` : ev.message || "run started");
      }
    } else if (ev.kind === "approval.requested") {
      log.append(approvalCard(ev.approval, answer));
    } else if (ev.kind === "turn.finished" && ev.status !== "done" && ev.status !== "paused") {
      log.append(errorBox(new Error(ev.error || `The turn ${ev.status}.`)));
    }
    log.scrollTop = log.scrollHeight;
  };

  /** Show a stored conversation: messages, tool cards with results, pending approvals, the audit log. */
  const show = (conv) => {
    cards.clear();
    bubble = null;
    replace(log);
    for (const m of conv.messages) {
      if (m.kind === "text") say(m.role, m.text || "");
      else if (m.kind === "tool_call") onEvent({ kind: "tool.call", call_id: m.call_id, tool: m.tool, arguments: m.arguments });
      else if (m.kind === "tool_result") onEvent({ kind: "tool.result", call_id: m.call_id, result: m.text || "" });
    }
    for (const run of conv.runs) {
      const card = [...cards.values()].find((c) => c.el.textContent.includes(run.run_id));
      if (card) card.progress(`run ${run.status}`);
    }
    for (const a of conv.approvals.filter((x) => x.status === "pending")) log.append(approvalCard(a, answer));
    replace(audit, conv.audit.map((e) => h("li", {},
      `${new Date(e.created_at * 1000).toLocaleString()} · ${e.action} by ${e.actor}: ${e.summary}`,
      e.reason ? ` (${e.reason})` : "")));
    log.scrollTop = log.scrollHeight;
  };

  const refresh = async () => {
    const res = await api("/api/conversations");
    if (closed) return;
    replace(list, res.conversations.map((c) => h("li", {},
      h("button", { type: "button", class: c.id === state.conversationId ? "link current" : "link",
        "aria-current": c.id === state.conversationId ? "true" : null,
        onclick: () => open(c.id) }, c.title), c.pending ? h("span", { class: "badge warn" }, ` ${c.pending} waiting`) : null)));
    if (state.conversationId) show(await api(`/api/conversations/${encodeURIComponent(state.conversationId)}`));
  };

  const open = async (id) => {
    state.conversationId = id;
    try { await refresh(); } catch (err) { replace(status, errorBox(err)); }
  };

  async function run(work) {
    busy = true;
    send.disabled = true;
    replace(status);
    try {
      await work();
    } catch (err) {
      replace(status, errorBox(err));
    } finally {
      busy = false;
      send.disabled = false;
      bubble = null;
      if (!closed) await refresh().catch((err) => replace(status, errorBox(err)));
    }
  }

  async function answer(approval, approve, always, reason) {
    if (busy) { toast("Wait for the agent to finish first."); return; }
    for (const card of log.querySelectorAll(`[data-approval="${CSS.escape(approval.id)}"] button`)) card.disabled = true;
    await run(() => streamPost(`/api/approvals/${encodeURIComponent(approval.id)}`,
      { approve, always, reason: reason.trim() || null }, onEvent));
  }

  const form = h("form", { class: "card ask chat-form", "aria-label": "Message the agent" },
    field("Message", message, "Ctrl+Enter sends. Attached files are read by the agent's RLM runs.").row,
    picker.row, chips, h("div", { class: "actions" }, send), status);
  message.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) { e.preventDefault(); form.requestSubmit(); }
  });
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    const text = message.value.trim();
    if (!text) { replace(status, errorBox(new Error("Write a message first."))); return; }
    if (busy) return;
    run(async () => {
      if (!state.conversationId) {
        state.conversationId = (await api("/api/conversations", { method: "POST", json: { title: text.slice(0, TITLE_SOURCE) } })).id;
      }
      const ids = uploads.splice(0).map((u) => u.upload_id);
      renderChips();
      message.value = "";
      say("user", text);
      await streamPost(`/api/conversations/${encodeURIComponent(state.conversationId)}/turns`,
        { message: text, upload_ids: ids }, onEvent);
    });
  });
  const newConv = h("button", { type: "button", class: "ghost small", onclick: () => {
    state.conversationId = null;
    replace(log);
    replace(audit);
    refresh().catch((err) => replace(status, errorBox(err)));
    message.focus();
  } }, "New conversation");

  replace(main, h("div", { class: "chat" },
    h("aside", { class: "card conv-side" }, h("h2", {}, "Conversations"), newConv, list),
    h("section", { class: "chat-main" }, log, form,
      h("details", { class: "card" }, h("summary", {}, "Approval log"), audit))));
  refresh().catch((err) => replace(status, errorBox(err)));
  return () => { closed = true; };
}
