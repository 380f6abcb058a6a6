// Settings: models, API bases and keys, the sandbox and Daytona. Keys go to the OS keyring and are
// only ever shown masked; a key field starts empty and leaving it empty keeps the stored key.
// Also: "test connection" buttons and what doctor says (keyring backend, sandbox isolation, caps).

import { api } from "../api.js";
import { errorBox, field, fmtBytes, h, replace, toast } from "../dom.js";

const GROUPS = [
  ["Root model", ["lm_model", "lm_api_base", "lm_api_key", "lm_price_per_mtok_in", "lm_price_per_mtok_out"]],
  ["Sub model (llm_query)", ["sub_lm_model", "sub_lm_api_base", "sub_lm_api_key", "sub_lm_price_per_mtok_in",
    "sub_lm_price_per_mtok_out"]],
  ["Sandbox", ["sandbox", "daytona_api_key", "daytona_api_url", "daytona_target"]],
];

// What each setting is called here; its key (`lm_model`) is shown small beside it, for `fleet-rlm config set`.
const LABELS = {
  home: "Data folder",
  lm_model: "Root model", lm_api_base: "Root model API base URL", lm_api_key: "Root model API key",
  lm_price_per_mtok_in: "Root model price per million prompt tokens (USD)",
  lm_price_per_mtok_out: "Root model price per million reply tokens (USD)",
  sub_lm_model: "Sub model", sub_lm_api_base: "Sub model API base URL", sub_lm_api_key: "Sub model API key",
  sub_lm_price_per_mtok_in: "Sub model price per million prompt tokens (USD)",
  sub_lm_price_per_mtok_out: "Sub model price per million reply tokens (USD)",
  lm_max_tokens: "Max tokens per reply", lm_retries: "Model call retries", lm_timeout: "Model call timeout (seconds)",
  prompt_cache: "Prompt cache (Anthropic)",
  sandbox: "Sandbox backend", isolation: "Local sandbox isolation", exec_timeout: "Step time limit (seconds)",
  memory_mb: "Sandbox memory (MB)", max_procs: "Sandbox processes and threads", output_chars: "Output the model sees (characters)",
  work_quota_mb: "Work folder quota (MB)", work_max_files: "Work folder entries",
  host_call_mb: "Host-call data per sandbox (MB)", host_call_total_mb: "Host-call data in all (MB)",
  subcall_max_chars: "Longest llm_query prompt (characters)",
  max_iters: "Steps per RLM", max_llm_calls: "Model calls per run", max_depth: "Child RLM depth",
  max_seconds: "Seconds per run", max_cost: "Cost per run (USD)", max_tokens: "Tokens per run",
  lm_context_window: "Root model context window (tokens)", sub_lm_context_window: "Sub model context window (tokens)",
  compact_at: "Compact the transcript at (share of the window)",
  concurrency: "Concurrent sub-queries", child_concurrency: "Concurrent child RLMs",
  context_roots: "Context folders allowed", session_idle_seconds: "Session idle timeout (seconds)",
  volume_quota_mb: "Volume quota (MB)", volume_max_files: "Volume entries", upload_max_mb: "Largest upload (MB)",
  retention_days: "Keep runs for (days)", otel: "OpenTelemetry export", otel_endpoint: "OpenTelemetry collector URL",
  daytona_api_key: "Daytona API key", daytona_api_url: "Daytona API URL", daytona_target: "Daytona target region",
  daytona_snapshot: "Daytona snapshot", daytona_network: "Daytona network egress",
  daytona_children: "Daytona child RLMs", daytona_max_sandboxes: "Daytona sandboxes at once",
  daytona_auto_stop_minutes: "Daytona auto-stop (minutes)", daytona_cost_per_hour: "Daytona cost per hour (USD)",
  daytona_volume_prefix: "Daytona volume prefix",
  mcp_token: "MCP and web token",
  agent_lm_model: "Agent model", agent_lm_api_base: "Agent model API base URL", agent_lm_api_key: "Agent model API key",
  agent_volume: "Agent volume", agent_approval_ttl_seconds: "Approval wait (seconds)",
  agent_run_cost_threshold: "Agent run cost needing approval (USD)", agent_fetch_max_mb: "Largest agent download (MB)",
  agent_allowed_hosts: "Private hosts the agent may fetch (older name)",
  fetch_allowed_hosts: "Private hosts runs and the agent may fetch",
  fetch_max_mb: "Largest page or repository a run fetches (MB)",
};

function sourceNote(s) {
  if (s.overridden_by_env) return "set in the environment, which wins over what is saved here";
  return s.set ? `from ${s.source}` : "not set";
}

const CHOICES = { sandbox: ["local", "daytona"] };

function inputFor(s) {
  if (CHOICES[s.name]) {
    const options = [...new Set([...CHOICES[s.name], String(s.value ?? "")])].filter(Boolean);
    return h("select", { name: s.name, dataset: { setting: s.name } }, options.map((o) => h("option", { value: o }, o)));
  }
  return h("input", { type: s.secret ? "password" : "text", name: s.name, autocomplete: s.secret ? "new-password" : "off",
    spellcheck: "false", dataset: { setting: s.name } });
}

/** One setting's input. Secrets: a password field that is never filled with the value. */
function settingField(s, save) {
  const input = inputFor(s);
  if (s.secret) {
    input.placeholder = s.set ? "leave empty to keep the stored key" : "not set";
  } else {
    const shown = s.value !== null && typeof s.value === "object" ? JSON.stringify(s.value) : s.value;  // models: JSON
    input.value = shown === null || shown === undefined ? "" : String(shown);
    if (input.tagName === "INPUT") input.placeholder = "default";
    input.dataset.initial = input.value;
  }
  if (s.restart_only) input.disabled = true;  // the server refuses it: say how instead
  const name = LABELS[s.name] || s.name;
  const label = s.secret ? `${name} (stored in the keyring)` : name;
  const note = s.restart_only ? `Read-only here: ${s.restart_only}.` : sourceNote(s);
  const { row } = field(label, input, [h("code", { class: "key" }, s.name), " · ", s.description ? `${s.description} · ` : "", note]);
  if (s.secret) {
    // The server sends a secret masked or not at all: only whether it is set, never the key.
    const shown = h("span", { class: "masked", dataset: { masked: s.name } },
      s.set ? `${s.value || "set"} (${s.source})` : "not set");
    const remove = s.source === "keyring"
      ? h("button", { type: "button", class: "link small", onclick: () => save({ [s.name]: null }) }, "Remove from the keyring")
      : null;
    row.append(h("div", { class: "small" }, "Stored: ", shown, " ", remove));
  }
  return row;
}

function checkResult(slot, res) {
  replace(slot, h("p", { class: res.ok ? "ok" : "error", role: "status" }, res.ok ? "✓ " : "✗ ", res.detail || "",
    res.fix ? h("span", { class: "muted" }, ` Fix: ${res.fix}`) : null));
}

function checkButton(label, path) {
  const slot = h("div", { class: "check-result" });
  const button = h("button", { type: "button", class: "secondary", onclick: async () => {
    button.disabled = true;
    replace(slot, h("p", { class: "muted" }, "Checking…"));
    try {
      checkResult(slot, await api(path, { method: "POST" }));
    } catch (err) {
      replace(slot, errorBox(err));
    } finally {
      button.disabled = false;
    }
  } }, label);
  return h("div", { class: "check" }, button, slot);
}

function doctorView(report) {
  const keyring = report.keyring || {};
  const sandbox = report.sandbox || {};
  const caps = (report.caps && report.caps.caps) || [];
  return [
    h("dl", { class: "meta" },
      h("div", {}, h("dt", {}, "Keyring backend"), h("dd", { dataset: { doctor: "keyring" } }, keyring.detail || "unknown",
        keyring.ok === false ? h("span", { class: "error" }, " (not usable: keys must come from the environment)") : null)),
      h("div", {}, h("dt", {}, "Sandbox isolation"), h("dd", { dataset: { doctor: "isolation" } }, sandbox.isolation || "–")),
      h("div", {}, h("dt", {}, "Sandbox"), h("dd", {}, sandbox.detail || "–"))),
    caps.length ? h("div", { class: "table-wrap" }, h("table", { class: "caps" },
      h("caption", {}, "Sandbox caps"),
      h("thead", {}, h("tr", {}, ["Cap", "Limit", "Enforced", "How"].map((c) => h("th", { scope: "col" }, c)))),
      h("tbody", {}, caps.map((c) => h("tr", {}, h("th", { scope: "row" }, c.name), h("td", {}, c.limit),
        h("td", {}, c.enforced ? "yes" : "no"), h("td", {}, c.enforced ? c.how : c.why_not)))))) : null,
  ];
}

export function renderSettings(main) {
  const form = h("form", { class: "card settings", "aria-labelledby": "settings-title" });
  const status = h("div", { "aria-live": "polite" });
  const doctor = h("div", {}, h("p", { class: "muted" }, "Asking doctor…"));
  const disk = h("div", {});

  const show = (settings) => {
    const byName = new Map(settings.map((s) => [s.name, s]));
    const used = new Set();
    const groups = GROUPS.map(([title, names]) => {
      const rows = names.filter((n) => byName.has(n)).map((n) => { used.add(n); return settingField(byName.get(n), save); });
      return rows.length ? h("fieldset", {}, h("legend", {}, title), rows) : null;
    });
    const rest = settings.filter((s) => !used.has(s.name));
    replace(form, h("h2", { id: "settings-title" }, "Models and sandbox"), h("div", { class: "settings-groups" }, groups),
      rest.length ? h("details", { class: "more-settings" }, h("summary", {}, `Other settings (${rest.length})`),
        rest.map((r) => settingField(r, save))) : null,
      h("div", { class: "actions" }, h("button", { type: "submit" }, "Save settings"),
        h("span", { class: "muted small" }, "Saved settings apply to the next run.")),
      status);
  };

  const save = async (changes) => {
    try {
      const res = await api("/api/settings", { method: "PUT", json: changes });
      show(res.settings);
      replace(status, h("p", { class: "ok", role: "status" }, `Saved: ${Object.keys(changes).join(", ")}.`));
      toast("Settings saved.");
    } catch (err) {
      replace(status, errorBox(err));
    }
  };

  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    const changes = {};
    for (const input of form.querySelectorAll("[data-setting]")) {
      if (input.type === "password") {
        if (input.value) changes[input.dataset.setting] = input.value;
      } else if (input.value !== input.dataset.initial) {
        changes[input.dataset.setting] = input.value === "" ? null : input.value;
      }
    }
    if (!Object.keys(changes).length) { replace(status, h("p", { class: "muted" }, "Nothing changed.")); return; }
    await save(changes);
  });

  replace(main, h("h1", {}, "Settings"), form,
    h("section", { class: "card", "aria-labelledby": "checks-title" }, h("h2", { id: "checks-title" }, "Test connection"),
      checkButton("Test the model", "/api/check/model"), checkButton("Test the sandbox", "/api/check/sandbox")),
    h("section", { class: "card", "aria-labelledby": "doctor-title" }, h("h2", { id: "doctor-title" }, "Keyring and sandbox"), doctor),
    h("section", { class: "card", "aria-labelledby": "disk-title" }, h("h2", { id: "disk-title" }, "Disk use"), disk));

  api("/api/settings").then((res) => show(res.settings), (err) => replace(form, errorBox(err)));
  api("/api/doctor").then((r) => replace(doctor, doctorView(r)), (err) => replace(doctor, errorBox(err)));
  api("/api/disk").then((d) => replace(disk, h("dl", { class: "meta" },
    [["Runs", d.runs], ["Uploads", d.uploads], ["Volumes", d.volumes], ["Total", d.total]].map(([k, v]) =>
      h("div", {}, h("dt", {}, k), h("dd", {}, fmtBytes(v)))),
    h("div", {}, h("dt", {}, "Kept for"), h("dd", {}, d.retention_days ? `${d.retention_days} days` : "ever")))),
  (err) => replace(disk, errorBox(err)));
}
